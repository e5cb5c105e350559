#!/usr/bin/env bash
# examples/train_mlp (the library's model, optimizer, schedule and trainer state in a plain C
# loop) trains with 1 and 2 ranks, and what it saves is a trainer state ddptrain loads: the same
# file format for any program built on the library.
. "$(dirname "$0")/lib.sh"
EX=$BIN/train_mlp
DATA=/usr/share/datasets/fashion-mnist
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

"$EX" "$DATA" 50 one.safetensors >one.out 2>&1 || { cat one.out; fail "1 rank failed"; }
assert_contains one.out "step 50: loss"
"$DDPRUN" --standalone --nproc_per_node=2 "$EX" "$DATA" 50 two.safetensors >two.out 2>&1 ||
    { cat two.out; fail "2 ranks failed"; }
assert_contains two.out "[rank0]: saved two.safetensors"
ok "train_mlp trains with 1 and 2 ranks and saves its state"

for f in one two; do
    "$BIN/ddptrain" --task test --model.hidden 128 --checkpoint $f.safetensors \
        --out_dir run >$f.test 2>&1 || { cat $f.test; fail "ddptrain could not load $f"; }
    assert_contains $f.test "at step 50"
    assert_contains $f.test "test accuracy"
done
ok "ddptrain evaluates the example's checkpoints"

# A file-size limit under the checkpoint (ulimit -f 300: 300 KiB; tcp, as shm's segments obey it
# too): the write fails with EFBIG, said with the file, and no temporary file is left, as in
# ddptrain. SIGXFSZ ended it before 2026-11-25 (exit 153, no word, the .tmp file left).
mkdir -p fsize
rc=0; (cd fsize && ulimit -f 300 && DDP_BACKEND=tcp "$EX" "$DATA" 5 x.safetensors) \
    >fsize.out 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat fsize.out; fail "ulimit -f: exit $rc, want 1"; }
assert_contains fsize.out "train_mlp: checkpoint: writing checkpoint 'x.safetensors.tmp."
assert_contains fsize.out "File too large"
[ -z "$(ls -A fsize)" ] || { ls -A fsize; fail "ulimit -f: a file was left"; }
ok "a file-size limit under train_mlp's checkpoint: EFBIG said, no file left"

# Rank 0's disk fills while the optimizer's shards stream into its file (a 600 KB tmpfs: the
# header and the weights fit, AdamW's state does not): rank 0 says ENOSPC and removes the file,
# rank 1 learns that rank 0 could not save. It used to stop after the first state's gather with
# "the sink refused parameter 0's", leaving rank 1 in the next one. Needs mount (root).
mkdir -p full
if mount -t tmpfs -o size=600k tmpfs full 2>/dev/null; then
    UNMOUNT+=("$T/full")
    rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$EX" "$DATA" 5 full/x.safetensors \
        >full.out 2>&1 || rc=$?
    [ $rc -eq 1 ] || { cat full.out; fail "disk full: ddprun exited $rc, want 1"; }
    grep -q "^\[rank0\]: train_mlp: checkpoint: writing .*No space left on device" full.out ||
        { cat full.out; fail "disk full: rank 0 does not say ENOSPC"; }
    if grep -q "^\[rank1\]: train_mlp" full.out; then
        assert_contains full.out "[rank1]: train_mlp: checkpoint: rank 0 could not save the file"
    fi
    [ -z "$(ls full)" ] || { ls -la full; fail "disk full: a file was left behind"; }
    umount "$T/full"
    UNMOUNT=()
    ok "train_mlp: a disk that fills during the sharded save: rank 0 says ENOSPC, rank 1 learns it"
else
    echo "skip: cannot mount a tmpfs here (not root?): the disk-full save is not run"
fi

# Without the model's keys: the example's checkpoint stores no configuration, so ddptrain says
# so (until 2026-11-25 it claimed to use "the one stored in" it, and the load's message sent the
# user to 'config' metadata that is empty) and names what to give.
rc=0
"$BIN/ddptrain" --task test --checkpoint one.safetensors --out_dir run >none.test 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat none.test; fail "ddptrain loaded the example's checkpoint into its default MLP"; }
assert_contains none.test "configuration: one.safetensors stores none (not saved by ddptrain)"
assert_not_contains none.test "the one stored in"
assert_contains none.test "HINT: 'one.safetensors' stores no configuration"
assert_contains none.test "--model.hidden 128 for examples/train_mlp"
# And without --out_dir its results go beside it, not into the default runs/default (another
# run's folder, where its train.log and metrics.jsonl grew until 2026-11-26).
mkdir -p sub && cp one.safetensors sub/
"$BIN/ddptrain" --task test --model.hidden 128 --checkpoint sub/one.safetensors >sub.test 2>&1 ||
    { cat sub.test; fail "ddptrain --task test of sub/one.safetensors"; }
[ ! -e runs ] || { ls -R runs; fail "a test of a checkpoint with no configuration wrote runs/"; }
grep -q '"test_accuracy"\|accuracy' sub/metrics.jsonl sub/train.log ||
    { ls sub; fail "no results beside the checkpoint"; }
ok "a checkpoint with no stored configuration is said to have none, with the keys to give; its results go beside it"

# The examples' --help (usage on stdout, exit 0) and a flag they do not take (exit 2, not a
# data directory named '--foo').
for ex in train_mlp spawn_allreduce ddp_mlp; do
    "$BIN/$ex" --help >help.out 2>&1 || fail "$ex --help exited $?"
    assert_contains help.out "usage: $ex"
    rc=0; "$BIN/$ex" --foo >bad.out 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "$ex --foo exited $rc, want 2"
done
ok "the examples answer --help with their usage and refuse a flag they do not take"

# train_mlp's STEPS: a negative count wrapped to 2^64 − 5 steps (a run that never ends) and a
# word meant 0 steps and exit 0; both are refused with a line naming the value.
for steps in -5 abc 10x 0; do
    rc=0; timeout 20 "$BIN/train_mlp" /usr/share/datasets/fashion-mnist "$steps" >st.out 2>&1 || rc=$?
    [ $rc -eq 2 ] || { cat st.out; fail "train_mlp STEPS '$steps' exited $rc, want 2"; }
    assert_contains st.out "train_mlp: STEPS '$steps' is not a number of steps from 1 to 10^9"
done
ok "train_mlp refuses a STEPS that is not a positive number"

# ddp_mlp's options: atoi took '--lr abc' as 0 and '--bucket_kb -1' silently, a huge --hidden
# crashed it (SIGSEGV) and a --batch above its share of the data divided by zero (SIGFPE).
for bad in "--lr abc:--lr 'abc' is not a positive number" \
    "--bucket_kb -1:--bucket_kb '-1' is not a whole number from 0 to" \
    "--seed x1:--seed 'x1' is not a whole number" \
    "--hidden 100000000:--hidden '100000000' is not a whole number from 1 to 4096" \
    "--steps -5:--steps '-5' is not a whole number from 1 to" \
    "--batch 20000:--batch 20000 × --accum 1 is more than this rank's 16384 samples"; do
    args=${bad%%:*} want=${bad#*:} rc=0
    # shellcheck disable=SC2086
    timeout 20 "$BIN/ddp_mlp" $args --quiet >mo.out 2>&1 || rc=$?
    [ $rc -eq 2 ] || { cat mo.out; fail "ddp_mlp $args exited $rc, want 2"; }
    assert_contains mo.out "ddp_mlp: $want"
done
ok "ddp_mlp refuses options that are not numbers in range, and a batch above its data"
