#!/usr/bin/env bash
# ddptrain with augmentation (flips and shifts), which runs as the loader's transform: on its
# workers (data.threads ≥ 1, overlapping the step) or inside next() (data.threads 0). The draws
# are keyed by (seed, epoch, dataset index), so where they run changes nothing: threads 0, 1 and
# 2 end with the same weights bit for bit, and 2 ranks × 12 with 1 rank × 24's (float32 sums in
# another order: relative difference ≤ 1e-5). A small MLP on Fashion-MNIST, a second or two each.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

A=(--model.hidden 32 --augment.hflip true --augment.shift 3 --log_every 0 --tensorboard false
   --total_steps 8 --eval_every 0 --batch_size 24)
for th in 0 1 2; do
    "$TRAIN" "${A[@]}" --data.threads $th --out_dir t$th >t$th.out 2>&1 ||
        { cat t$th.out; fail "data.threads $th"; }
    "$BIN/ckpt_tool" dump t$th/checkpoints/step8.safetensors | grep '^T ' >w$th.txt
done
[ -s w0.txt ] && cmp -s w0.txt w1.txt && cmp -s w0.txt w2.txt ||
    fail "augmented runs with data.threads 0, 1 and 2 ended with different weights"
"$TRAIN" "${A[@]}" --augment.hflip false --augment.shift 0 --out_dir plain >plain.out 2>&1 ||
    { cat plain.out; fail "the run without augmentation"; }
"$BIN/ckpt_tool" dump plain/checkpoints/step8.safetensors | grep '^T ' >plain.txt
! cmp -s w0.txt plain.txt || fail "augmentation changed nothing (was it applied?)"
ok "augmentation as the loader's transform: data.threads 0, 1, 2 give the same weights, bit for bit"

"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${A[@]}" --batch_size 12 --data.threads 1 \
    --out_dir two >two.out 2>&1 || { cat two.out; fail "2 ranks × 12"; }
weights_close t0/checkpoints/step8.safetensors two/checkpoints/step8.safetensors ||
    fail "augmented 2 ranks × 12 ended elsewhere than 1 rank × 24"
ok "augmented 2 ranks × 12 end with 1 rank × 24's weights"
