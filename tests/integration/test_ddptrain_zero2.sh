#!/usr/bin/env bash
# ddptrain's sharded gradients (ZeRO-2: shard_gradients true, beside shard_optimizer's ZeRO-1):
# configuration errors before any work (exit 2); an MLP (3 ranks, AdamW with clipping, 4 KiB
# buckets on the progress thread: the pool waits), a CNN (2 ranks) and a GPT (2 and 3 ranks, its tied token
# embedding) end with ZeRO-1's weights and AdamW state bit for bit; a ZeRO-2 run saved at step 6
# and resumed ends there too; 2 micro-steps (each reduced into the shard) end near ZeRO-1's.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
DUMP=$BIN/ckpt_tool
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"

# Configuration errors: exit 2 and a message naming the key, before anything runs.
conf_err() { # WANT ARGS...: exit 2 and WANT in stderr
    local want=$1 rc=0
    shift
    "$TRAIN" --out_dir conf "$@" >out 2>err || rc=$?
    [ $rc -eq 2 ] || { cat err; fail "$*: exit code $rc, want 2"; }
    assert_contains err "$want"
    [ ! -d conf ] || fail "$*: a refused configuration started work"
}
conf_err "key 'shard_gradients' is true (the command line); it needs shard_optimizer on" \
    --shard_gradients true --shard_optimizer false
conf_err "it is CPU-only for now" --shard_gradients true --device cuda
conf_err "it does not take compress_bf16 yet" --shard_gradients true --compress_bf16 true
conf_err "'maybe' is not one of auto|true|false" --shard_gradients maybe
"$TRAIN" --help >help
assert_contains help "shard_gradients"
ok "shard_gradients: configuration errors before any work, and --help lists the key"

# The MLP: ZeRO-2 = ZeRO-1, bit for bit (weights and AdamW state), 3 ranks.
args=(--total_steps 12 --checkpoint.every 12 --optimizer adamw --lr 0.001 --grad_clip 0.5
      --model.hidden 48,24 --shard_optimizer true --bucket_kb 4 --overlap async)
for sg in true false; do
    "$DDPRUN" --standalone --nproc_per_node=3 "$TRAIN" "${args[@]}" --shard_gradients $sg \
        --out_dir mlp_$sg >mlp_$sg.out 2>&1 || { cat mlp_$sg.out; fail "mlp, shard_gradients $sg"; }
    "$DUMP" dump mlp_$sg/checkpoints/step12.safetensors | grep -v '^M ' >mlp_$sg.txt
done
assert_contains mlp_true.out "gradients and optimizer step sharded (ZeRO-2), each rank keeping 1/3 of the gradient and of the optimizer state"
grep -q "ZeRO-2" mlp_false.out && fail "shard_gradients false said ZeRO-2"
[ "$(grep -c '^T ' mlp_true.txt)" -eq 18 ] || fail "want 6 weights and 12 AdamW state tensors"
cmp -s mlp_true.txt mlp_false.txt || fail "mlp: ZeRO-2 and ZeRO-1 give different weights or state"
ok "mlp: ZeRO-2 = ZeRO-1 bit for bit (weights and AdamW state, 3 ranks, clipping, async)"

# Default buckets (4 MiB under ZeRO-2) on a model this small: the pool holds the whole gradient,
# more than sharding saves — said on rank 0's log, and the run goes on.
"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 2 --model.hidden 48,24 \
    --shard_optimizer true --shard_gradients true --out_dir small >small.out 2>&1 ||
    { cat small.out; fail "mlp with default buckets under ZeRO-2"; }
assert_contains small.out "warning: shard_gradients: the gradient pool"
assert_contains small.out "lower bucket_kb, or leave shard_gradients off"
ok "shard_gradients with a pool larger than its saving: a warning, and the run goes on"

# The CNN (convolutions, batchnorm and its buffers; 1 KiB buckets): the same, 2 ranks.
cargs=(--model.type cnn --model.channels 4,8 --model.hidden 16 --total_steps 4
       --checkpoint.every 4 --optimizer adamw --lr 0.001 --batch_size 16 --shard_optimizer true
       --bucket_kb 1 --overlap async)
for sg in true false; do
    "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${cargs[@]}" --shard_gradients $sg \
        --out_dir cnn_$sg >cnn_$sg.out 2>&1 || { cat cnn_$sg.out; fail "cnn, shard_gradients $sg"; }
    "$DUMP" dump cnn_$sg/checkpoints/step4.safetensors | grep -v '^M ' >cnn_$sg.txt
done
assert_contains cnn_true.out "(ZeRO-2)"
cmp -s cnn_true.txt cnn_false.txt || fail "cnn: ZeRO-2 and ZeRO-1 give different weights or state"
ok "cnn: ZeRO-2 = ZeRO-1 bit for bit (weights, buffers and AdamW state, 2 ranks)"

# Saved at step 6 with ZeRO-2, resumed with ZeRO-2: where the uninterrupted run ended.
for leg in 1 2; do
    "$DDPRUN" --standalone --nproc_per_node=3 "$TRAIN" "${args[@]}" --shard_gradients true \
        --checkpoint.every 6 --checkpoint.keep 3 --out_dir halves --resume_from auto \
        >halves$leg.out 2>&1 || { cat halves$leg.out; fail "ZeRO-2 halves, leg $leg"; }
    [ $leg = 2 ] || rm halves/checkpoints/step12.safetensors
done
assert_contains halves2.out "resumed from halves/checkpoints/step6.safetensors at step 6"
"$DUMP" dump halves/checkpoints/step12.safetensors | grep -v '^M ' >halves.txt
cmp -s halves.txt mlp_false.txt || fail "a ZeRO-2 run resumed at step 6 differs from ZeRO-1's"
ok "mlp: a ZeRO-2 run saved at step 6 and resumed ends bit for bit where ZeRO-1 does"

# A tiny GPT on a synthetic text: the tied token embedding is held across backward.
story_text >text.txt
TINY=(--model.type gpt --data.text "$T/text.txt" --data.doc_sep % --model.n_layer 2
      --model.n_head 2 --model.n_embd 32 --model.block_size 32 --optimizer adamw --lr 3e-3
      --betas 0.9,0.95 --weight_decay 0.1 --grad_clip 1 --eval_windows 40 --max_new_tokens 0
      --batch_size 4 --total_steps 8 --checkpoint.every 8 --shard_optimizer true --bucket_kb 8)
for w in 2 3; do
    for sg in true false; do
        "$DDPRUN" --standalone --nproc_per_node=$w "$TRAIN" "${TINY[@]}" --shard_gradients $sg \
            --out_dir gpt${w}_$sg >gpt${w}_$sg.out 2>&1 || { cat gpt${w}_$sg.out; fail "gpt, $w ranks, shard_gradients $sg"; }
        "$DUMP" dump gpt${w}_$sg/checkpoints/step8.safetensors | grep -v '^M ' >gpt${w}_$sg.txt
    done
    assert_contains gpt${w}_true.out "(ZeRO-2)"
    cmp -s gpt${w}_true.txt gpt${w}_false.txt || fail "gpt, $w ranks: ZeRO-2 and ZeRO-1 differ"
done
ok "gpt: ZeRO-2 = ZeRO-1 bit for bit (weights and AdamW state, 2 and 3 ranks, tied embedding)"
assert_not_contains gpt3_true.out "warning: shard_gradients" # its pool is the smaller

# 2 micro-steps: each reduced into the shard (ZeRO-2) instead of once (ZeRO-1): the same
# training up to rounding, so the validation loss agrees to 3 decimals.
for sg in true false; do
    "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${TINY[@]}" --grad_accum 2 \
        --shard_gradients $sg --out_dir acc_$sg >acc_$sg.out 2>&1 || { cat acc_$sg.out; fail "gpt, grad_accum 2, shard_gradients $sg"; }
done
la=$(sed -n 's/.*eval at step 8: val loss \([0-9.]*\).*/\1/p' acc_true.out)
lb=$(sed -n 's/.*eval at step 8: val loss \([0-9.]*\).*/\1/p' acc_false.out)
[ -n "$la" ] && awk -v a="$la" -v b="$lb" 'BEGIN { d = a - b; exit !(d < 0.001 && d > -0.001) }' ||
    fail "grad_accum 2: val loss $la with ZeRO-2, $lb with ZeRO-1"
ok "gpt, grad_accum 2: ZeRO-2's validation loss $la, ZeRO-1's $lb"
