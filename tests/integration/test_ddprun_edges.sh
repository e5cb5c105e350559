#!/usr/bin/env bash
# Edges of ddprun that integration.multinode and integration.launchers leave out. Two nodes on
# one machine: a node's ddprun killed outright (node 0 must end soon after --agent_timeout, not
# wait out the end-of-job handshake for a node that will never answer, and must not send the user
# to that node's summary); nodes sharing one --log_dir (a network file system), which must not
# write into each other's files; one run id per job; a node that cannot start its workers.
# Under mpirun: a ddprun bound to one core warns that its workers share it.
. "$(dirname "$0")/lib.sh"
export DDP_STORE_TOKEN=test-secret-$$

# 1. Node 1's ddprun dies by SIGKILL: node 0 declares it dead after --agent_timeout (2 s) and
#    exits 1 at once; its own workers are stopped, node 1's die with their reaper.
d=$T/lost; mkdir -p "$d"
port=$(free_port)
flags=(--nnodes 2 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1
       --rdzv_timeout 20 --agent_timeout 2 --grace_period 10)
"$DDPRUN" "${flags[@]}" --node_rank 0 "$WORKER" sleep "$d" >"$d/out0" 2>"$d/err0" &
n0=$!; BG_PIDS+=($n0)
"$DDPRUN" "${flags[@]}" --node_rank 1 "$WORKER" sleep "$d" >"$d/out1" 2>"$d/err1" &
n1=$!; BG_PIDS+=($n1)
wait_files "$d" "pid.*" 2 20
kill -9 $n1
t0=$(now_ms)
rc=0; wait $n0 || rc=$?
took=$(($(now_ms) - t0))
[ $rc = 1 ] || { cat "$d/err0"; fail "node 0 exited $rc after node 1's ddprun died, expected 1"; }
# 2 s of silence + the 10 s grace + 5 s is what the old end-of-job wait took; 8 s allows load.
[ $took -lt 8000 ] || { cat "$d/err0"; fail "node 0 took $took ms to end after node 1 died"; }
assert_contains "$d/err0" "lost: its ddprun's connection to the store closed"
assert_contains "$d/err0" "that node's ddprun is gone: no summary comes from it"
assert_not_contains "$d/err0" "see the summary printed by that node's ddprun"
wait $n1 2>/dev/null || true
wait_gone "$d" 10
ok "a node's ddprun killed: node 0 ends $took ms later (agent_timeout 2 s), no summary promised"

# 2. Two nodes sharing one --log_dir, 2 workers each: every rank's output is in its own node's
#    files (node_N/attempt_0/LOCAL_RANK), none in another's, and a failure names its node's file.
d=$T/logs; mkdir -p "$d"
port=$(free_port)
flags=(--nnodes 2 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 2
       --rdzv_timeout 20 --log_dir "$d/L" --run_id shared)
"$DDPRUN" "${flags[@]}" --node_rank 1 "$WORKER" env "$d" >"$d/out1" 2>"$d/err1" &
n1=$!; BG_PIDS+=($n1)
"$DDPRUN" "${flags[@]}" --node_rank 0 "$WORKER" env "$d" >"$d/out0" 2>"$d/err0" ||
    { cat "$d/err0"; fail "node 0 exited non-zero"; }
wait $n1 || { cat "$d/err1"; fail "node 1 exited non-zero"; }
for n in 0 1; do
    for lr in 0 1; do
        f=$d/L/shared/node_$n/attempt_0/$lr/stdout.log
        r=$((2 * n + lr))
        assert_contains "$f" "env written by rank $r"
        [ "$(grep -c "env written by" "$f")" = 1 ] || { cat "$f"; fail "$f holds another rank's lines"; }
    done
done
[ ! -e "$d/L/shared/attempt_0" ] || fail "a node wrote the one-node layout"
mkdir -p "$T/logsf"
port=$(free_port)
flags=(--nnodes 2 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 2
       --rdzv_timeout 20 --log_dir "$d/L" --run_id failing)
"$DDPRUN" "${flags[@]}" --node_rank 1 "$WORKER" fail 3 3 "$T/logsf" >"$d/out1" 2>"$d/err1" &
n1=$!; BG_PIDS+=($n1)
rc=0; "$DDPRUN" "${flags[@]}" --node_rank 0 "$WORKER" fail 3 3 "$T/logsf" >"$d/out0" 2>"$d/err0" || rc=$?
[ $rc = 1 ] || { cat "$d/err0"; fail "node 0 exited $rc, expected 1"; }
rc=0; wait $n1 || rc=$?
[ $rc = 1 ] || { cat "$d/err1"; fail "node 1 exited $rc, expected 1"; }
assert_contains "$d/err1" "log     : $d/L/failing/node_1/attempt_0/1/stderr.log"
assert_contains "$d/L/failing/node_1/attempt_0/1/stderr.log" "failing on purpose"
wait_gone "$T/logsf" 10
ok "two nodes sharing --log_dir: DIR/RUN_ID/node_N/attempt_K/LOCAL_RANK, nothing mixed"

# 3. The run id is the job's: a node without --run_id takes node 0's (before, it waited out
#    --rdzv_timeout for an id node 0 never published when node 0 had one), and nodes with
#    different ones (--rdzv_id A on one, B on the other) are refused on both at once (before,
#    they ran one job whose workers had two DDP_RUN_IDs).
d=$T/runid; mkdir -p "$d"
port=$(free_port)
flags=(--nnodes 2 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 --rdzv_timeout 10)
"$DDPRUN" "${flags[@]}" --node_rank 0 --run_id jobA "$WORKER" env "$d" >"$d/out0" 2>"$d/err0" &
n0=$!; BG_PIDS+=($n0)
t0=$(now_ms)
"$DDPRUN" "${flags[@]}" --node_rank 1 "$WORKER" env "$d" >"$d/out1" 2>"$d/err1" ||
    { cat "$d/err1"; fail "node 1 without --run_id exited non-zero"; }
wait $n0 || { cat "$d/err0"; fail "node 0 exited non-zero"; }
[ $(($(now_ms) - t0)) -lt 8000 ] || fail "node 1 without --run_id took $(($(now_ms) - t0)) ms"
assert_contains "$d/env.0" "DDP_RUN_ID=jobA"
assert_contains "$d/env.1" "DDP_RUN_ID=jobA"
port=$(free_port)
flags=(--nnodes 2 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 --rdzv_timeout 10)
"$DDPRUN" "${flags[@]}" --node_rank 0 --rdzv_id jobA "$WORKER" sleep "$d" >"$d/out0" 2>"$d/err0" &
n0=$!; BG_PIDS+=($n0)
t0=$(now_ms)
rc=0; "$DDPRUN" "${flags[@]}" --node_rank 1 --rdzv_id jobB "$WORKER" sleep "$d" >"$d/out1" 2>"$d/err1" || rc=$?
[ $rc = 1 ] || { cat "$d/err1"; fail "node 1 with another --rdzv_id exited $rc, expected 1"; }
rc=0; wait $n0 || rc=$?
[ $rc = 1 ] || { cat "$d/err0"; fail "node 0 exited $rc with another node's --rdzv_id, expected 1"; }
[ $(($(now_ms) - t0)) -lt 8000 ] || fail "refusing two run ids took $(($(now_ms) - t0)) ms"
assert_contains "$d/err1" "node 0 runs with run id 'jobA' but this node with 'jobB'"
assert_contains "$d/err0" "node 1 runs with run id 'jobB' but this node with 'jobA'"
[ ! -e "$d/pid.0" ] && [ ! -e "$d/pid.1" ] || fail "workers started under two run ids"
ok "one run id per job: node 0's is taken, two different ones are refused on every node"

# 3b. Nodes started with different --nnodes are refused on both at once, in either order
#    (before 2026-11-24 a node 0 with --nnodes 3 beside a node with 2 waited out --rdzv_timeout
#    and blamed a missing node_rank 2; a node with 3 beside a node 0 with 2 lost the store with
#    no reason).
for nn in "2 3" "3 2"; do
    set -- $nn
    port=$(free_port)
    flags=(--master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 --rdzv_timeout 30)
    "$DDPRUN" "${flags[@]}" --nnodes $1 --node_rank 0 "$WORKER" sleep "$d" >"$d/out0" 2>"$d/err0" &
    n0=$!; BG_PIDS+=($n0)
    t0=$(now_ms)
    rc=0; "$DDPRUN" "${flags[@]}" --nnodes $2 --node_rank 1 "$WORKER" sleep "$d" >"$d/out1" \
        2>"$d/err1" || rc=$?
    [ $rc = 1 ] || { cat "$d/err1"; fail "node 1 with --nnodes $2 beside $1 exited $rc, expected 1"; }
    rc=0; wait $n0 || rc=$?
    [ $rc = 1 ] || { cat "$d/err0"; fail "node 0 with --nnodes $1 beside $2 exited $rc, expected 1"; }
    [ $(($(now_ms) - t0)) -lt 8000 ] || fail "refusing --nnodes $1 and $2 took $(($(now_ms) - t0)) ms"
    assert_contains "$d/err1" "node 0 runs with --max_restarts 0 --nnodes $1 but this node with 0 and $2"
    assert_contains "$d/err0" "node 1 runs with --max_restarts 0 --nnodes $2 but this node with 0 and $1"
    [ ! -e "$d/pid.0" ] && [ ! -e "$d/pid.1" ] || fail "workers started with two --nnodes"
done
ok "nodes with different --nnodes: refused on every node at once, naming the flag, in either order"

# 4. A node's ddprun that cannot start its workers (here: its --log_dir is a file) tells the
#    others at once: node 0 stops within seconds naming it, not after --agent_timeout (30 s) as
#    a dead machine.
d=$T/agenterr; mkdir -p "$d"
touch "$d/notadir"
port=$(free_port)
flags=(--nnodes 2 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 --rdzv_timeout 10)
"$DDPRUN" "${flags[@]}" --node_rank 0 "$WORKER" sleep "$d" >"$d/out0" 2>"$d/err0" &
n0=$!; BG_PIDS+=($n0)
t0=$(now_ms)
rc=0; "$DDPRUN" "${flags[@]}" --node_rank 1 --log_dir "$d/notadir" "$WORKER" sleep "$d" \
    >"$d/out1" 2>"$d/err1" || rc=$?
[ $rc = 1 ] || { cat "$d/err1"; fail "node 1 exited $rc with an unusable --log_dir, expected 1"; }
assert_contains "$d/err1" "cannot create log directory"
rc=0; wait $n0 || rc=$?
took=$(($(now_ms) - t0))
[ $rc = 1 ] || { cat "$d/err0"; fail "node 0 exited $rc, expected 1"; }
[ $took -lt 10000 ] || { cat "$d/err0"; fail "node 0 took $took ms to stop"; }
assert_contains "$d/err0" "ddprun on node 1 ('$(hostname)') could not start or watch its workers"
wait_gone "$d" 10
ok "a node that cannot start its workers stops the others at once ($took ms)"

# 5. mpirun binds each task to a core by default (np <= 2): a ddprun it starts, and all of that
#    ddprun's workers, would share one core silently. ddprun says so.
if command -v mpirun >/dev/null && [ "$(nproc --all)" -ge 2 ] && [ "$(nproc)" -ge 2 ]; then
    d=$T/bound; mkdir -p "$d"
    mpirun --allow-run-as-root --oversubscribe -np 1 --bind-to core "$DDPRUN" --standalone \
        --nproc_per_node 2 "$WORKER" env "$d" >"$d/out" 2>"$d/err" ||
        { cat "$d/out" "$d/err"; fail "mpirun -np 1 ddprun failed"; }
    assert_contains "$d/err" "warning: this ddprun may use only 1 of the machine's"
    assert_contains "$d/err" "(1 core / 2 workers)"
    rc=0; "$DDPRUN" --standalone --nproc_per_node 2 "$WORKER" env "$d" >"$d/out" 2>"$d/err" || rc=$?
    [ $rc = 0 ] || { cat "$d/err"; fail "ddprun exited $rc"; }
    assert_not_contains "$d/err" "may use only"
    ok "a ddprun bound to one core by mpirun warns that its 2 workers share it"
else
    echo "skip 5: no mpirun or fewer than 2 cores"
fi

# 6. A full disk under --log_dir: with --redirects 3 the log files are the output's only copy.
#    ddprun says once per stream that the log cannot be written and sends the rest to the
#    console, so the end of the output (here each rank's last line) is not lost silently.
d=$T/full; mkdir -p "$d/fs"
if mount -t tmpfs -o size=64k tmpfs "$d/fs" 2>/dev/null; then
    UNMOUNT+=("$d/fs")
    cat >"$d/big.sh" <<'SH'
#!/bin/sh
i=0
while [ $i -lt 3000 ]; do
    echo "rank $RANK line $i ................................................"
    i=$((i + 1))
done
echo "rank $RANK last line" >&2
SH
    chmod +x "$d/big.sh"
    rc=0; "$DDPRUN" --standalone --nproc_per_node 2 --log_dir "$d/fs" --run_id full -r 3 \
        "$d/big.sh" >"$d/out" 2>"$d/err" || rc=$?
    [ $rc = 0 ] || { cat "$d/err"; fail "ddprun exited $rc with a full log disk"; }
    assert_contains "$d/err" "cannot write rank 0's log '$d/fs/full/attempt_0/0/stdout.log': No space left on device; the rest of it goes to the console instead"
    assert_contains "$d/out" "[rank1]: rank 1 line 2999 "
    assert_contains "$d/err" "[rank0]: rank 0 last line"
    assert_contains "$d/err" "[rank1]: rank 1 last line"
    ok "a full disk under --log_dir: said once per stream, the rest of the output on the console"
else
    echo "skip 6: cannot mount a tmpfs (not root)"
fi

# 7. Node 1 cannot reach node 0's store: one line that says where and what to do once, the
#    connection's own error inside it (the store client's whole message, with its own hint about
#    MASTER_ADDR and "after 150 ms", was embedded before 2026-11-25).
d=$T/noreach; mkdir -p "$d"
port=$(free_port)
rc=0; "$DDPRUN" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port $port \
    --rdzv_timeout 1 "$WORKER" sleep "$d" >"$d/out" 2>"$d/err" || rc=$?
[ $rc -eq 1 ] || { cat "$d/err"; fail "node 1 without node 0: exit $rc, want 1"; }
assert_contains "$d/err" "cannot reach the store of node 0 at '127.0.0.1:$port' after 1 s (last error: cannot connect to '127.0.0.1:$port': Connection refused); start ddprun on node 0"
[ "$(grep -c 'cannot reach the store' "$d/err")" -eq 1 ] || { cat "$d/err"; fail "the store named twice"; }
assert_not_contains "$d/err" "MASTER_ADDR"
ok "a store that cannot be reached: one line, one hint"

# Under an address-space limit (ulimit -v; some clusters set one) ddprun runs: it no longer
# links OpenBLAS, which it never calls, whose loader thread retried a failed 128 MiB mmap
# forever, and whose fork handler made ddprun's fork of its reaper wait for it (every run,
# even --version, hung until 2026-11-26). Not under the sanitizers (their shadow memory needs
# terabytes of address space).
if [ -z "$SANITIZE" ]; then
    rc=0
    (ulimit -v 200000 && timeout 20 "$DDPRUN" --standalone --nproc_per_node 2 --no_prefix \
        sh -c 'echo "rank $RANK ran"') >"$T/vlim.out" 2>"$T/vlim.err" || rc=$?
    [ $rc -eq 0 ] || { cat "$T/vlim.out" "$T/vlim.err"; fail "ddprun under ulimit -v 200000 exited $rc"; }
    assert_contains "$T/vlim.out" "rank 1 ran"
    ! readelf -d "$DDPRUN" 2>/dev/null | grep -q libopenblas || fail "ddprun links OpenBLAS again"
    ok "ddprun under an address-space limit (ulimit -v 200000): runs its workers"
fi

# An open-files limit too low for the job (ulimit -n 8): said at once. The store could not accept
# ddprun's own connection, and the rendezvous waited its whole timeout (300 s) and then blamed
# node 0 (until 2026-11-26).
rc=0
(ulimit -n 8 && timeout 20 "$DDPRUN" --standalone --nproc_per_node 2 --no_prefix true) \
    >"$T/nofile.out" 2>"$T/nofile.err" || rc=$?
[ $rc -eq 1 ] || { cat "$T/nofile.err"; fail "ddprun under ulimit -n 8 exited $rc, want 1 at once"; }
assert_contains "$T/nofile.err" "the open-files limit (ulimit -n: 8) is too low for 2 workers: ddprun needs about 20"
ok "an open-files limit too low for the workers (ulimit -n 8): one line, at once"

# A stack size limit too low (ulimit -s 32): one line, at once (ddprun ended by SIGSEGV while it
# built a worker's environment, until 2026-11-26). The sanitized builds, whose frames are larger,
# are refused at 128 KiB instead.
lim=32
[ -z "$SANITIZE" ] || lim=128
rc=0
(ulimit -s $lim && timeout 20 "$DDPRUN" --standalone --nproc_per_node 2 --no_prefix true) \
    >"$T/stack.out" 2>"$T/stack.err" || rc=$?
[ $rc -eq 1 ] || { cat "$T/stack.err"; fail "ddprun under ulimit -s $lim exited $rc, want 1 at once"; }
assert_contains "$T/stack.err" "the stack size limit (ulimit -s: $lim KiB) is too low: ddprun and its workers need at least 256 KiB; raise it (ulimit -s 8192"
[ "$(wc -l <"$T/stack.err")" -eq 1 ] || { cat "$T/stack.err"; fail "ulimit -s $lim: not one line"; }
ok "a stack size limit too low (ulimit -s $lim): one line, at once"

# The reaper killed by hand (pkill ddp-reaper, an OOM killer): said, and the job goes on (it went
# unnoticed until 2026-11-26, leaving the job without its protection against a SIGKILL to
# ddprun, silently).
"$DDPRUN" --standalone --nproc_per_node 2 --no_prefix sh -c 'sleep 2; echo "rank $RANK done"' \
    >"$T/reap.out" 2>"$T/reap.err" &
job=$!
BG_PIDS+=($job)
reaper=""
for _ in $(seq 200); do reaper=$(pgrep -P $job -x ddp-reaper || true); [ -n "$reaper" ] && break; sleep 0.01; done
[ -n "$reaper" ] || fail "no ddp-reaper child of ddprun"
kill -KILL "$reaper"
rc=0; wait $job || rc=$?
[ $rc -eq 0 ] || { cat "$T/reap.err"; fail "the job exited $rc after its reaper was killed"; }
assert_contains "$T/reap.err" "warning: the reaper (pid $reaper, 'ddp-reaper') ended by SIGKILL: the job goes on"
assert_contains "$T/reap.out" "rank 1 done"
ok "the reaper killed: a warning, and the job goes on"
