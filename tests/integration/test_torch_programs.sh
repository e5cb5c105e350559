#!/usr/bin/env bash
# PyTorch programs under ddprun, as under torchrun: the workers' MASTER_PORT is a free port of
# node 0 that ddprun leaves to them (rank 0's init_process_group hosts torch's TCPStore there),
# ddprun's own store is on DDP_STORE_PORT. One node, a restart (a fresh port each attempt), and
# two nodes over loopback. Skipped (77) where Debian's python3-torch is missing, and in the
# sanitizer builds (the python workers are not instrumented; ddprun's code here is what every
# other ddprun test runs).
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
SCRIPT=$(cd "$(dirname "$0")/../python" && pwd)/torch_ddprun_worker.py
[ -z "$SANITIZE" ] || { echo "skip: sanitizer build"; exit 77; }
$PY -c 'import torch.distributed as d; assert d.is_available()' 2>/dev/null ||
    { echo "skip: no torch.distributed in $PY"; exit 77; }

# torchrun's form: the script itself (run with PATH's python3 -u; Debian's first here)
PATH=$(dirname $PY):$PATH "$DDPRUN" --standalone --nproc_per_node 2 "$SCRIPT" >"$T/out" 2>"$T/err" ||
    { cat "$T/out" "$T/err" >&2; fail "a torch program under ddprun --standalone exited $?"; }
[ "$(grep -c "torch rank . of 2 ok (attempt 0" "$T/out")" -eq 2 ] || { cat "$T/out"; fail "not both ranks ok"; }
ok "ddprun --standalone --nproc_per_node 2 train.py: init_process_group, gloo collectives, a DDP step"

# torchrun's habit: --master_port given; torch must not collide with ddprun's store on it.
port=$(free_port)
"$DDPRUN" --nproc_per_node 2 --master_port "$port" $PY "$SCRIPT" >"$T/out" 2>"$T/err" ||
    { cat "$T/out" "$T/err" >&2; fail "with --master_port $port: exit $?"; }
grep -q "MASTER_PORT $port)" "$T/out" && fail "the workers' MASTER_PORT is the store's $port"
ok "--master_port $port: the store there, the torch program's store on a port of its own"

# Attempt 0's rank 1 exits after init: the group restarts and meets again on a fresh port.
"$DDPRUN" --standalone --nproc_per_node 2 --max_restarts 1 $PY "$SCRIPT" fail-first \
    >"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err" >&2; fail "the restarted torch job exited $?"; }
[ "$(grep -c "torch rank . of 2 ok (attempt 1" "$T/out")" -eq 2 ] || { cat "$T/out"; fail "attempt 1 not ok"; }
p0=$(sed -n 's/.*rank 1 of attempt 0 leaves (MASTER_PORT \([0-9]*\)).*/\1/p' "$T/out")
p1=$(sed -n 's/.*ok (attempt 1, MASTER_PORT \([0-9]*\)).*/\1/p' "$T/out" | head -1)
[ -n "$p0" ] && [ -n "$p1" ] && [ "$p0" != "$p1" ] || fail "MASTER_PORT '$p0' then '$p1': not a fresh one"
assert_contains "$T/err" "restarting the whole group"
ok "--max_restarts 1: a torch worker that exits restarts the group, which meets again"

# Two nodes over loopback (1 + 2 workers): rank 0 is on node 0, whose pick every node hands on.
port=$(free_port)
args=(--nnodes 2 --master_addr 127.0.0.1 --master_port "$port" --rdzv_timeout 30)
"$DDPRUN" "${args[@]}" --node_rank 1 --nproc_per_node 2 $PY "$SCRIPT" >"$T/out1" 2>"$T/err1" &
BG_PIDS+=($!); n1=$!
"$DDPRUN" "${args[@]}" --node_rank 0 --nproc_per_node 1 $PY "$SCRIPT" >"$T/out0" 2>"$T/err0" ||
    { cat "$T/out0" "$T/err0" >&2; fail "node 0 exited $?"; }
wait $n1 || { cat "$T/out1" "$T/err1" >&2; fail "node 1 exited non-zero"; }
[ "$(cat "$T/out0" "$T/out1" | grep -c "torch rank . of 3 ok")" -eq 3 ] ||
    { cat "$T/out0" "$T/out1"; fail "not all 3 ranks ok"; }
[ "$(cat "$T/out0" "$T/out1" | sed -n 's/.*MASTER_PORT \([0-9]*\)).*/\1/p' | sort -u | wc -l)" -eq 1 ] ||
    fail "the nodes' workers got different MASTER_PORTs"
ok "two nodes (1 + 2 workers): one torch world of 3 through node 0's port"
