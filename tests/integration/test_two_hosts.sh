#!/usr/bin/env bash
# Two "hosts" × 2 ranks on this machine: two ddprun instances (--nnodes 2) whose workers say
# they live on different hosts (DDP_HOST_ID), so the group takes the hierarchical backend: shm
# inside each host, real TCP between them. collcheck verifies every collective.
# Usage: test_two_hosts.sh BINDIR [collcheck args]
. "$(dirname "$0")/lib.sh"
shift
export DDP_STORE_TOKEN=two-hosts-$$
port=$(free_port)
DDP_HOST_ID=hostB "$DDPRUN" --nnodes 2 --node_rank 1 --master_port $port --nproc_per_node 2 \
    --rdzv_timeout 60 "$BIN/collcheck" "$@" >"$T/out1" 2>&1 & BG_PIDS+=($!); n1=$!
DDP_HOST_ID=hostA "$DDPRUN" --nnodes 2 --node_rank 0 --master_port $port --nproc_per_node 2 \
    --rdzv_timeout 60 "$BIN/collcheck" "$@" >"$T/out0" 2>&1 || { cat "$T/out0" "$T/out1"; fail "node 0"; }
wait $n1 || { cat "$T/out1"; fail "node 1 exited non-zero"; }
assert_contains "$T/out0" "checks passed on 4 ranks (backend shm+tcp)"
ok "2 hosts × 2 ranks: every collective correct over shm+tcp"
