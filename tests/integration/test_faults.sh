#!/usr/bin/env bash
# The process group under faults, ranks started by hand (rank 0 hosts the store): a rank killed
# mid-collective, a rank stopped with SIGSTOP, and mismatched collectives under DDP_DEBUG=1; and
# while a stopped rank holds the others up, they say so at doubling intervals, naming it.
# Every surviving rank must return an error naming the operation, its sequence number and the
# missing rank within the timeout plus 5 s; later calls report the same (poisoned) error.
# Usage: test_faults.sh BINDIR [BACKEND]
. "$(dirname "$0")/lib.sh"
FAULT=$BIN/faultcheck
# The collectives' deadline (FAULT_TIMEOUT: faultcheck sets it once the group is up) is 3 s where
# a timeout is what is tested, 20 s elsewhere: there a failure must be seen "at once" (within the
# limit check_survivor is given), and a healthy rank descheduled for 3 s on a busy host would let a
# timeout race the failure under test. Set-up waits DDP_TIMEOUT, 60 s: with DDP_TIMEOUT=3 a rank
# started 3 s after the others (a busy host, a sanitizer build's start-up) failed set-up.
export DDP_BACKEND=${2:-shm} DDP_TIMEOUT=60 FAULT_TIMEOUT=20
export FAULT_DIR=$T

start_ranks() { # start_ranks MODE: 3 ranks in the background, pids in RANK_PIDS
    local port
    port=$(free_port)
    RANK_PIDS=()
    for r in 0 1 2; do
        RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$FAULT" "$1" \
            >"$T/out.$r" 2>&1 &
        RANK_PIDS+=($!)
        BG_PIDS+=($!)
    done
}

wait_progress() { # all ranks past iteration 3
    for _ in $(seq 400); do
        local ok=1
        for r in 0 1 2; do
            [ "$(cat "$T/progress.$r" 2>/dev/null || echo 0)" -ge 3 ] || ok=0
        done
        [ $ok = 1 ] && return 0
        sleep 0.05
    done
    fail "ranks made no progress"
}

check_survivor() { # check_survivor RANK LIMIT_MS TEXT...
    local r=$1 limit=$2 rc=0
    shift 2
    wait "${RANK_PIDS[$r]}" || rc=$?
    [ $rc -eq 3 ] || { cat "$T/out.$r"; fail "rank $r exited $rc, want 3 (a reported error)"; }
    for text in "$@"; do assert_contains "$T/out.$r" "$text"; done
    local ms
    ms=$(sed -n "s/^rank $r failed after \([0-9]*\) ms.*/\1/p" "$T/out.$r")
    [ "$ms" -le "$limit" ] || fail "rank $r took $ms ms to report, limit $limit"
    assert_contains "$T/out.$r" "rank $r later call:"
    # Poisoned: the later call reports the first error again.
    first=$(sed -n "s/^rank $r error: //p" "$T/out.$r")
    assert_contains "$T/out.$r" "$first"
}

# 1. A rank killed mid-collective: the others see it die (pidfd / lost connection), fast.
start_ranks loop
wait_progress
kill -KILL "${RANK_PIDS[1]}"
for r in 0 2; do check_survivor $r 8000 "allreduce #" "rank 1" "rank $r peer failed: yes"; done
ok "$DDP_BACKEND: a rank killed mid-collective: the others report it (rank 1) quickly, as another rank's failure"

# 2. A stopped rank (SIGSTOP): the others time out after FAULT_TIMEOUT=3 s, naming it.
rm -f "$T"/progress.*
FAULT_TIMEOUT=3 start_ranks loop
wait_progress
kill -STOP "${RANK_PIDS[1]}"
for r in 0 2; do check_survivor $r 8000 "timed out" "allreduce #" "rank 1"; done
kill -KILL "${RANK_PIDS[1]}"
# Someone's own deadline passed: at least one survivor reports the timeout as its own failure
# (over tcp the other may have it from that one's notice first).
grep -q "peer failed: no" "$T/out.0" "$T/out.2" || fail "every survivor blames another rank for its timeout"
ok "$DDP_BACKEND: a stopped rank: the others time out within 3 s + 5 s, naming rank 1"

# 3. Mismatched collectives with DDP_DEBUG=1: an error listing the difference, not a hang.
DDP_DEBUG=1 start_ranks mismatch
for r in 0 1 2; do
    check_survivor $r 8000 "does not match across ranks" "rank 0: allreduce float32 × 1000 sum" \
        "rank 1: broadcast float32 × 1000 root 0"
done
ok "$DDP_BACKEND: DDP_DEBUG=1 reports mismatched collectives on every rank"

# 3a. Without DDP_DEBUG too: counts that differ (rank 0: 4 floats, the others 100000) and
# collectives that differ fail on every rank, naming both, instead of rank 0 reading past its
# buffer (shm returned OK with garbage until 2026-11-24; tcp's headers always caught it).
start_ranks counts
for r in 0 1 2; do
    check_survivor $r 8000 "collectives differ across ranks" "allreduce #1 (float32 × 4, sum)" \
        "allreduce #1 (float32 × 100000, sum)"
done
start_ranks mismatch
for r in 0 1 2; do
    check_survivor $r 8000 "collectives differ across ranks" "allreduce #1 (float32 × 1000, sum)" \
        "broadcast #1 (float32 × 1000, root"
done
ok "$DDP_BACKEND: collectives or counts that differ fail on every rank without DDP_DEBUG"

# 3b. A rank aborts the group (ddp_group_abort): the others fail at once with its message, as
# another rank's failure (ddp_group_peer_failed, which a program turns into exit code 86); the
# aborting rank's own failure is its own.
rm -f "$T"/progress.*
start_ranks abort
for r in 0 2; do check_survivor $r 8000 "rank 1 aborted the group" "rank $r peer failed: yes"; done
check_survivor 1 8000 "aborted on this rank" "rank 1 peer failed: no"
ok "$DDP_BACKEND: a rank that aborts the group: the others fail at once, blaming it"

# 4. A stopped rank, reported while it happens: with DDP_STALL_REPORT=1 the waiting ranks print a
# line naming rank 1 after 1 s, then 2 s later (3 s in all), and carry on when it continues.
# Only the lines after the stop count: under load (TSan, four tests on two cores) a rank can be
# slow enough for a 1 s report before it.
rm -f "$T"/progress.*
FAULT_TIMEOUT=60 DDP_STALL_REPORT=1 start_ranks loop
wait_progress
declare -A seen
for r in 0 2; do seen[$r]=$(wc -l <"$T/out.$r"); done
kill -STOP "${RANK_PIDS[1]}"
since_stop() { tail -n +$((seen[$1] + 1)) "$T/out.$1"; }
# Until both waiting ranks have printed their 3 s report (the reports carry their own times; a
# fixed sleep of 4.5 s failed when a rank began to wait, or printed, late under load).
for _ in $(seq 600); do
    since_stop 0 | grep -q "has waited 3 s" && since_stop 2 | grep -q "has waited 3 s" && break
    sleep 0.05
done
before=$(cat "$T/progress.0")
kill -CONT "${RANK_PIDS[1]}"
# shm sees every rank's arrival; over tcp a rank sees its ring neighbour, so the rank after the
# stopped one (2) names it and rank 0 names the neighbour it waits on (2).
for r in 0 2; do
    who="rank 1"
    [ "$DDP_BACKEND" = tcp ] && [ $r = 0 ] && who="rank 2"
    since_stop $r >"$T/stall.$r"
    assert_contains "$T/stall.$r" "ddp: rank $r: allreduce #"
    grep -q "has waited 1 s in $DDP_BACKEND: .*$who.*still waiting (times out in 59 s)" \
        "$T/stall.$r" || { cat "$T/out.$r"; fail "rank $r: no 1 s report naming $who"; }
    grep -q "has waited 3 s in $DDP_BACKEND: .*$who" "$T/stall.$r" ||
        { cat "$T/out.$r"; fail "rank $r: no report at 3 s"; }
    n=$(grep -c "has waited" "$T/stall.$r")
    [ "$n" -ge 2 ] && [ "$n" -le 3 ] ||
        { cat "$T/out.$r"; fail "rank $r: $n reports by the 3 s one, want 2 (1 s, 3 s) or 3 (7 s with a late start)"; }
done
for _ in $(seq 200); do [ "$(cat "$T/progress.0")" -gt "$before" ] && break; sleep 0.05; done
[ "$(cat "$T/progress.0")" -gt "$before" ] || fail "the ranks did not carry on after SIGCONT"
for p in "${RANK_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
ok "$DDP_BACKEND: a stopped rank is reported while it happens (after 1 s, then 3 s), naming rank 1; the job carries on after SIGCONT"

# 5. A late rank: the others time out in a small allreduce it had not reached, and abort the
# group; when it arrives (after 5 s) its allreduce fails too, naming the abort, instead of
# returning ok because every peer had arrived before giving up (shm did, for small messages).
FAULT_TIMEOUT=3 FAULT_COUNT=1000 start_ranks late
for r in 0 1; do check_survivor $r 8000 "timed out" "allreduce #1" "rank 2"; done
check_survivor 2 8000 "allreduce #1"
[ "$DDP_BACKEND" != shm ] || assert_contains "$T/out.2" "aborted the group"
ok "$DDP_BACKEND: a rank arriving after the others timed out and aborted fails too"

# 5b. The same when the others do not abort: their timeout ends the group for it anyway (tcp's
# notice, shm's abort at the timeout).
FAULT_TIMEOUT=3 FAULT_NO_ABORT=1 FAULT_COUNT=1000 start_ranks late
for r in 0 1; do check_survivor $r 8000 "timed out" "allreduce #1" "rank 2"; done
check_survivor 2 8000 "allreduce #1" "rank 2 peer failed: yes"
ok "$DDP_BACKEND: a rank arriving after the others timed out fails, blaming them, without an abort"

# 5b'. The same in a barrier: the message names a barrier, not "barrier #1 (uint8 × 0)" as shm's
# did before 2026-11-25.
FAULT_TIMEOUT=3 FAULT_BARRIER=1 start_ranks late
for r in 0 1; do check_survivor $r 8000 "barrier #1 timed out" "rank 2"; done
check_survivor 2 8000 "barrier #1"
for r in 0 1 2; do assert_not_contains "$T/out.$r" "× 0)"; done
ok "$DDP_BACKEND: a barrier that times out is named as a barrier"

# 5c. A rank that destroyed its group while the others still call a collective (a program that
# calls fewer collectives on one rank), its process alive: they fail at once, naming it. (5c–5e:
# "at once" is within 5 s; 3 s until 2026-11-25, the deadline itself then.)
start_ranks left
for r in 0 2; do check_survivor $r 5000 "allreduce #1" "rank 1" "rank $r peer failed: yes"; done
[ "$DDP_BACKEND" != shm ] || assert_contains "$T/out.0" "rank 1 left the group"
kill -KILL "${RANK_PIDS[1]}" 2>/dev/null || true
wait "${RANK_PIDS[1]}" 2>/dev/null || true
ok "$DDP_BACKEND: a rank that left the group: the others fail at once, naming it"

# 5d. The same when that rank has exited since (a program whose rank 1 returned early, cleaning
# up): over shm the others said "rank 1 (pid …) died before arriving", as if it had crashed, and
# over tcp "it probably died" (tcp cannot tell a closed connection from a death: it names both).
start_ranks gone
for r in 0 2; do check_survivor $r 5000 "allreduce #1" "rank 1" "rank $r peer failed: yes"; done
assert_contains "$T/out.0" "left the group"
[ "$DDP_BACKEND" != shm ] || assert_not_contains "$T/out.0" "died"
wait "${RANK_PIDS[1]}" 2>/dev/null || true
ok "$DDP_BACKEND: a rank that left the group and exited: the others say it left, not that it died"

# 5e. A rank that returns early without destroying its group: over shm the others said it "died"
# (it exited 4, cleanly), and a reader looked for a crash.
start_ranks quit
for r in 0 2; do check_survivor $r 5000 "allreduce #1" "rank 1" "rank $r peer failed: yes"; done
[ "$DDP_BACKEND" != shm ] || assert_contains "$T/out.0" "exited or died before arriving"
wait "${RANK_PIDS[1]}" 2>/dev/null || true
ok "$DDP_BACKEND: a rank that exited without leaving the group: the others say it exited or died"

# 6. Over tcp, the same deaths with small allreduces (1000 floats: the small-message algorithm).
if [ "$DDP_BACKEND" = tcp ]; then
    rm -f "$T"/progress.*
    FAULT_COUNT=1000 start_ranks loop
    wait_progress
    kill -KILL "${RANK_PIDS[1]}"
    for r in 0 2; do check_survivor $r 8000 "allreduce #" "rank 1"; done
    rm -f "$T"/progress.*
    FAULT_TIMEOUT=3 FAULT_COUNT=1000 start_ranks loop
    wait_progress
    kill -STOP "${RANK_PIDS[1]}"
    for r in 0 2; do check_survivor $r 8000 "timed out" "allreduce #" "rank 1"; done
    kill -KILL "${RANK_PIDS[1]}"
    ok "tcp, small allreduces: a killed rank and a stopped one are reported as with large ones"
fi

# 6. shm+tcp, 4 ranks on two hosts (DDP_HOST_ID A A B B): rank 3 killed. Its host's leader
# (rank 2) sees it die in shm; the other host learns it over tcp, and its leader (rank 0) aborts
# its host's shm with that error, so that rank 1 fails at once too; every survivor blames
# another rank.
if [ "$DDP_BACKEND" = tcp ]; then
    rm -f "$T"/progress.* "$T"/out.*
    port=$(free_port)
    RANK_PIDS=()
    hosts=(A A B B)
    for r in 0 1 2 3; do
        DDP_BACKEND=shm+tcp DDP_HOST_ID=${hosts[$r]} RANK=$r LOCAL_RANK=$((r % 2)) \
            LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$FAULT" loop >"$T/out.$r" 2>&1 &
        RANK_PIDS+=($!)
        BG_PIDS+=($!)
    done
    wait_progress
    kill -KILL "${RANK_PIDS[3]}"
    for r in 0 1 2; do check_survivor $r 8000 "rank 3" "rank $r peer failed: yes"; done
    wait "${RANK_PIDS[3]}" 2>/dev/null || true
    ok "shm+tcp on two hosts: a killed rank fails every survivor on both hosts at once, blaming another rank"
fi
