#!/usr/bin/env bash
# ddptrain resumed with another world size AND another per-rank batch, as a PyTorch user keeps
# the global batch when the number of GPUs changes (3 ranks × 1000 saved, 1 rank × 3000 resumed):
# the data position is a count of samples of the epoch, so the resumed run trains on the same
# samples as the uninterrupted one and ends with the same weights (float32 sums in another order:
# relative difference ≤ 1e-5). It used to convert the position by the world size alone: resumed
# at step 7 it was refused ("batch 21 is past the epoch's 20 batches"), at step 3 it silently
# skipped 18000 samples. A position that is not a whole number of the new global batches is
# rounded down, with a note. Small MLP runs on Fashion-MNIST (a second or two each).
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"


# Dropout and augmentation on: both follow the sample, whatever the world size (docs/nn.md).
A=(--model.hidden 16 --log_every 1 --tensorboard false --total_steps 25 --eval_every 0
   --model.dropout 0.2 --augment.hflip true --augment.shift 2 --warmup_steps 5
   --checkpoint.every 1 --checkpoint.keep 30)
"$DDPRUN" --standalone --nproc_per_node 3 "$TRAIN" "${A[@]}" --batch_size 1000 --out_dir whole \
    >whole.out 2>&1 || { cat whole.out; fail "the uninterrupted 3-rank run"; }
# Step 7 (mid-epoch: 20 steps of 3000 samples to an epoch) and 21 (the second epoch).
for s in 3 7 21; do
    "$TRAIN" "${A[@]}" --batch_size 3000 --out_dir one$s \
        --resume_from whole/checkpoints/step$s.safetensors >one$s.out 2>&1 ||
        { cat one$s.out; fail "resume of step $s with 1 rank × 3000"; }
    assert_contains one$s.out "resumed from whole/checkpoints/step$s.safetensors at step $s (saved by 3 ranks)"
    weights_close whole/checkpoints/step25.safetensors one$s/checkpoints/step25.safetensors ||
        fail "3 ranks × 1000 resumed at step $s as 1 rank × 3000 ended elsewhere"
done
ok "3 ranks × 1000 resumed with 1 rank × 3000 (steps 3, 7, 21): the same samples, the same weights"

# And back: a 1-rank checkpoint resumed by 2 ranks × half the batch.
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${A[@]}" --batch_size 1500 --out_dir two \
    --resume_from one7/checkpoints/step10.safetensors >two.out 2>&1 ||
    { cat two.out; fail "resume of 1 rank × 3000 with 2 ranks × 1500"; }
weights_close whole/checkpoints/step25.safetensors two/checkpoints/step25.safetensors ||
    fail "1 rank × 3000 resumed as 2 ranks × 1500 ended elsewhere"
ok "1 rank × 3000 resumed with 2 ranks × 1500: the same weights"

# 3 ranks × 1000 stopped after 7000 · 3 = 21000 samples; 2 ranks × 2000 (4000 a step) resume at
# 20000, training 1000 samples again, and say so.
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${A[@]}" --batch_size 2000 --out_dir round \
    --resume_from whole/checkpoints/step7.safetensors >round.out 2>&1 ||
    { cat round.out; fail "resume of 3 × 1000 with 2 × 2000"; }
assert_contains round.out "note: the checkpoint stopped after 21000 samples of epoch 0 (3 ranks × batch 1000); 2 ranks × batch 2000 resume at sample 20000, training 1000 samples of the epoch again"
assert_contains round.out "step 25/25"
ok "a position between two of the new global batches: rounded down, with a note"

# A run bounded by epochs, resumed by more ranks (an elastic job that grew): 3 × 1000 saved at
# step 7 (21000 samples of epoch 0), 2 ranks × 3000 (10 steps an epoch) resume at sample 18000
# and train the rest of epoch 0 and all of epoch 1: 7 + 17 = 24 steps. The total was 2 × the
# new steps an epoch, 20, with the saving run's 7 steps counted in it: 13 steps, and epoch 1
# ended after 3 of its 10 batches.
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${A[@]}" --batch_size 3000 --total_steps 0 \
    --epochs 2 --out_dir grown --resume_from whole/checkpoints/step7.safetensors >grown.out 2>&1 ||
    { cat grown.out; fail "resume of 3 × 1000 with 2 × 3000 for 2 epochs"; }
assert_contains grown.out "step 24/24"
assert_contains grown.out "trained 17 steps"
ok "epochs after a resume by more ranks: the rest of the epoch and the epochs after it"

# A resume at or past the end of the run trains nothing, and says so (it said "trained 0 steps").
"$TRAIN" "${A[@]}" --batch_size 3000 --total_steps 20 --out_dir one21 --resume_from latest \
    >past.out 2>&1 || { cat past.out; fail "resume past the end"; }
assert_contains past.out "note: resumed at step 25, past the run's 20 steps (total_steps): nothing to train; raise total_steps to train on"
"$TRAIN" "${A[@]}" --batch_size 3000 --total_steps 0 --epochs 1 --out_dir one21 \
    --resume_from latest >past.out 2>&1 || { cat past.out; fail "resume past the end (epochs)"; }
assert_contains past.out "note: resumed at step 25, past the run's 20 steps (epochs): nothing to train; raise epochs to train on"
ok "a resume at or past the run's end: a note saying what to raise"
"$TRAIN" "${A[@]}" --total_steps 0 --epochs 0 --out_dir zero >zero.out 2>&1 || { cat zero.out; fail "epochs 0"; }
assert_contains zero.out "note: epochs 0 and total_steps 0: nothing to train; set either to train"
ok "epochs 0: a note, nothing trained"

# A position past this run's epoch (another dataset: 21000 samples into one of 10) ends that
# epoch, and says so (it failed: "restore: batch 21000 is past the epoch's 10 batches").
small_idx small 10 10
"$TRAIN" "${A[@]}" --batch_size 1 --total_steps 12 --data.dir small --out_dir small_run \
    --resume_from whole/checkpoints/step7.safetensors >small.out 2>&1 || { cat small.out; fail "resume on 10 samples"; }
assert_contains small.out "note: the checkpoint's position, batch 21000 of epoch 0, is past this run's 10 batches an epoch (another world size, batch or dataset): epoch 0 ends here"
assert_contains small.out "trained 5 steps"
ok "a position past this run's epoch: the epoch ends, with a note"
