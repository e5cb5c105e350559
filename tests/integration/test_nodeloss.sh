#!/usr/bin/env bash
# Multi-node failure reporting when a node's ddprun dies or node 0 is stopped by a signal (two
# ddprun instances over loopback):
#   - node 1's ddprun and its workers killed (-9: its machine rebooted, the network up): node 0
#     names node 1 lost within seconds (its presence connection to the store closed), not after
#     --agent_timeout; also when node 0's own worker stops first "because another rank failed"
#     (before 2026-11-25 that summary said "no rank reported a failure of its own");
#   - Ctrl-C (SIGINT) on node 0: node 0 prints a summary, which the other node points to.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/nodes_lib.sh"
export DDP_STORE_TOKEN=test-secret-$$

# node NODE_RANK PORT: a fixed 2-node job's ddprun arguments, program aside, in F
node() {
    F=(--nnodes 2 --node_rank $1 --master_addr 127.0.0.1 --master_port $2 --nproc_per_node 1
        --rdzv_timeout 20 --agent_timeout 10)
}
# start_pair DIR PORT PROGRAM...: node 0 runs PROGRAM, node 1 one sleeping testworker (rank 1);
# both in the background, until both workers have started
start_pair() {
    local d=$1 port=$2
    shift 2
    node 0 "$port"; start_node "$d" 0 "${F[@]}" "$@"
    node 1 "$port"; start_node "$d" 1 "${F[@]}" "$WORKER" sleep "$d"
    wait_files "$d" pid.0 1 10
    wait_files "$d" child.1 1 10
}
kill_node1() { # DIR: ddprun, then its worker and grandchild (their own process group)
    kill_node 1
    kill -9 -- "-$(cat "$1/pid.1")" 2>/dev/null || true
}

# 1. Node 0's workers keep running; node 1 dies. Before: --agent_timeout (10 s here).
d=$T/killed; mkdir -p "$d"
start_pair "$d" "$(free_port)" "$WORKER" sleep "$d"
t0=$(now_ms)
kill_node1 "$d"
ms=$(wait_ms "$d/err0" "job failed on another node: node 1 (" "$t0")
node_exit "$d" 0 1
assert_contains "$d/err0" "lost: its ddprun's connection to the store closed at"
assert_contains "$d/err0" "(its machine or ddprun died)"
assert_contains "$d/err0" "that node's ddprun is gone: no summary comes from it"
[ "$ms" -lt 5000 ] || fail "node 0 named node 1 lost $ms ms after the kill (want < 5 s)"
wait_gone "$d" 5
echo "  (kill -9 of node 1 → node 0's summary: $ms ms; --agent_timeout 10 s)"
ok "node 1's ddprun killed: node 0 names it lost within seconds, not after --agent_timeout"

# 2. Node 0's worker stops first "because another rank failed" (ddptrain's exit 86, as over
# gloo/tcp when the peer's socket closes): node 1's loss, found while node 0 waits for the cause,
# replaces that secondary failure.
d=$T/secondary; mkdir -p "$d"
start_pair "$d" "$(free_port)" --grace_period 10 \
    bash -c "echo \$\$ >'$d/pid.0'; while [ ! -f '$d/killed' ]; do sleep 0.05; done; exit 86"
# The worker's exit 86 first, seen by node 0's ddprun (it then waits for the cause), then the
# kill: killed first, node 0 could name the lost node (after ~1.3 s) before a worker slow under
# load had exited, and the summary had no "before" line.
touch "$d/killed"
wait_lines "$d/err0" "waiting up to 5 s for the rank that failed first-hand" 1 30
t0=$(now_ms)
kill_node1 "$d"
ms=$(wait_ms "$d/err0" "job failed on another node: node 1 (" "$t0")
node_exit "$d" 0 1
assert_not_contains "$d/err0" "no rank reported a failure of its own"
assert_contains "$d/err0" "lost: its ddprun's connection to the store closed at"
assert_contains "$d/err0" "before  : rank 0 (local rank 0) on node 0"
[ "$ms" -lt 5000 ] || fail "node 0 named node 1 lost $ms ms after the kill (want < 5 s)"
wait_gone "$d" 5
echo "  (kill -9 of node 1, node 0's worker exits 86 → node 0's summary: $ms ms)"
ok "node 0's worker stopped because of the dead node: the summary names node 1 lost as the cause"

# 3. SIGINT on node 0: it prints a summary naming the signal; node 1 points to it.
d=$T/sigint; mkdir -p "$d"
start_pair "$d" "$(free_port)" "$WORKER" sleep "$d"
kill -INT $n0
node_exit "$d" 0 130
node_exit "$d" 1 1
assert_contains "$d/err0" "job stopped: ddprun on node 0 ("
assert_contains "$d/err0" ") received SIGINT"
assert_contains "$d/err1" "job stopped on another node: ddprun on node 0 ("
assert_contains "$d/err1" "see the summary printed by that node's ddprun"
assert_not_contains "$d/err1" "lost: its ddprun's connection"
assert_not_contains "$d/err0" "lost: its ddprun's connection"
wait_gone "$d" 5
ok "SIGINT on node 0: node 0 prints the summary that node 1 points to"

# 5. Node 0's ddprun (the store's host) killed, node 1 with --max_restarts: node 1 finds the store
# refusing connections (its process is gone) and ends at once naming it, both while its worker
# keeps running and when its worker stopped first "because another rank failed" (exit 86). Until
# 2026-11-26 it waited --agent_timeout, blamed its own worker's exit 86, then "restarted"
# against the dead store for --rdzv_timeout, deaf to SIGTERM.
for variant in running secondary; do
    d=$T/node0-$variant; mkdir -p "$d"
    port=$(free_port)
    node 0 "$port"; start_node "$d" 0 "${F[@]}" --max_restarts 2 "$WORKER" sleep "$d"
    node 1 "$port"
    if [ $variant = running ]; then
        start_node "$d" 1 "${F[@]}" --max_restarts 2 "$WORKER" sleep "$d"
        wait_files "$d" child.1 1 10
    else
        start_node "$d" 1 "${F[@]}" --max_restarts 2 bash -c \
            "echo \$\$ >'$d/pid.1'; while [ ! -f '$d/killed' ]; do sleep 0.05; done; exit 86"
        wait_files "$d" pid.1 1 10
    fi
    wait_files "$d" pid.0 1 10
    t0=$(now_ms)
    kill_node 0
    kill -9 -- "-$(cat "$d/pid.0")" 2>/dev/null || true
    touch "$d/killed"
    ms=$(wait_ms "$d/err1" "lost contact with the store on node 0" "$t0")
    node_exit "$d" 1 1
    assert_contains "$d/err1" "(its ddprun is gone: the connection was refused)"
    assert_not_contains "$d/err1" "restarting"
    [ "$ms" -lt 5000 ] || fail "$variant: node 1 named the store lost $ms ms after the kill"
    wait_gone "$d" 5
    echo "  (kill -9 of node 0, node 1's worker $variant → node 1 names the store lost: $ms ms)"
done
ok "node 0's ddprun killed: node 1 names the store lost within seconds and does not restart"

# 6. A rank stopped (SIGSTOP) on node 1 holds rank 0 up on node 0 until it times out: both
# summaries name the stopped rank (until 2026-11-26 neither did: only a single-node job's).
d=$T/stopped; mkdir -p "$d"
port=$(free_port)
node 0 "$port"
# shellcheck disable=SC2016
start_node "$d" 0 "${F[@]}" bash -c 'until grep -q "was stopped by SIGSTOP" "$0/err1"; do
    sleep 0.05; done; sleep 0.5; echo "allreduce #7 timed out: rank 1 did not arrive" >&2; exit 1' "$d"
node 1 "$port"
# shellcheck disable=SC2016
start_node "$d" 1 "${F[@]}" bash -c 'echo $$ >"$0/pid.1"; kill -STOP $$; sleep 60' "$d"
node_exit "$d" 0 1
node_exit "$d" 1 1
assert_contains "$d/err0" "stopped : rank 1 (pid $(cat "$d/pid.1") on node 1, by SIGSTOP at "
assert_contains "$d/err1" "stopped : rank 1 (pid $(cat "$d/pid.1"), by SIGSTOP, for "
wait_gone "$d" 5
ok "a rank stopped on node 1: node 0's summary and node 1's name it beside rank 0's time-out"

# 4. An orderly end is no loss: node 1 finishes first, node 0 then; both exit 0.
d=$T/orderly; mkdir -p "$d"
port=$(free_port)
node 1 $port; F=("${F[@]:0:${#F[@]}-2}") # no --agent_timeout: its default
start_node "$d" 1 "${F[@]}" "$WORKER" env "$d"
node 0 $port; F=("${F[@]:0:${#F[@]}-2}")
run_node "$d" 0 0 "${F[@]}" "$WORKER" env "$d"
node_exit "$d" 1 0
assert_not_contains "$d/err0" "lost"
assert_not_contains "$d/out0" "lost"
ok "a job that ends well names no node lost"
