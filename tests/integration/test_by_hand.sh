#!/usr/bin/env bash
# Without ddprun: ranks started by hand (or by another launcher) with RANK/WORLD_SIZE/
# MASTER_ADDR/MASTER_PORT meet in a store hosted by rank 0; with DDP_STORE_TOKEN a stranger is
# refused.
. "$(dirname "$0")/lib.sh"

port=$(free_port)
for r in 1 2; do
    RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$WORKER" rendezvous \
        >"$T/out$r" 2>&1 & BG_PIDS+=($!)
done
sleep 0.2 # the others start first and must wait for rank 0's store
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$WORKER" rendezvous >"$T/out0" 2>&1 ||
    { cat "$T/out0"; fail "rank 0 failed"; }
for pid in "${BG_PIDS[@]}"; do wait "$pid" || fail "a by-hand rank failed"; done
BG_PIDS=()
for r in 0 1 2; do assert_contains "$T/out$r" "rendezvous ok: rank $r of 3"; done
assert_contains "$T/out0" "accepts any connection because DDP_STORE_TOKEN is not set"
ok "three ranks by hand meet in rank 0's store (with a warning about the open store)"

port=$(free_port)
DDP_STORE_TOKEN=s3cret RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$WORKER" rendezvous >"$T/t0" 2>&1 & BG_PIDS+=($!); r0=$!
rc=0
DDP_STORE_TOKEN=wrong RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$WORKER" rendezvous >"$T/t1" 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "a rank with the wrong token joined"
assert_contains "$T/t1" "refused our token"
DDP_STORE_TOKEN=s3cret RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$WORKER" rendezvous >"$T/t1" 2>&1 || { cat "$T/t1"; fail "rank 1 with the token failed"; }
wait $r0 || { cat "$T/t0"; fail "rank 0 failed"; }
BG_PIDS=()
assert_contains "$T/t0" "wrong store token"
ok "DDP_STORE_TOKEN by hand: the wrong token is refused and logged, the right one joins"

# Ranks started with different WORLD_SIZEs (a stale export on one node): both say so at once,
# in ddptrain's group set-up (before 2026-11-24 each waited out the set-up timeout, the larger
# world for a rank that never comes, the smaller for a barrier, neither naming WORLD_SIZE).
port=$(free_port)
t0=$(now_ms)
DDP_TIMEOUT=30 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$BIN/ddptrain" \
    --total_steps 1 --out_dir "$T/ws0" >"$T/w0" 2>&1 & BG_PIDS+=($!); r0=$!
rc=0
DDP_TIMEOUT=30 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$BIN/ddptrain" \
    --total_steps 1 --out_dir "$T/ws1" >"$T/w1" 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "rank 1 with WORLD_SIZE=3 beside 2 succeeded"
rc=0; wait $r0 || rc=$?
BG_PIDS=()
[ $rc -ne 0 ] || fail "rank 0 with WORLD_SIZE=2 beside 3 succeeded"
[ $(($(now_ms) - t0)) -lt 10000 ] || fail "mismatched WORLD_SIZEs took $(($(now_ms) - t0)) ms"
assert_contains "$T/w0" "rank 1 was started with WORLD_SIZE=3, this rank (0) with 2"
assert_contains "$T/w1" "rank 0 was started with WORLD_SIZE=2, this rank (1) with 3"
ok "ranks with different WORLD_SIZEs: both told at once, naming the sizes"

# A rank whose own set-up fails (a bad setting of its own here) says so in the store, and every
# other rank's set-up ends at once with its words, exit 86 (it stops because of another rank):
# over shm (waiting in the attach barrier) and tcp (waiting for rank 1's connection, and to
# connect to rank 0, which stopped listening). Until 2026-11-26 they waited out the whole set-up
# timeout (5 min by default), then said only that "the missing ranks may have failed".
for be in shm tcp; do
    port=$(free_port)
    bad=(DDP_SHM_ALGO=bogus)
    [ $be = tcp ] && bad=(DDP_LOCAL_ADDR=203.0.113.7) # TEST-NET: not an address of this host
    t0=$(now_ms)
    pids=()
    for r in 0 1 2; do
        extra=()
        [ $r = 1 ] && extra=("${bad[@]}")
        env DDP_TIMEOUT=60 DDP_BACKEND=$be RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port "${extra[@]}" "$BIN/ddptrain" --total_steps 1 \
            --out_dir "$T/sf_$be" >"$T/sf_$be.$r" 2>&1 &
        BG_PIDS+=($!)
        pids[$r]=$!
    done
    for r in 0 2; do
        rc=0; wait "${pids[$r]}" || rc=$?
        [ $rc -eq 86 ] || { cat "$T/sf_$be.$r"; fail "$be: rank $r exited $rc, not 86"; }
        assert_contains "$T/sf_$be.$r" "rank 1 failed while the group formed: "
    done
    rc=0; wait "${pids[1]}" || rc=$?
    [ $rc -eq 1 ] || { cat "$T/sf_$be.1"; fail "$be: rank 1 exited $rc, not 1"; }
    BG_PIDS=()
    took=$(($(now_ms) - t0))
    [ $took -lt 20000 ] || fail "$be: a failed set-up took $took ms to end the others"
    ok "$be: a rank failing its own set-up ends the others' at once ($took ms), in its words"
done
