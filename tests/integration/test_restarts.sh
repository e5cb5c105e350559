#!/usr/bin/env bash
# --max_restarts: the whole group restarts with DDP_RESTART_COUNT rising; when restarts run out,
# ddprun gives up with the summary.
. "$(dirname "$0")/lib.sh"

# Rank 1 starts 1 s late: rank 0 still fails only once rank 1 has recorded its attempt.
d=$T/ok; mkdir -p "$d"; late_start "$d" 1 1
"$DDPRUN" --standalone --nproc_per_node=2 --max_restarts 2 "$d/late.sh" "$WORKER" restart 2 "$d" \
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

# A rank that fails before it makes its group while another has made one: the restarted ranks
# must meet in one group. Before 2026-11-25 libddp numbered each rank's groups across attempts in
# ddprun's store, so rank 0 of attempt 1 set up group 2 and rank 1 group 1, and both hung until
# the set-up timeout (minutes).
d=$T/early; mkdir -p "$d"
cat >"$d/w.sh" <<EOF
#!/bin/sh
if [ "\$DDP_RESTART_COUNT" = 0 ] && [ "\$RANK" = 1 ]; then sleep 1; exit 3; fi
exec "$WORKER" elastic "$d" 2
EOF
chmod +x "$d/w.sh"
rc=0
timeout 60 "$DDPRUN" --standalone --nproc_per_node=2 --max_restarts 1 "$d/w.sh" >"$d/out" \
    2>"$d/err" || rc=$?
[ $rc -eq 0 ] || { cat "$d/err"; fail "ddprun exited $rc, want 0 (the restart's group set up)"; }
for r in 0 1; do assert_contains "$d/elastic.log" "restart=1 rank=$r world=2"; done
assert_contains "$d/elastic.log" "sum=2"
wait_gone "$d" 5
ok "a rank failed before making its group: the restarted ranks meet in one group"
