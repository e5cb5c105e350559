#!/usr/bin/env bash
# Multi-node failure reporting when a node's ddprun dies or node 0 is stopped by a signal (two
# ddprun instances over loopback):
#   - node 1's ddprun and its workers killed (-9: its machine rebooted, the network up): node 0
#     names node 1 lost within seconds (its presence connection to the store closed), not after
#     --agent_timeout; also when node 0's own worker stops first "because another rank failed"
#     (before 2026-11-25 that summary said "no rank reported a failure of its own");
#   - Ctrl-C (SIGINT) on node 0: node 0 prints a summary, which the other node points to.
. "$(dirname "$0")/lib.sh"
export DDP_STORE_TOKEN=test-secret-$$

# start_node1 DIR PORT: node 1 (one sleeping testworker, rank 1) in the background; N1 its pid
start_node1() {
    "$DDPRUN" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port "$2" \
        --nproc_per_node 1 --rdzv_timeout 20 --agent_timeout 10 "$WORKER" sleep "$1" \
        >"$1/out1" 2>&1 &
    BG_PIDS+=($!)
    N1=$!
}
kill_node1() { # DIR: ddprun, then its worker and grandchild (their own process group)
    { # (not bash's "Killed" note)
        kill -9 "$N1"
        kill -9 -- "-$(cat "$1/pid.1")" || true
        wait "$N1" || true
    } 2>/dev/null
}
# summary_ms FILE PATTERN T0: milliseconds from T0 until PATTERN is in FILE (≤ 15 s)
summary_ms() {
    for _ in $(seq 300); do
        grep -qF "$2" "$1" && { echo $(($(now_ms) - $3)); return 0; }
        sleep 0.05
    done
    cat "$1" >&2
    fail "no '$2' in $1 within 15 s"
}

# 1. Node 0's workers keep running; node 1 dies. Before: --agent_timeout (10 s here).
d=$T/killed; mkdir -p "$d"
port=$(free_port)
"$DDPRUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port $port \
    --nproc_per_node 1 --rdzv_timeout 20 --agent_timeout 10 "$WORKER" sleep "$d" \
    >"$d/out0" 2>&1 &
BG_PIDS+=($!); n0=$!
start_node1 "$d" $port
for _ in $(seq 200); do [ -f "$d/pid.0" ] && [ -f "$d/child.1" ] && break; sleep 0.05; done
[ -f "$d/child.1" ] && [ -f "$d/pid.0" ] || fail "the workers never started"
t0=$(now_ms)
kill_node1 "$d"
ms=$(summary_ms "$d/out0" "job failed on another node: node 1 (" "$t0")
rc=0; wait $n0 || rc=$?
[ $rc -eq 1 ] || fail "node 0 exited $rc, want 1"
assert_contains "$d/out0" "lost: its ddprun's connection to the store closed at"
assert_contains "$d/out0" "(its machine or ddprun died)"
assert_contains "$d/out0" "that node's ddprun is gone: no summary comes from it"
[ "$ms" -lt 5000 ] || fail "node 0 named node 1 lost $ms ms after the kill (want < 5 s)"
wait_gone "$d" 5
echo "  (kill -9 of node 1 → node 0's summary: $ms ms; --agent_timeout 10 s)"
ok "node 1's ddprun killed: node 0 names it lost within seconds, not after --agent_timeout"

# 2. Node 0's worker stops first "because another rank failed" (ddptrain's exit 86, as over
# gloo/tcp when the peer's socket closes): node 1's loss replaces that secondary failure.
d=$T/secondary; mkdir -p "$d"
port=$(free_port)
"$DDPRUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port $port \
    --nproc_per_node 1 --rdzv_timeout 20 --agent_timeout 10 --grace_period 10 \
    bash -c "echo \$\$ >'$d/pid.0'; while [ ! -f '$d/killed' ]; do sleep 0.05; done; exit 86" \
    >"$d/out0" 2>&1 &
BG_PIDS+=($!); n0=$!
start_node1 "$d" $port
for _ in $(seq 200); do [ -f "$d/pid.0" ] && [ -f "$d/child.1" ] && break; sleep 0.05; done
[ -f "$d/child.1" ] && [ -f "$d/pid.0" ] || fail "the workers never started"
t0=$(now_ms)
kill_node1 "$d"
touch "$d/killed"
ms=$(summary_ms "$d/out0" "job failed on another node: node 1 (" "$t0")
rc=0; wait $n0 || rc=$?
[ $rc -eq 1 ] || fail "node 0 exited $rc, want 1"
assert_not_contains "$d/out0" "no rank reported a failure of its own"
assert_contains "$d/out0" "lost: its ddprun's connection to the store closed at"
assert_contains "$d/out0" "before  : rank 0 (local rank 0) on node 0"
[ "$ms" -lt 5000 ] || fail "node 0 named node 1 lost $ms ms after the kill (want < 5 s)"
wait_gone "$d" 5
echo "  (kill -9 of node 1, node 0's worker exits 86 → node 0's summary: $ms ms)"
ok "node 0's worker stopped because of the dead node: the summary names node 1 lost as the cause"

# 3. SIGINT on node 0: it prints a summary naming the signal; node 1 points to it.
d=$T/sigint; mkdir -p "$d"
port=$(free_port)
"$DDPRUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port $port \
    --nproc_per_node 1 --rdzv_timeout 20 --agent_timeout 10 "$WORKER" sleep "$d" \
    >"$d/out0" 2>&1 &
BG_PIDS+=($!); n0=$!
start_node1 "$d" $port
for _ in $(seq 200); do [ -f "$d/pid.0" ] && [ -f "$d/child.1" ] && break; sleep 0.05; done
[ -f "$d/child.1" ] && [ -f "$d/pid.0" ] || fail "the workers never started"
kill -INT $n0
rc0=0; wait $n0 || rc0=$?
rc1=0; wait $N1 || rc1=$?
[ $rc0 -eq 130 ] || fail "node 0 exited $rc0 after SIGINT, want 130"
[ $rc1 -eq 1 ] || fail "node 1 exited $rc1, want 1"
assert_contains "$d/out0" "job stopped: ddprun on node 0 ("
assert_contains "$d/out0" ") received SIGINT"
assert_contains "$d/out1" "job stopped on another node: ddprun on node 0 ("
assert_contains "$d/out1" "see the summary printed by that node's ddprun"
assert_not_contains "$d/out1" "lost: its ddprun's connection"
assert_not_contains "$d/out0" "lost: its ddprun's connection"
wait_gone "$d" 5
ok "SIGINT on node 0: node 0 prints the summary that node 1 points to"

# 4. An orderly end is no loss: node 1 finishes first, node 0 then; both exit 0.
d=$T/orderly; mkdir -p "$d"
port=$(free_port)
"$DDPRUN" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port $port \
    --nproc_per_node 1 --rdzv_timeout 20 "$WORKER" env "$d" >"$d/out1" 2>&1 &
BG_PIDS+=($!); n1=$!
"$DDPRUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port $port \
    --nproc_per_node 1 --rdzv_timeout 20 "$WORKER" env "$d" >"$d/out0" 2>&1 ||
    { cat "$d/out0"; fail "node 0 exited $?"; }
wait $n1 || { cat "$d/out1"; fail "node 1 exited $?"; }
assert_not_contains "$d/out0" "lost"
ok "a job that ends well names no node lost"
