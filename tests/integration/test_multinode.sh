#!/usr/bin/env bash
# Two nodes on one machine: two ddprun instances over loopback. Ranks are contiguous per node,
# the store lives on node 0, a failure on one node stops both, a missing node times out clearly.
. "$(dirname "$0")/lib.sh"
export DDP_STORE_TOKEN=test-secret-$$
get() { sed -n "s/^$2=//p" "$1"; }

node() { # node RANK PORT NPROC DIR ARGS...
    local r=$1 port=$2 np=$3 d=$4; shift 4
    "$DDPRUN" --nnodes 2 --node_rank $r --master_addr 127.0.0.1 --master_port $port \
        --nproc_per_node $np --rdzv_timeout 20 --agent_timeout 5 "$@"
}

d=$T/env; mkdir -p "$d"
port=$(free_port)
node 1 $port 3 "$d" "$WORKER" env "$d" >"$d/out1" 2>"$d/err1" & BG_PIDS+=($!); n1=$!
node 0 $port 2 "$d" "$WORKER" env "$d" >"$d/out0" 2>"$d/err0" || fail "node 0 exited $?"
wait $n1 || { cat "$d/err1"; fail "node 1 exited non-zero"; }
for r in 0 1 2 3 4; do
    f=$d/env.$r
    [ -f "$f" ] || fail "no env file for rank $r"
    node=$([ $r -lt 2 ] && echo 0 || echo 1)
    lr=$([ $r -lt 2 ] && echo $r || echo $((r - 2)))
    lws=$([ $r -lt 2 ] && echo 2 || echo 3)
    [ "$(get "$f" WORLD_SIZE)" = 5 ] || fail "WORLD_SIZE in $f"
    [ "$(get "$f" GROUP_RANK)" = $node ] || fail "GROUP_RANK in $f"
    [ "$(get "$f" LOCAL_RANK)" = $lr ] || fail "LOCAL_RANK in $f"
    [ "$(get "$f" LOCAL_WORLD_SIZE)" = $lws ] || fail "LOCAL_WORLD_SIZE in $f"
    [ "$(get "$f" DDP_STORE_PORT)" = $port ] || fail "DDP_STORE_PORT in $f"
    mp=$(get "$f" MASTER_PORT) # node 0's pick, the same on every node, for a program's own store
    [ -n "$mp" ] && [ "$mp" != $port ] && [ "$mp" = "$(get "$d/env.0" MASTER_PORT)" ] ||
        fail "MASTER_PORT '$mp' in $f"
    [ "$(get "$f" DDP_STORE_TOKEN)" = "$DDP_STORE_TOKEN" ] || fail "token in $f"
    [ "$(get "$f" DDP_RUN_ID)" = "$(get "$d/env.0" DDP_RUN_ID)" ] || fail "run id differs in $f"
done
ok "two nodes (2 + 3 workers): contiguous ranks, one run id, one token"

d=$T/rdzv; mkdir -p "$d"
port=$(free_port)
node 1 $port 2 "$d" "$WORKER" rendezvous >"$d/out1" 2>&1 & BG_PIDS+=($!); n1=$!
node 0 $port 2 "$d" "$WORKER" rendezvous >"$d/out0" 2>&1 || { cat "$d/out0"; fail "node 0"; }
wait $n1 || { cat "$d/out1"; fail "node 1 exited non-zero"; }
[ "$(cat "$d/out0" "$d/out1" | grep -c "rendezvous ok")" -eq 4 ] || fail "not all 4 ranks met"
ok "4 ranks on two nodes meet through node 0's store"

d=$T/fail; mkdir -p "$d"
port=$(free_port)
node 1 $port 2 "$d" "$WORKER" fail 3 3 "$d" >"$d/out1" 2>"$d/err1" & BG_PIDS+=($!); n1=$!
rc0=0; node 0 $port 2 "$d" "$WORKER" fail 3 3 "$d" >"$d/out0" 2>"$d/err0" || rc0=$?
rc1=0; wait $n1 || rc1=$?
[ $rc0 -eq 1 ] && [ $rc1 -eq 1 ] || fail "exit codes $rc0 / $rc1, want 1 / 1"
assert_contains "$d/err1" "worker failed: rank 3 (local rank 1, role 'default') ended with exit code 3"
assert_contains "$d/err0" "stopping: rank 3 (local rank 1) on node 1"
assert_contains "$d/err0" "job failed on another node"
wait_gone "$d" 2
ok "a failure on node 1 stops node 0's workers too; both exit 1"

d=$T/alone; mkdir -p "$d"
port=$(free_port)
rc=0
"$DDPRUN" --nnodes 2 --node_rank 0 --master_port $port --rdzv_timeout 1 "$WORKER" env "$d" \
    >"$d/out" 2>"$d/err" || rc=$?
[ $rc -eq 1 ] || fail "lonely node 0 exited $rc"
assert_contains "$d/err" "timed out after"
assert_contains "$d/err" "(1 of 2 nodes joined; missing node_rank 1)"
ok "a missing node: rendezvous times out naming it"

d=$T/wrongtoken; mkdir -p "$d"
port=$(free_port)
"$DDPRUN" --nnodes 2 --node_rank 0 --master_port $port --rdzv_timeout 20 "$WORKER" env "$d" \
    >"$d/out0" 2>"$d/err0" & BG_PIDS+=($!); n0=$! # not via node(): $n0 must be ddprun itself
sleep 0.3
rc=0
DDP_STORE_TOKEN=not-the-secret node 1 $port 1 "$d" "$WORKER" env "$d" >"$d/out1" 2>"$d/err1" ||
    rc=$?
[ $rc -eq 1 ] || fail "node 1 with a wrong token exited $rc"
assert_contains "$d/err1" "refused our token"
assert_contains "$d/err1" "(this node's DDP_STORE_TOKEN is not node 0's: export the same secret on every node)"
assert_contains "$d/err0" "wrong store token (a node or rank started with another DDP_STORE_TOKEN, or a stranger)"
kill -TERM $n0
rc=0; wait $n0 || rc=$?
[ $rc -eq 143 ] || fail "node 0 waiting in the rendezvous exited $rc after SIGTERM, want 143"
ok "a node with the wrong token is refused, and node 0 logs it"

d=$T/bignode; mkdir -p "$d"
port=$(free_port)
rc=0
node 0 $port 1 "$d" --run_id big "$WORKER" env "$d" >"$d/out0" 2>"$d/err0" & BG_PIDS+=($!)
n0=$!
# A stranger with the token plays node 1 and asks for more workers than any ddprun may run:
# node 0 refuses the record instead of summing it into the world size.
"$WORKER" store-set 127.0.0.1 $port ddprun/a0/claim/1 1 >/dev/null 2>&1 || true
"$WORKER" store-set 127.0.0.1 $port ddprun/a0/node/1 "2147483647 0 2 1 big" ||
    fail "the fake node could not write its record"
rc=0; wait $n0 || rc=$?
[ $rc -eq 1 ] || fail "node 0 beside a fake node exited $rc"
assert_contains "$d/err0" "node 1 asks for 2147483647 workers, more than ddprun's 1024 per node"
ok "a node record asking for more workers than ddprun allows is refused"

# A node's ddprun killed (SIGKILL: its machine rebooted) and started again, as a scheduler does:
# node 0 finds the old one gone (its presence connection closed), restarts the group, and the new one joins
# that attempt (torchrun's agents rejoin the same way); before 2026-11-25 it was refused as a
# second node 1 and the job waited for node 1 until --rdzv_timeout.
d=$T/rejoin; mkdir -p "$d"
port=$(free_port)
fast=(--max_restarts 2 --agent_timeout 3 --monitor_interval 0.5)
node 0 $port 1 "$d" "${fast[@]}" "$WORKER" env "$d" >"$d/out0" 2>&1 & BG_PIDS+=($!); n0=$!
"$DDPRUN" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 \
    --rdzv_timeout 20 "${fast[@]}" "$WORKER" sleep "$d" >"$d/out1" 2>&1 & BG_PIDS+=($!); n1=$!
for _ in $(seq 100); do [ -f "$d/pid.1" ] && break; sleep 0.1; done
[ -f "$d/pid.1" ] || fail "node 1's first worker never started"
kill -9 $n1
rm -f "$d/env.1"
node 1 $port 1 "$d" "${fast[@]}" "$WORKER" env "$d" >"$d/out1b" 2>&1 || { cat "$d/out1b"; fail "the new node 1 exited $?"; }
wait $n0 || { cat "$d/out0"; fail "node 0 exited $? after node 1 rejoined"; }
assert_contains "$d/out1b" "node 1's place in attempt 0 is held by an earlier ddprun of this node"
assert_contains "$d/out1b" "node 1 joined the job at attempt 2 of 3"
assert_contains "$d/out0" "node 1 ('$(hostname)') lost: its ddprun's connection to the store closed"
[ "$(get "$d/env.1" DDP_RESTART_COUNT)" = 1 ] && [ "$(get "$d/env.1" WORLD_SIZE)" = 2 ] ||
    fail "the rejoined node's worker: $(cat "$d/env.1")"
[ "$(get "$d/env.0" DDP_RESTART_COUNT)" = 1 ] || fail "node 0's worker did not restart"
wait_gone "$d" 5
ok "a node's ddprun killed and started again rejoins the job at the next attempt"

# A second live node 1 beside a running job is still refused, within a few heartbeats.
d=$T/dup; mkdir -p "$d"
port=$(free_port)
"$DDPRUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 \
    --rdzv_timeout 20 --monitor_interval 0.5 "$WORKER" sleep "$d" >"$d/out0" 2>&1 & BG_PIDS+=($!)
n0=$!
"$DDPRUN" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port $port --nproc_per_node 1 \
    --rdzv_timeout 20 --monitor_interval 0.5 "$WORKER" sleep "$d" >"$d/out1" 2>&1 & BG_PIDS+=($!)
n1=$!
for _ in $(seq 100); do [ -f "$d/pid.1" ] && break; sleep 0.1; done
t0=$(now_ms)
rc=0; node 1 $port 1 "$d/x" --monitor_interval 0.5 "$WORKER" sleep "$d/x" >"$d/out2" 2>&1 || rc=$?
[ $rc = 1 ] || fail "a second live node 1 exited $rc, want 1"
[ $(($(now_ms) - t0)) -lt 8000 ] || fail "refusing a live second node 1 took $(($(now_ms) - t0)) ms"
assert_contains "$d/out2" "two nodes claim --node_rank 1"
kill -TERM $n0 $n1
wait $n0 $n1 || true
wait_gone "$d" 5
ok "a second live node with the same --node_rank is refused while the job runs"

# SIGTERM to node 0 stops both nodes for good, even with restarts left: a user's stop is not a
# failure to recover from.
d=$T/stop; mkdir -p "$d"
port=$(free_port)
# Not through node(): a backgrounded function's $! is a subshell, and the signal must reach ddprun.
flags=(--nnodes 2 --master_port $port --nproc_per_node 2 --max_restarts 2 --agent_timeout 5)
"$DDPRUN" "${flags[@]}" --node_rank 1 "$WORKER" sleep "$d" >"$d/out1" 2>"$d/err1" &
BG_PIDS+=($!); n1=$!
"$DDPRUN" "${flags[@]}" --node_rank 0 "$WORKER" sleep "$d" >"$d/out0" 2>"$d/err0" &
BG_PIDS+=($!); n0=$!
wait_files "$d" "pid.*" 4 20
kill -TERM $n0
t0=$(now_ms)
rc0=0; wait $n0 || rc0=$?
rc1=0; wait $n1 || rc1=$?
[ $rc0 -eq 143 ] || fail "node 0 exited $rc0 after SIGTERM, want 143"
[ $rc1 -eq 1 ] || fail "node 1 exited $rc1, want 1"
[ $(($(now_ms) - t0)) -lt 8000 ] || fail "stopping both nodes took $(($(now_ms) - t0)) ms"
assert_contains "$d/err1" "ddprun on node 0"
assert_contains "$d/err1" "received SIGTERM"
assert_not_contains "$d/err1" "restarting"
wait_gone "$d" 2
ok "SIGTERM to node 0 stops both nodes without restarting"

# torchrun's c10d form with no --node_rank: ddprun numbers the nodes. The node that can listen
# on the endpoint hosts the store and is node 0, the others are 1, 2, … as they join. Here all
# share 127.0.0.1, so --rdzv_conf is_host says which hosts (is_host=0 never does); the case of
# the first to bind hosting is the one-too-many check below and integration.netns.
d=$T/c10d; mkdir -p "$d"
port=$(free_port)
c10d=(--nnodes 3 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:$port --rdzv_timeout 20)
# B, not the host, starts first
"$DDPRUN" "${c10d[@]}" --rdzv_conf is_host=0 --nproc_per_node 2 "$WORKER" env "$d" >"$d/outB" 2>"$d/errB" &
BG_PIDS+=($!); nb=$!
"$DDPRUN" "${c10d[@]}" --rdzv_conf is_host=1 --nproc_per_node 1 "$WORKER" env "$d" >"$d/outA" 2>"$d/errA" &
BG_PIDS+=($!); na=$!
"$DDPRUN" "${c10d[@]}" --rdzv_conf is_host=false --nproc_per_node 1 "$WORKER" env "$d" >"$d/outC" 2>"$d/errC" ||
    { cat "$d"/err*; fail "node C exited $?"; }
wait $na || { cat "$d/errA"; fail "node A exited non-zero"; }
wait $nb || { cat "$d/errB"; fail "node B exited non-zero"; }
[ "$(get "$d/env.0" GROUP_RANK)" = 0 ] && [ "$(get "$d/env.0" LOCAL_WORLD_SIZE)" = 1 ] ||
    fail "rank 0 is not the hosting node's (A, 1 worker)"
assert_not_contains "$d/errA" "numbered by"
groups=""
for r in 0 1 2 3; do
    f=$d/env.$r
    [ -f "$f" ] || fail "no env file for rank $r"
    [ "$(get "$f" WORLD_SIZE)" = 4 ] || fail "WORLD_SIZE in $f"
    [ "$(get "$f" DDP_STORE_PORT)" = $port ] || fail "DDP_STORE_PORT in $f"
    groups="$groups$(get "$f" GROUP_RANK)"
done
[ "$groups" = 0112 ] || [ "$groups" = 0122 ] || fail "GROUP_RANKs by rank: $groups"
assert_contains "$d/errB" "of 3 (numbered by the c10d rendezvous"
assert_contains "$d/errC" "of 3 (numbered by the c10d rendezvous"
ok "--rdzv_backend c10d without --node_rank: the endpoint's node hosts as node 0, the others numbered as they join ($groups)"

# One node too many is told so, and the job of the others goes on.
d=$T/c10d2; mkdir -p "$d"
port=$(free_port)
c10d=(--nnodes 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:$port --rdzv_timeout 20)
"$DDPRUN" "${c10d[@]}" "$WORKER" sleep "$d" >"$d/outA" 2>"$d/errA" &
BG_PIDS+=($!); na=$!
sleep 0.3
"$DDPRUN" "${c10d[@]}" "$WORKER" sleep "$d" >"$d/outB" 2>"$d/errB" &
BG_PIDS+=($!); nb=$!
wait_files "$d" "pid.*" 2 20
rc=0; "$DDPRUN" "${c10d[@]}" "$WORKER" env "$d" >"$d/outC" 2>"$d/errC" || rc=$?
[ $rc -eq 1 ] || fail "a third node for --nnodes 2 exited $rc, want 1"
assert_contains "$d/errC" "more nodes joined the rendezvous at '127.0.0.1:$port' than --nnodes 2"
kill -TERM $na $nb
wait $na || true; wait $nb || true
wait_gone "$d" 2
ok "a node beyond --nnodes under c10d numbering: a clear error"

# A rank that stops because another reported a failure (exit code 86) exits first, on one node;
# the rank that failed first-hand exits later, on the other. Both nodes' summaries name the
# latter: the node's own summary, and the other node's "job failed on another node" line (the
# store's failed key, first set to the secondary failure, is replaced by the first-hand one).
for case in "0 2" "3 1"; do
    set -- $case; cause=$1 sec=$2
    cnode=$((cause / 2)); onode=$((1 - cnode))
    d=$T/peer$cause; mkdir -p "$d"
    port=$(free_port)
    node 1 $port 2 "$d" "$WORKER" peer-fail $cause $sec "$d" >"$d/out1" 2>"$d/err1" &
    BG_PIDS+=($!); n1=$!
    rc0=0; node 0 $port 2 "$d" "$WORKER" peer-fail $cause $sec "$d" >"$d/out0" 2>"$d/err0" || rc0=$?
    rc1=0; wait $n1 || rc1=$?
    [ $rc0 -eq 1 ] && [ $rc1 -eq 1 ] || { cat "$d/err0" "$d/err1"; fail "nodes exited $rc0 and $rc1, want 1 and 1"; }
    assert_contains "$d/err$cnode" "worker failed: rank $cause (local rank $((cause % 2)), role 'default') ended with exit code 5"
    assert_contains "$d/err$cnode" "| testworker rank $cause: No space left on device"
    assert_contains "$d/err$onode" "job failed on another node: rank $cause (local rank $((cause % 2))) on node $cnode"
    assert_not_contains "$d/err$onode" "worker failed"
    wait_gone "$d" 2
    ok "rank $sec stopped by rank $cause's failure exits first: both nodes name rank $cause"
done
