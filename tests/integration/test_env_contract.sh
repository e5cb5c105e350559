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
    port=$(get "$d/env.0" DDP_STORE_PORT)
    mport=$(get "$d/env.0" MASTER_PORT) # left free for a program's own store (PyTorch's)
    [ -n "$port" ] && [ -n "$mport" ] && [ "$mport" != "$port" ] ||
        fail "MASTER_PORT '$mport' must be a port apart from the store's '$port'"
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
        [ "$(get "$f" MASTER_PORT)" = "$mport" ] || fail "MASTER_PORT differs in $f"
        [ "$(get "$f" DDP_STORE_PORT)" = "$port" ] || fail "DDP_STORE_PORT differs in $f"
        [ "$(get "$f" TORCHELASTIC_USE_AGENT_STORE)" = False ] || fail "TORCHELASTIC_USE_AGENT_STORE in $f"
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

# torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 for PyTorch's NCCL groups, unless the user set it
"$DDPRUN" --standalone env >"$T/envout" 2>/dev/null || fail "ddprun env exited $?"
grep -qx "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" "$T/envout" || fail "TORCH_NCCL_ASYNC_ERROR_HANDLING not 1"
TORCH_NCCL_ASYNC_ERROR_HANDLING=0 "$DDPRUN" --standalone env >"$T/envout" 2>/dev/null ||
    fail "ddprun env exited $?"
grep -qx "TORCH_NCCL_ASYNC_ERROR_HANDLING=0" "$T/envout" || fail "the user's TORCH_NCCL_ASYNC_ERROR_HANDLING=0 lost"
ok "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 as torchrun sets it; a user's value kept"

# Pinning (--bind_to auto): with no more workers than cores, each worker gets its own block of the
# cores ddprun may use, in order; with more, or with --bind_to none (the default), every worker
# gets them all.
mine=$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)
all=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
IFS=, read -ra list <<<"$all"
for n in 1 2 4 8; do
    for bind in auto none; do
        d=$T/bind$n$bind; mkdir -p "$d"
        "$DDPRUN" --standalone --nproc_per_node=$n --bind_to $bind "$WORKER" env "$d" \
            >/dev/null 2>"$d/err" || fail "--bind_to $bind, $n workers: exit $?"
        per=$((${#list[@]} / n))
        for ((r = 0; r < n; r++)); do
            want=$all
            if [ $bind = auto ] && [ $per -ge 1 ]; then
                want=$(IFS=,; echo "${list[*]:r*per:per}")
            fi
            got=$(get "$d/env.$r" CPUS)
            [ "$got" = "$want" ] || fail "--bind_to $bind, $n workers: rank $r on '$got', want '$want' (cpus $mine)"
            # The cores the node's workers share, as ddprun saw them before pinning any.
            [ "$(get "$d/env.$r" DDP_HOST_CORES)" = ${#list[@]} ] ||
                fail "DDP_HOST_CORES in rank $r: '$(get "$d/env.$r" DDP_HOST_CORES)', want ${#list[@]}"
        done
    done
    ok "$n workers: pinned to their own cores when they fit, else free; --bind_to none leaves them free"
done
grep -q "pinned, $((${#list[@]} / 2)) core" "$T/bind2auto/err" || fail "the start line does not say the workers are pinned"
[ "$(get "$T/env2/env.1" CPUS)" = "$all" ] || fail "workers are pinned without --bind_to (torchrun does not pin)"
if "$DDPRUN" --standalone --nproc_per_node=$((${#list[@]} + 1)) --bind_to core "$WORKER" env "$T" \
    >/dev/null 2>"$T/bindcore"; then fail "--bind_to core with more workers than cores ran"; fi
assert_contains "$T/bindcore" "--bind_to core: $((${#list[@]} + 1)) workers but ${#list[@]} cores available"
if command -v taskset >/dev/null; then # the cores ddprun was given are the ones shared out
    d=$T/bindset; mkdir -p "$d"
    taskset -c "${list[-1]}" "$DDPRUN" --standalone --nproc_per_node=1 "$WORKER" env "$d" >/dev/null 2>&1 ||
        fail "ddprun under taskset failed"
    [ "$(get "$d/env.0" CPUS)" = "${list[-1]}" ] || fail "a worker left the cores ddprun was given"
fi
ok "--bind_to core refuses more workers than cores; workers stay within ddprun's own cores"

# A user's own thread settings win.
d=$T/threads; mkdir -p "$d"
OMP_NUM_THREADS=7 "$DDPRUN" --standalone --nproc-per-node 2 "$WORKER" env "$d" >/dev/null 2>&1
[ "$(get "$d/env.1" OMP_NUM_THREADS)" = 7 ] || fail "OMP_NUM_THREADS=7 was overridden"
# OpenBLAS falls back to OMP_NUM_THREADS when its own variable is unset: the user's 7 must reach
# it, not the cores / workers default.
[ "$(get "$d/env.1" OPENBLAS_NUM_THREADS)" = 7 ] ||
    fail "OMP_NUM_THREADS=7 but OPENBLAS_NUM_THREADS=$(get "$d/env.1" OPENBLAS_NUM_THREADS)"
d=$T/threads2; mkdir -p "$d"
OMP_NUM_THREADS=7 OPENBLAS_NUM_THREADS=3 "$DDPRUN" --standalone --nproc-per-node 2 "$WORKER" \
    env "$d" >/dev/null 2>&1
[ "$(get "$d/env.0" OPENBLAS_NUM_THREADS)" = 3 ] || fail "OPENBLAS_NUM_THREADS=3 was overridden"
ok "OMP_NUM_THREADS set by the user is kept, for OpenBLAS too; --nproc-per-node spelling works"

# Inherited contract variables are replaced, not duplicated.
d=$T/inherit; mkdir -p "$d"
RANK=9 WORLD_SIZE=99 "$DDPRUN" --standalone --nproc_per_node 2 "$WORKER" env "$d" >/dev/null 2>&1
[ "$(get "$d/env.1" WORLD_SIZE)" = 2 ] || fail "inherited WORLD_SIZE leaked into workers"
ok "inherited RANK/WORLD_SIZE replaced"

# Without ddprun: a world of one.
(cd "$T" && "$HELLO" >"$T/alone" 2>&1) || fail "hello_world alone failed"
assert_contains "$T/alone" "hello from 1 rank (run"
ok "a program without ddprun is a world of one"

# MASTER_PORT stays reserved for the attempt: a bind without SO_REUSEADDR (anyone else) is
# refused, while a program binding it as torch's TCPStore does (SO_REUSEADDR) listens there.
cat >"$T/hold.py" <<'PY'
import os, socket, sys
p = int(os.environ["MASTER_PORT"])
try:
    socket.socket().bind(("0.0.0.0", p))
    sys.exit("a plain bind took MASTER_PORT %d: it is not held" % p)
except OSError:
    pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", p))
s.listen(1)
c = socket.create_connection(("127.0.0.1", p), timeout=5)
a, _ = s.accept()
c.close()  # the client closes first, so the TIME_WAIT is on its port, not on MASTER_PORT
a.settimeout(5)
a.recv(1)
a.close()
print("held port %d served" % p)
PY
"$DDPRUN" --standalone python3 "$T/hold.py" >"$T/hold" 2>&1 || { cat "$T/hold"; fail "MASTER_PORT hold"; }
hp=$(sed -n 's/.*held port \([0-9]*\) served.*/\1/p' "$T/hold")
[ -n "$hp" ] || { cat "$T/hold"; fail "no port reported"; }
python3 -c "import socket; socket.socket().bind(('0.0.0.0', $hp))" ||
    fail "MASTER_PORT $hp still held after ddprun exited"
ok "MASTER_PORT held against other binds for the attempt, served by a SO_REUSEADDR listener, freed at exit"
