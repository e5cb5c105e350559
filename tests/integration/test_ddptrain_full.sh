#!/usr/bin/env bash
# ddptrain on a disk that fills up while it trains (a 1000 KB tmpfs with ~30 KB left): the first
# failed write to metrics.jsonl, and to train.log, gets one warning line on stderr naming the
# file, the step and the error (metrics.jsonl used to stop mid-line at some step, unnoticed,
# while training went on); the final checkpoint then cannot be written: the run fails saying so,
# and the checkpoint already there is untouched. Needs mount (root); skipped without.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"
S=(--model.hidden 16 --tensorboard false)

mkdir -p full
if ! mount -t tmpfs -o size=1000k tmpfs full 2>/dev/null; then
    echo "skip: cannot mount a tmpfs here (not root?)"
    exit 0
fi
UNMOUNT+=("$T/full")
"$TRAIN" "${S[@]}" --total_steps 2 --out_dir full/r >first.out 2>&1 || { cat first.out; fail "first run"; }
cp full/r/checkpoints/step2.safetensors step2.copy
avail=$(df -B1 --output=avail full | tail -1)
fallocate -l $((avail - 30000)) full/filler 2>/dev/null || head -c $((avail - 30000)) /dev/zero >full/filler
rc=0
"$TRAIN" "${S[@]}" --total_steps 400 --log_every 1 --out_dir full/r --resume_from latest \
    >out 2>err || rc=$?
[ $rc -eq 1 ] || { cat out err; fail "on a full disk: exit $rc, want 1 (the final checkpoint fails)"; }
grep -q "^ddptrain: warning: writing 'full/r/metrics.jsonl' failed at step [0-9]*: No space left on device; training goes on" err ||
    { cat err; fail "no warning for metrics.jsonl"; }
[ "$(grep -c "metrics.jsonl' failed" err)" -eq 1 ] || { cat err; fail "the metrics.jsonl warning is not once"; }
grep -q "^ddptrain: warning: writing 'full/r/train.log' failed at step" err ||
    { cat err; fail "no warning for train.log"; }
assert_contains err "ddptrain: rank 0: checkpoint: writing checkpoint 'full/r/checkpoints/step400.safetensors"
assert_contains err "No space left on device"
cmp -s step2.copy full/r/checkpoints/step2.safetensors || fail "the checkpoint already saved changed"
[ "$(ls full/r/checkpoints)" = step2.safetensors ] || fail "checkpoints: $(ls full/r/checkpoints)"
ok "a disk that fills up: one warning per log file, the failed final checkpoint named, the saved one intact"

# Predictions: a file that does not fit (10000 rows in ~10 KB) fails naming it, and the previous
# predictions (3 images' worth) are as they were, with no partial or temporary file left (it was
# opened with "w": the old file truncated, then a partial one left behind).
rm -f full/filler
idx() { # idx DIR LABEL…: a t10k split of noise images
    local dir=$1
    shift
    mkdir -p "$dir"
    idx_files "$dir/t10k" "$@"
}
idx mine 0 0 0
"$TRAIN" --task predict --out_dir full/r --checkpoint full/r/checkpoints/step2.safetensors \
    --data.dir mine --predict_out full/p.csv >p1.out 2>&1 || { cat p1.out; fail "predict 3 images"; }
cp full/p.csv p.copy
avail=$(df -B1 --output=avail full | tail -1)
fallocate -l $((avail - 10000)) full/filler 2>/dev/null || head -c $((avail - 10000)) /dev/zero >full/filler
rc=0
"$TRAIN" --task predict --out_dir full/r --checkpoint full/r/checkpoints/step2.safetensors \
    --predict_out full/p.csv >out 2>err || rc=$?
[ $rc -eq 1 ] || { cat out err; fail "predictions on a full disk: exit $rc, want 1"; }
assert_contains err "ddptrain: rank 0: predict: writing 'full/p.csv' failed: No space left on device; 'full/p.csv' is as it was"
[ "$(wc -l <err)" -eq 1 ] || { cat err; fail "want one line"; }
cmp -s p.copy full/p.csv || fail "the previous predictions changed"
[ -z "$(ls full | grep -v '^r$\|^p.csv$\|^filler$')" ] || fail "left behind: $(ls full)"
umount "$T/full"
UNMOUNT=()
ok "predictions that do not fit: the file named, the previous predictions intact, nothing left behind"
