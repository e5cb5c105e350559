#!/usr/bin/env bash
# The environment contract for 1, 2, 4 and 8 workers (8 is more than this machine's cores),
# arguments passed untouched, the thread defaults, and workers that really meet in the store.
. "$(dirname "$0")/lib.sh"

get() { sed -n "s/^$2=//p" "$1"; }
cores=$(nproc)

for n in 1 2 4 8; do
    d=$T/env$n
    mkdir -p "$d"
    "$DDPRUN" --standalone --nproc_per_node=$n "$WORKER" env "$d" --lr 3e-4 "two words" -x \
        >"$d/out" 2>"$d/err" || fail "ddprun with $n workers exited $?"
    [ "$(ls "$d"/env.* | wc -l)" -eq $n ] || fail "$n workers: expected $n env files"
    port=$(get "$d/env.0" MASTER_PORT)
    run=$(get "$d/env.0" DDP_RUN_ID)
    token=$(get "$d/env.0" DDP_STORE_TOKEN)
    [ ${#token} -ge 32 ] || fail "token '$token' is too short"
    [ -n "$run" ] && [ "$run" != "<unset>" ] || fail "no DDP_RUN_ID"
    threads=$((cores / n)); [ $threads -ge 1 ] || threads=1
    for ((r = 0; r < n; r++)); do
        f=$d/env.$r
        [ "$(get "$f" RANK)" = $r ] || fail "RANK in $f"
        [ "$(get "$f" LOCAL_RANK)" = $r ] || fail "LOCAL_RANK in $f"
        [ "$(get "$f" ROLE_RANK)" = $r ] || fail "ROLE_RANK in $f"
        [ "$(get "$f" WORLD_SIZE)" = $n ] || fail "WORLD_SIZE in $f"
        [ "$(get "$f" LOCAL_WORLD_SIZE)" = $n ] || fail "LOCAL_WORLD_SIZE in $f"
        [ "$(get "$f" GROUP_RANK)" = 0 ] || fail "GROUP_RANK in $f"
        [ "$(get "$f" MASTER_ADDR)" = 127.0.0.1 ] || fail "MASTER_ADDR in $f"
        [ "$(get "$f" MASTER_PORT)" = "$port" ] || fail "MASTER_PORT differs in $f"
        [ "$(get "$f" DDP_RUN_ID)" = "$run" ] || fail "DDP_RUN_ID differs in $f"
        [ "$(get "$f" TORCHELASTIC_RUN_ID)" = "$run" ] || fail "TORCHELASTIC_RUN_ID in $f"
        [ "$(get "$f" DDP_STORE_TOKEN)" = "$token" ] || fail "DDP_STORE_TOKEN differs in $f"
        [ "$(get "$f" DDP_RESTART_COUNT)" = 0 ] || fail "DDP_RESTART_COUNT in $f"
        [ "$(get "$f" DDP_MAX_RESTARTS)" = 0 ] || fail "DDP_MAX_RESTARTS in $f"
        [ "$(get "$f" DDP_AGENT_STORE)" = 1 ] || fail "DDP_AGENT_STORE in $f"
        [ "$(get "$f" OMP_NUM_THREADS)" = $threads ] || fail "OMP_NUM_THREADS in $f, want $threads"
        [ "$(get "$f" OPENBLAS_NUM_THREADS)" = $threads ] || fail "OPENBLAS_NUM_THREADS in $f"
        [ "$(get "$f" ARG0)" = --lr ] && [ "$(get "$f" ARG1)" = 3e-4 ] &&
            [ "$(get "$f" ARG2)" = "two words" ] && [ "$(get "$f" ARG3)" = -x ] ||
            fail "arguments not passed untouched in $f"
    done
    [ $n -eq 1 ] || assert_contains "$d/out" "[rank$((n - 1))]: env written by rank $((n - 1))"
    ok "$n workers: contract complete, port $port, run $run"

    # The same number of workers really meet through the store with their token.
    "$DDPRUN" --standalone --nproc_per_node=$n "$WORKER" rendezvous >"$d/rdzv" 2>&1 ||
        { cat "$d/rdzv"; fail "$n workers could not meet in the store"; }
    [ "$(grep -c "rendezvous ok" "$d/rdzv")" -eq $n ] || fail "$n workers: not all met"
    ok "$n workers met in the store"
done

# A user's own thread settings win.
d=$T/threads; mkdir -p "$d"
OMP_NUM_THREADS=7 "$DDPRUN" --standalone --nproc-per-node 2 "$WORKER" env "$d" >/dev/null 2>&1
[ "$(get "$d/env.1" OMP_NUM_THREADS)" = 7 ] || fail "OMP_NUM_THREADS=7 was overridden"
ok "OMP_NUM_THREADS set by the user is kept; --nproc-per-node spelling works"

# Inherited contract variables are replaced, not duplicated.
d=$T/inherit; mkdir -p "$d"
RANK=9 WORLD_SIZE=99 "$DDPRUN" --standalone --nproc_per_node 2 "$WORKER" env "$d" >/dev/null 2>&1
[ "$(get "$d/env.1" WORLD_SIZE)" = 2 ] || fail "inherited WORLD_SIZE leaked into workers"
ok "inherited RANK/WORLD_SIZE replaced"

# Without ddprun: a world of one.
(cd "$T" && "$HELLO" >"$T/alone" 2>&1) || fail "hello_world alone failed"
assert_contains "$T/alone" "hello from 1 ranks"
ok "a program without ddprun is a world of one"
