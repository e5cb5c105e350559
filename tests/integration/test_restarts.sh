#!/usr/bin/env bash
# --max_restarts: the whole group restarts with DDP_RESTART_COUNT rising; when restarts run out,
# ddprun gives up with the summary.
. "$(dirname "$0")/lib.sh"

d=$T/ok; mkdir -p "$d"
"$DDPRUN" --standalone --nproc_per_node=2 --max_restarts 2 "$WORKER" restart 2 "$d" \
    >"$d/out" 2>"$d/err" || { cat "$d/err"; fail "ddprun should succeed on the third attempt"; }
for a in 0 1 2; do
    assert_contains "$d/attempts" "attempt=$a rank=0 world=2"
    assert_contains "$d/attempts" "attempt=$a rank=1 world=2"
done
[ "$(grep -c "restarting the whole group" "$d/err")" -eq 2 ] || fail "expected two restarts"
assert_contains "$d/err" "attempt : 1 of 3 (--max_restarts 2)"
assert_contains "$d/err" "attempt : 2 of 3 (--max_restarts 2)"
ok "two failures, two restarts, third attempt succeeds"

d=$T/giveup; mkdir -p "$d"
rc=0
"$DDPRUN" --standalone --nproc_per_node=2 --max_restarts 1 "$WORKER" restart 5 "$d" \
    >"$d/out" 2>"$d/err" || rc=$?
[ $rc -eq 1 ] || fail "ddprun exited $rc, want 1"
[ "$(grep -c "attempt=" "$d/attempts")" -eq 4 ] || fail "expected 2 attempts × 2 ranks"
assert_contains "$d/err" "attempt : 2 of 2 (--max_restarts 1)"
assert_contains "$d/err" "every other worker was stopped"
ok "restarts exhausted: ddprun gives up with exit 1"
