#!/usr/bin/env bash
# Data files changed under a running job. A training file truncated while ddptrain reads it (a
# preparation script re-run into the same path): the rank touching a page past the new end dies
# of SIGBUS as before (exit status 135 alone, "signal 7 (SIGBUS)" in ddprun's summary), but first
# says in one line which file shrank and what to do (it died with no word until 2026-11-26), and
# writes it into its TORCHELASTIC_ERROR_FILE, whose message ddprun's summary shows.
# And another process holding the data cache's preparation lock past the job's deadline
# (DDP_TIMEOUT): the wait ends then, naming the lock, instead of after 10 minutes.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
ulimit -c 0 # a rank killed by SIGBUS would dump its core into $T
cd "$T"

# small IDX files (600 training images, 100 test), plain: mapped straight from data.dir.
make_data() { small_idx "$1" 600 100; }

# wait_step FILE PID: until FILE has a progress line (training reads the data), while PID lives
wait_step() {
    local i
    for ((i = 0; i < 1200; i++)); do
        grep -q "^\(\[rank0\]: \)\?step [0-9]*/" "$1" && return 0
        alive "$2" || { cat "$1" >&2; fail "the job ended before its first progress line"; }
        sleep 0.05
    done
    cat "$1" >&2
    fail "no progress line in 60 s"
}

long=(--total_steps 100000000 --log_every 1 --eval_every 0 --checkpoint.every 0 --batch_size 16)
msg_end="' shrank while this job read it (a bus error at byte "
hint="of its mapping); HINT: write a new data file under another name and rename it over the old one (ddpprep does), or stop the job before rewriting it"

# 1. One rank, no launcher, loading on the training thread (data.threads 0): the training
#    images truncated to 4 KiB mid-run. Exit status 135 (128 + SIGBUS), the line names the file.
make_data "$T/one"
"$TRAIN" --data.dir "$T/one" --data.threads 0 --out_dir run1 "${long[@]}" >one.out 2>&1 &
pid=$!
BG_PIDS+=($pid)
wait_step one.out $pid
truncate -s 4096 "$T/one/train-images-idx3-ubyte"
rc=0
wait $pid 2>/dev/null || rc=$? # (bash would say "Bus error")
[ $rc -eq 135 ] || { cat one.out; fail "the rank exited $rc after its data file shrank, want 135 (SIGBUS)"; }
assert_contains one.out "ddptrain: rank 0: the data file '$T/one/train-images-idx3-ubyte$msg_end"
assert_contains one.out "$hint"
[ "$(grep -c 'shrank while this job read it' one.out)" -eq 1 ] || { cat one.out; fail "not one line"; }
byte=$(sed -n "s/.*a bus error at byte \([0-9]*\) of its mapping.*/\1/p" one.out)
[ -n "$byte" ] && [ "$byte" -ge 4096 ] && [ "$byte" -lt $((16 + 600 * 784)) ] ||
    { cat one.out; fail "the byte named ($byte) is not past the new end, inside the file's old size"; }
ok "a data file truncated under one rank: one line naming it and byte $byte, then SIGBUS (135)"

# 2. Two ranks under ddprun, a loader thread each (data.threads 1: the fault is on that thread):
#    ddprun's summary says SIGBUS as before, and shows the rank's line among its last ones.
make_data "$T/two"
"$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" --data.dir "$T/two" --data.threads 1 \
    --out_dir run2 "${long[@]}" >two.out 2>two.err &
pid=$!
BG_PIDS+=($pid)
wait_step two.out $pid
truncate -s 0 "$T/two/train-images-idx3-ubyte"
rc=0
wait $pid 2>/dev/null || rc=$? # (bash would say "Bus error")
[ $rc -ne 0 ] || { cat two.out two.err; fail "ddprun exited 0 after the data file shrank"; }
assert_contains two.err "signal 7 (SIGBUS)"
grep -q "ddptrain: rank [01]: the data file '$T/two/train-images-idx3-ubyte$msg_end" two.out two.err ||
    { cat two.out two.err; fail "no rank named the shrunk file"; }
grep -qF "$hint" two.out two.err || { cat two.out two.err; fail "no HINT"; }
# the summary's last stderr lines of the rank that failed: the line, not a bare signal
grep -q "^ddprun:     | ddptrain: rank [01]: the data file '" two.err ||
    { cat two.err; fail "ddprun's summary does not show the rank's line"; }
# and its error file (TORCHELASTIC_ERROR_FILE, written by the SIGBUS handler): the summary's
# "error" names the file, the HINT in its traceback (until 2026-11-27 no error file: the signal
# alone)
grep -q "^ddprun:   error   : ddptrain: rank [01]: the data file '$T/two/train-images-idx3-ubyte$msg_end[0-9]* of its mapping)$" two.err ||
    { cat two.err; fail "ddprun's summary has no error naming the shrunk file (the error file)"; }
grep -q "^ddprun:     | ddptrain: HINT: write a new data file under another name" two.err ||
    { cat two.err; fail "ddprun's summary has no traceback with the HINT"; }
ok "a data file truncated under two ranks (loader threads): the line, ddprun's SIGBUS summary naming the file"

# 3. The preparation lock held (here by the test's shell) longer than DDP_TIMEOUT: the wait
#    ends after 1 s, the message names the lock, the deadline and what to do.
make_data "$T/gz"
gzip "$T"/gz/*-ubyte
mkdir -p "$T/lockcache"
src=$T/gz/train-images-idx3-ubyte.gz
lock=$T/lockcache/train-images-idx3-ubyte.$(stat -c '%s.%Y' "$src").lock
exec 9>"$lock"
flock -n 9 || fail "cannot take '$lock'"
t0=$(now_ms)
rc=0
DDP_TIMEOUT=1 DDP_DATA_CACHE=$T/lockcache "$TRAIN" --data.dir "$T/gz" --out_dir run3 \
    --total_steps 1 >lock.out 2>&1 || rc=$?
took=$(($(now_ms) - t0))
exec 9>&-
[ $rc -ne 0 ] || { cat lock.out; fail "training went on behind a held lock"; }
assert_contains lock.out "waited 1 s (DDP_TIMEOUT) for another process to decompress '$src': it holds the lock '$lock' and has not finished; find it with lslocks"
assert_contains lock.out "DDP_TIMEOUT (seconds) sets how long to wait"
[ $took -lt 30000 ] || fail "the wait took $took ms with DDP_TIMEOUT=1"
# the lock free again: the same run decompresses and trains
DDP_TIMEOUT=30 DDP_DATA_CACHE=$T/lockcache "$TRAIN" --data.dir "$T/gz" --out_dir run3 \
    --total_steps 1 --eval_every 0 >lock2.out 2>&1 || { cat lock2.out; fail "training after the lock was freed"; }
ok "a preparation lock held past DDP_TIMEOUT (1 s): given up after $took ms, naming the lock"
