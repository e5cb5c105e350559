#!/usr/bin/env bash
# A taken port fails at once with a message that names it and says what to do; --standalone
# sidesteps it.
. "$(dirname "$0")/lib.sh"

"$WORKER" hold-port 0 30 >"$T/holder" & BG_PIDS+=($!); holder=$!
for _ in $(seq 100); do grep -q holding "$T/holder" 2>/dev/null && break; sleep 0.05; done
port=$(sed -n 's/holding //p' "$T/holder")
[ -n "$port" ] || fail "could not hold a port"

rc=0
t0=$(now_ms)
"$DDPRUN" --master_port "$port" --nproc_per_node 2 "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || fail "ddprun on a taken port exited $rc, want 1"
[ $(($(now_ms) - t0)) -lt 3000 ] || fail "a taken port should fail at once"
assert_contains "$T/err" "cannot listen on '127.0.0.1:$port': address already in use (errno 98)"
assert_contains "$T/err" "--master_port"
assert_contains "$T/err" "--standalone"
[ ! -e "$T/env.0" ] || fail "workers started although the store could not"
ok "port $port in use: clear error, no worker started"

"$DDPRUN" --standalone --nproc_per_node 2 "$WORKER" env "$T" >"$T/out" 2>"$T/err" ||
    fail "--standalone failed while port $port is taken"
[ "$(sed -n 's/^DDP_STORE_PORT=//p' "$T/env.0")" != "$port" ] || fail "--standalone used $port"
ok "--standalone picks a free port"

# A program started by hand (RANK/WORLD_SIZE/MASTER_*) whose rank 0 cannot host the store.
rc=0
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$HELLO" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -ne 0 ] || fail "rank 0 on a taken port should fail"
assert_contains "$T/err" "address already in use"
assert_contains "$T/err" "address already in use (errno 98); another job or program holds this port: rank 0 hosts the store on MASTER_PORT (started by hand): give every rank another free MASTER_PORT"
assert_not_contains "$T/err" "ddprun --master_port"
ok "by-hand rank 0 on a taken port: clear error, naming MASTER_PORT (not ddprun's flags alone)"
kill $holder
wait $holder 2>/dev/null || true # gone before the leftover check
