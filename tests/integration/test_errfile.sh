#!/usr/bin/env bash
# torchrun's error files: ddprun gives each worker TORCHELASTIC_ERROR_FILE (per attempt and
# local rank; beside the logs under --log_dir, else in a private folder removed at the end), and
# the failure summary shows the root cause's message and the first lines of its traceback.
# (a) a worker that writes PyTorch's @record format and exits 1; (b) ddptrain with a bad data
# file on rank 1 only: its own message; (c) garbage, huge and FIFO error files: one line, and
# the job's end goes on; the earliest error wins over the first exit; an inherited
# TORCHELASTIC_ERROR_FILE is not the workers' but gets the root cause's copy, as under torchrun.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"
export TMPDIR=$T/tmp # ddprun's private folder goes here, to see it removed
mkdir -p "$TMPDIR"

# A worker script: rank FAIL writes what $KIND says to its error file, then exits 1; the others
# record their path and wait to be stopped.
cat >w.sh <<'EOF'
#!/bin/bash
echo "$TORCHELASTIC_ERROR_FILE" >"path.$RANK"
[ "$RANK" != "${FAIL:-1}" ] && exec sleep 30
# every rank's path recorded before this one fails (ddprun stops the others at once: one
# stopped before its echo left its path.N empty, a flake seen in CI)
for r in $(seq 0 $((WORLD_SIZE - 1))); do
    for _ in $(seq 500); do [ -s "path.$r" ] && break; sleep 0.01; done
done
case "$KIND" in
torch) # PyTorch's ErrorHandler.record_exception, a traceback of 14 lines
    tb='Traceback (most recent call last):\n'
    for i in $(seq 1 6); do tb+="  File \\\"train.py\\\", line $i, in f$i\\n    f$((i + 1))()\\n"; done
    tb+='ValueError: bad input on rank 1\n'
    printf '{"message": {"message": "ValueError: bad input on rank 1", "extraInfo": {"py_callstack": "%s", "timestamp": "%s"}}}' \
        "$tb" "$(date +%s)" >"$TORCHELASTIC_ERROR_FILE" ;;
garbage) printf 'not json at all \033[31m{' >"$TORCHELASTIC_ERROR_FILE" ;;
huge) head -c 3000000 /dev/zero >"$TORCHELASTIC_ERROR_FILE" ;;
fifo) mkfifo "$TORCHELASTIC_ERROR_FILE" ;;
esac
echo "rank $RANK failing on purpose" >&2
exit 1
EOF
chmod +x w.sh

# (a) PyTorch's format, without --log_dir: the message, the time, the traceback's first 10 lines.
rc=0; KIND=torch "$DDPRUN" --standalone --nproc_per_node 2 ./w.sh >a.out 2>a.err || rc=$?
[ $rc -eq 1 ] || { cat a.err; fail "(a) ddprun exited $rc, want 1"; }
assert_contains a.err "worker failed: rank 1 (local rank 1, role 'default') ended with exit code 1"
assert_contains a.err "  error   : ValueError: bad input on rank 1"
assert_contains a.err "  errfile : written $(date +%Y-%m-%d)"
assert_contains a.err "  traceback (its first 10 of 14 lines):"
assert_contains a.err "    | Traceback (most recent call last):"
assert_contains a.err '    |   File "train.py", line 5, in f5'
assert_not_contains a.err 'line 6, in f6' # the 11th line: bounded
assert_contains a.err "    | … 4 more lines in the error file"
assert_contains a.err "    | rank 1 failing on purpose" # its stderr lines, as before
p0=$(cat path.0) p1=$(cat path.1)
[ -n "$p0" ] && [ "$p0" != "$p1" ] || fail "(a) workers' error files '$p0' '$p1': want two paths"
case "$p1" in "$TMPDIR"/ddprun_err_*/attempt_0.local_rank_1.json) ;; *) fail "(a) path '$p1'" ;; esac
[ -z "$(ls "$TMPDIR")" ] || fail "(a) ddprun left $(ls "$TMPDIR") in TMPDIR"
ok "(a) a worker's torch-format error file: message, time and 10 traceback lines in the summary; private folder removed"

# Under --log_dir: torchrun's place, attempt_K/LOCAL_RANK/error.json, kept, and per attempt.
rc=0; KIND=torch "$DDPRUN" --standalone --nproc_per_node 2 --max_restarts 1 --log_dir logs \
    --run_id r ./w.sh >l.out 2>l.err || rc=$?
[ $rc -eq 1 ] || { cat l.err; fail "--log_dir: ddprun exited $rc, want 1"; }
[ "$(cat path.1)" = "logs/r/attempt_1/1/error.json" ] || fail "--log_dir: path '$(cat path.1)'"
[ -f logs/r/attempt_0/1/error.json ] && [ -f logs/r/attempt_1/1/error.json ] ||
    fail "--log_dir: each attempt's error file kept"
assert_contains l.err "  errfile : logs/r/attempt_1/1/error.json (written "
[ "$(grep -c "  error   : ValueError: bad input on rank 1" l.err)" -eq 2 ] ||
    fail "--log_dir: want the error in both attempts' summaries"
ok "--log_dir: DIR/RUN/attempt_K/LOCAL_RANK/error.json per attempt, named in the summary"

# (b) ddptrain, rank 1 given a truncated data file: its own message, from its error file.
idx() { # idx DIR [truncate]: tiny Fashion-MNIST-shaped IDX files of noise
    /usr/bin/python3 - "$@" <<'EOP'
import os, struct, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
for split, labels in (("train", list(range(10)) * 2), ("t10k", list(range(5)))):
    n = len(labels)
    img = struct.pack(">IIII", 0x803, n, 28, 28) + os.urandom(n * 784)
    if len(sys.argv) > 2 and split == "train":
        img = img[:3000]
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(img)
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + bytes(labels))
EOP
}
idx good
idx bad truncate
cat >t.sh <<EOF
#!/bin/sh
d=good; [ "\$RANK" = 1 ] && d=bad
exec "$TRAIN" --model.hidden 8 --batch_size 2 --total_steps 4 --log_every 0 --tensorboard false --data.dir \$d --out_dir run
EOF
chmod +x t.sh
rc=0; "$DDPRUN" --standalone --nproc_per_node 2 ./t.sh >b.out 2>b.err || rc=$?
[ $rc -eq 1 ] || { cat b.err; fail "(b) ddprun exited $rc, want 1"; }
assert_contains b.err "worker failed: rank 1 (local rank 1, role 'default') ended with exit code 2"
assert_contains b.err "  error   : ddptrain: 'bad/train-images-idx3-ubyte' is truncated or has trailing bytes"
# ddptrain alone, as a rank of torchrun would be: the JSON it writes, with the HINT lines.
rc=0; TORCHELASTIC_ERROR_FILE=$T/one.json "$TRAIN" --data.dir /no/such/dir >/dev/null 2>one.err || rc=$?
[ $rc -eq 2 ] || fail "(b) ddptrain with a missing data.dir exited $rc, want 2"
assert_contains one.json '{"message":{"message":"ddptrain: cannot open data file '"'"'/no/such/dir/train-images-idx3-ubyte'"'"': No such file or directory'
assert_contains one.json '"extraInfo":{"timestamp":"'
[ -z "$(ls "$T" | grep 'one.json.tmp')" ] || fail "(b) ddptrain left its temporary file"
# An error with a HINT line: the message is the error, the "traceback" the error and its HINT.
rc=0; TORCHELASTIC_ERROR_FILE=$T/hint.json "$TRAIN" --nproc_per_node 2 >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "(b) ddptrain --nproc_per_node exited $rc, want 2"
assert_contains hint.json '{"message":{"message":"ddptrain: unknown key '"'"'nproc_per_node'"'"' (on the command line); --help lists every key"'
assert_contains hint.json '--help lists every key\nddptrain: HINT: --nproc_per_node is a flag of the launcher'
rc=0; TORCHELASTIC_ERROR_FILE=$T/ok.json "$TRAIN" --help >/dev/null 2>&1 || rc=$?
[ $rc -eq 0 ] && [ ! -e ok.json ] || fail "(b) ddptrain wrote an error file for a success"
ok "(b) ddptrain with a bad data file on rank 1: the summary names its message"

# (c) an error file ddprun cannot use: one line, the rest of the summary, exit 1, no hang.
for kind in garbage huge fifo; do
    rc=0; KIND=$kind timeout 20 "$DDPRUN" --standalone --nproc_per_node 2 ./w.sh >c.out 2>c.err || rc=$?
    [ $rc -eq 1 ] || { cat c.err; fail "(c) $kind: ddprun exited $rc, want 1"; }
    assert_contains c.err "worker failed: rank 1 (local rank 1, role 'default') ended with exit code 1"
    assert_contains c.err "  error   : error file unreadable: '"
    assert_contains c.err "    | rank 1 failing on purpose"
    assert_contains c.err "every other worker was stopped"
    [ -z "$(ls "$TMPDIR")" ] || fail "(c) $kind: ddprun left $(ls "$TMPDIR") in TMPDIR"
done
assert_contains c.err "is not a regular file" # the FIFO: refused unopened for reading
ok "(c) garbage, 3 MB and FIFO error files: 'error file unreadable', the summary goes on"

# The earliest error is the root cause (torchrun's smallest timestamp), not the first rank
# reaped: rank 1's error file is 100 s older than rank 0's. Both end on their own while ddprun is
# stopped (SIGSTOP), so that it finds both ended at once, in whichever order it reaps them.
cat >e.sh <<'EOF'
#!/bin/bash
ts=$(date +%s) msg="RuntimeError: late on rank 0" code=1
[ "$RANK" = 1 ] && ts=$((ts - 100)) msg="OSError: disk gone on rank 1" code=7
printf '{"message": {"message": "%s", "extraInfo": {"timestamp": "%s"}}}' "$msg" "$ts" \
    >"$TORCHELASTIC_ERROR_FILE"
echo $$ >"pid.$RANK"
touch "ready.$RANK"
while [ ! -e go ]; do sleep 0.05; done
exit $code
EOF
chmod +x e.sh
mkdir -p e
cd e
"$DDPRUN" --standalone --nproc_per_node 2 ../e.sh >../e.out 2>../e.err &
dp=$!
BG_PIDS+=("$dp")
cd "$T"
wait_files e 'ready.*' 2 20
kill -STOP "$dp"
touch e/go
for p in $(cat e/pid.*); do # both end (zombies until ddprun reaps them)
    for ((i = 0; i < 100; i++)); do alive "$p" || break; sleep 0.05; done
done
kill -CONT "$dp"
rc=0; wait "$dp" || rc=$?
[ $rc -eq 1 ] || { cat e.err; fail "earliest: ddprun exited $rc, want 1"; }
assert_contains e.err "worker failed: rank 1 (local rank 1, role 'default') ended with exit code 7"
assert_contains e.err "  error   : OSError: disk gone on rank 1"
assert_contains e.err "  also    : rank 0 (exit code 1) ended badly before ddprun stopped it"
assert_not_contains e.err "worker failed: rank 0"
# Reaped first, rank 0 was the failure until the error files were compared: said so.
if grep -q "  first   :" e.err; then
    assert_contains e.err "  first   : rank 0 (exit code 1) was seen to end first, but this rank's error is older"
fi
ok "the earliest error file names the root cause, whichever rank ddprun reaped first"

# An inherited TORCHELASTIC_ERROR_FILE (ddprun under a scheduler that reads it) is not handed to
# the workers; at the job's failure it gets the root cause's file with errorCode, as torchrun's.
echo "an earlier job's" >parent.json
rc=0; KIND=torch TORCHELASTIC_ERROR_FILE=$T/parent.json "$DDPRUN" --standalone --nproc_per_node 2 \
    ./w.sh >p.out 2>p.err || rc=$?
[ $rc -eq 1 ] || { cat p.err; fail "parent: ddprun exited $rc, want 1"; }
[ "$(cat path.0)" != "$T/parent.json" ] || fail "parent: a worker got ddprun's own error file"
assert_contains parent.json '"message":"ValueError: bad input on rank 1"'
assert_contains parent.json '"errorCode":1'
assert_not_contains parent.json "an earlier job's"
assert_contains p.err "TORCHELASTIC_ERROR_FILE '$T/parent.json' exists already: replacing it with rank 1's error, as torchrun does"
assert_contains parent.json 'Traceback (most recent call last):'
ok "an inherited TORCHELASTIC_ERROR_FILE gets the root cause's error with errorCode, not the workers"
# ddprun SIGKILLed: its reaper removes the private folder with the workers, as ever.
cat >k.sh <<'EOF'
#!/bin/bash
echo $$ >"pid.$RANK"
exec sleep 30
EOF
chmod +x k.sh
mkdir -p k
(cd k && exec "$DDPRUN" --standalone --nproc_per_node 2 ../k.sh >../k.out 2>../k.err) &
dp=$!
BG_PIDS+=("$dp")
wait_files k 'pid.*' 2 20
[ -n "$(ls "$TMPDIR")" ] || fail "SIGKILL: no private folder while the job runs"
kill -KILL "$dp"
wait "$dp" 2>/dev/null || true
wait_gone k 5
for ((i = 0; i < 100; i++)); do [ -z "$(ls "$TMPDIR")" ] && break; sleep 0.05; done
[ -z "$(ls "$TMPDIR")" ] || fail "SIGKILL: ddprun's reaper left $(ls "$TMPDIR") in TMPDIR"
ok "ddprun SIGKILLed: the reaper removes the error files' private folder"

# (d) Two nodes on loopback: rank 1 fails on node 1 with an error file. Node 1's summary shows
# its message (above); node 0's shows its first line too, shared through the store under a key
# of its own (before, node 0 said only "see the summary printed by that node's ddprun"). The
# message holds "stopped responding" (the dead-node wording's trigger in the shared failure
# line), an escape sequence and a second line: node 0 keeps the wording for a live node, prints
# '?' for the control character and marks the cut.
. "$(dirname "$0")/nodes_lib.sh"
export DDP_STORE_TOKEN=test-secret-$$
cat >m.sh <<'EOF2'
#!/bin/bash
[ "$RANK" != 1 ] && exec sleep 30
printf '{"message": {"message": "OSError: disk on node 1 stopped responding \\u001b[31m\\nsecond line", "extraInfo": {"timestamp": "%s"}}}' \
    "$(date +%s)" >"$TORCHELASTIC_ERROR_FILE"
exit 3
EOF2
chmod +x m.sh
d=$T/nodes
mkdir -p "$d"
port=$(free_port)
mn=(--nnodes 2 --master_addr 127.0.0.1 --master_port "$port" --nproc_per_node 1
    --rdzv_timeout 20 --agent_timeout 10)
start_host "$d" "$port" "${mn[@]}" --node_rank 0 ./m.sh
start_node "$d" 1 "${mn[@]}" --node_rank 1 ./m.sh
node_exit "$d" 1 1
node_exit "$d" 0 1
assert_contains "$d/err1" "worker failed: rank 1 (local rank 0, role 'default') ended with exit code 3"
assert_contains "$d/err1" "  error   : OSError: disk on node 1 stopped responding ?[31m"
assert_contains "$d/err0" "job failed on another node: rank 1 (local rank 0) on node 1 ("
assert_contains "$d/err0" "  error   : OSError: disk on node 1 stopped responding ?[31m …"
assert_contains "$d/err0" "  see the summary printed by that node's ddprun"
assert_not_contains "$d/err0" "that node's ddprun is gone"
assert_not_contains "$d/err0" "second line"
[ -z "$(ls "$TMPDIR")" ] || fail "(d) ddprun left $(ls "$TMPDIR") in TMPDIR"
ok "(d) a worker's error on node 1: node 0's summary shows its message's first line, cleaned"
