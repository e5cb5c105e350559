#!/usr/bin/env bash
# Output: rank prefixes on a shared console, per-rank log files (torchrun's layout), --redirects,
# --tee, --no_prefix, and the command line itself (help, spellings, errors).
. "$(dirname "$0")/lib.sh"

"$DDPRUN" --standalone --nproc_per_node 3 "$WORKER" env "$T/x" >"$T/out" 2>"$T/err" || true
mkdir -p "$T/x"
"$DDPRUN" --standalone --nproc_per_node 3 "$WORKER" env "$T/x" >"$T/out" 2>"$T/err"
for r in 0 1 2; do assert_contains "$T/out" "[rank$r]: env written by rank $r"; done
ok "console lines carry their rank"

"$DDPRUN" --standalone --nproc_per_node 2 --no_prefix "$WORKER" env "$T/x" >"$T/out" 2>"$T/err"
assert_contains "$T/out" "env written by rank 1"
assert_not_contains "$T/out" "[rank"
ok "--no_prefix"

d=$T/logs
"$DDPRUN" --standalone --nproc_per_node 2 --log_dir "$d" --run_id myjob "$WORKER" env "$T/x" \
    >"$T/out" 2>"$T/err"
for r in 0 1; do
    assert_contains "$d/myjob/attempt_0/$r/stdout.log" "env written by rank $r"
    [ -f "$d/myjob/attempt_0/$r/stderr.log" ] || fail "no stderr.log for rank $r"
done
assert_contains "$T/out" "[rank1]: env written by rank 1"
ok "--log_dir: DIR/RUN_ID/attempt_K/LOCAL_RANK/{stdout,stderr}.log, and the console too"

echo "first run's line" >>"$d/myjob/attempt_0/0/stdout.log"
"$DDPRUN" --standalone --nproc_per_node 1 --log_dir "$d" --run_id myjob "$WORKER" env "$T/x" \
    >"$T/out" 2>"$T/err"
assert_contains "$d/myjob/attempt_0/0/stdout.log" "first run's line"
assert_contains "$d/myjob-2/attempt_0/0/stdout.log" "env written by rank 0"
assert_contains "$T/err" "'$d/myjob' holds an earlier run's logs; this run's go to '$d/myjob-2'"
assert_contains "$T/err" "logs in $d/myjob-2"
"$DDPRUN" --standalone --nproc_per_node 1 --log_dir "$d" --run_id myjob true >"$T/out" 2>"$T/err"
[ -d "$d/myjob-3/attempt_0/0" ] || fail "a third run with the same run id: no myjob-3"
ok "a rerun with the same --run_id and --log_dir keeps the earlier run's logs (RUN_ID-2, -3)"

"$DDPRUN" --standalone --nproc_per_node 2 --log_dir "$d" --run_id r2 --redirects 1 \
    "$WORKER" env "$T/x" >"$T/out" 2>"$T/err"
assert_not_contains "$T/out" "env written"
assert_contains "$d/r2/attempt_0/1/stdout.log" "env written by rank 1"
"$DDPRUN" --standalone --nproc_per_node 2 --log_dir "$d" --run_id r3 --redirects 0:1,1:0 \
    "$WORKER" env "$T/x" >"$T/out" 2>"$T/err"
assert_not_contains "$T/out" "env written by rank 0"
assert_contains "$T/out" "[rank1]: env written by rank 1"
"$DDPRUN" --standalone --nproc_per_node 2 --log_dir "$d" --run_id r4 --redirects 3 --tee 1 \
    "$WORKER" env "$T/x" >"$T/out" 2>"$T/err"
assert_contains "$T/out" "[rank0]: env written by rank 0"
assert_contains "$d/r4/attempt_0/0/stdout.log" "env written by rank 0"
ok "--redirects (all and per rank) and --tee"

# The command line.
"$DDPRUN" --help >"$T/help"
for flag in --nproc_per_node --nnodes --node_rank --master_addr --master_port --standalone \
    --max_restarts --redirects --tee --log_dir --run_id; do
    assert_contains "$T/help" "$flag"
done
rc=0; "$DDPRUN" --bogus x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "unknown flag: exit $rc, want 2"
assert_contains "$T/err" "unknown flag '--bogus'"
rc=0; "$DDPRUN" --nproc_per_node=zero x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains "$T/err" "--nproc_per_node 'zero'"
rc=0; "$DDPRUN" --nnodes 2 --node_rank 2 x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains "$T/err" "--node_rank 2 is not below --nnodes 2"
rc=0; "$DDPRUN" --nnodes 1:4 x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains "$T/err" "--nnodes 1:4: an elastic range needs --rdzv_backend c10d"
rc=0; "$DDPRUN" --standalone >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains "$T/err" "no program to run"
for id in . ..; do # a run id of '.' or '..' would put the logs beside or above --log_dir's runs
    rc=0; "$DDPRUN" --log_dir "$T/logs" --run_id "$id" true >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "--run_id $id: exit code $rc, expected 2"
    assert_contains "$T/err" "outside --log_dir"
done
# Flags after the program belong to the program.
"$DDPRUN" --standalone --nproc-per-node=2 "$WORKER" env "$T/x" --nproc_per_node 5 >/dev/null 2>&1
[ "$(sed -n 's/^ARG0=//p' "$T/x/env.0")" = --nproc_per_node ] || fail "program flags were eaten"
[ "$(sed -n 's/^WORLD_SIZE=//p' "$T/x/env.0")" = 2 ] || fail "wrong world size"
"$DDPRUN" --nproc_per_node cpu --standalone "$WORKER" env "$T/x" >/dev/null 2>&1
[ "$(sed -n 's/^WORLD_SIZE=//p' "$T/x/env.0")" = "$(nproc)" ] || fail "--nproc_per_node cpu"
ok "help, both spellings, cpu, usage errors exit 2, program flags untouched"

# --redirects / --tee without --log_dir: a fresh directory under $TMPDIR, named at start.
rc=0
TMPDIR=$T "$DDPRUN" --standalone --nproc_per_node 2 --redirects 3 "$WORKER" env "$T/x" \
    >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 0 ] || fail "--redirects without --log_dir exited $rc"
logdir=$(sed -n 's/.*logs in \([^ ,]*\).*/\1/p' "$T/err")
case "$logdir" in "$T"/ddprun_*) ;; *) cat "$T/err"; fail "no temporary log dir announced" ;; esac
assert_contains "$logdir/attempt_0/1/stdout.log" "env written by rank 1"
ok "--redirects without --log_dir writes to a fresh temporary directory"

rc=0; "$DDPRUN" --nnodes 2 --monitor_interval 2 --agent_timeout 2 x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "exit code $rc, expected: $rc -eq 2"
assert_contains "$T/err" "--agent_timeout 2 s must be at least 3 × --monitor_interval"
ok "--agent_timeout below 3 × --monitor_interval is refused"

# A console that stops reading (a pager left scrolled, a stuck tee: here a pipe into sleep)
# never holds ddprun up: rank 1's failure is handled, every worker stopped, and ddprun ends
# within its 5 s of waiting for the console at the end, saying on stderr (a file here) how much
# was lost. Until 2026-11-26 ddprun blocked in write() for as long as the reader did not read,
# handling no signal and no worker's death. Rank 0 writes 6 MB: past the 4 MiB queue, after
# which its pipe waits (backpressure) until it is stopped.
rm -f "$T/stuck.rc"
(
    rc=0
    "$DDPRUN" --standalone --nproc_per_node 2 bash -c 'if [ "$RANK" = 1 ]; then sleep 1; exit 3; fi
        head -c 6000000 /dev/zero | tr "\0" y | fold -w 60; sleep 100' 2>"$T/stuck.err" || rc=$?
    echo $rc >"$T/stuck.rc"
) | sleep 40 &
reader=$!
BG_PIDS+=($reader)
for _ in $(seq 300); do [ -s "$T/stuck.rc" ] && break; sleep 0.1; done
[ -s "$T/stuck.rc" ] || { cat "$T/stuck.err"; fail "ddprun did not end within 30 s of a console that stopped reading"; }
[ "$(cat "$T/stuck.rc")" = 1 ] || { cat "$T/stuck.err"; fail "ddprun exited $(cat "$T/stuck.rc"), not 1"; }
assert_contains "$T/stuck.err" "worker failed: rank 1"
assert_contains "$T/stuck.err" "ddprun: the console (stdout) did not read for a while:"
pkill -P $reader sleep 2>/dev/null || true
kill $reader 2>/dev/null || true
wait $reader 2>/dev/null || true
ok "a console that stops reading: the job's failure handled, ddprun ends, the lost output said"

# A console that reads late (here: not for 1.5 s, then at full speed) loses nothing: past 4 MiB
# waiting, the workers' pipes wait instead (until 2026-11-26's first version of the queue,
# lines past it were dropped). stdout and stderr on one pipe (2>&1) share one queue, so a line
# ddprun says meanwhile (SIGUSR1 passed on) lands between lines, never inside one.
rm -f "$T/late.rc"
(
    rc=0
    "$DDPRUN" --standalone --nproc_per_node 2 sh -c 'trap "" USR1
        if [ "$RANK" = 0 ]; then seq 1 400000; fi' 2>&1 &
    echo $! >"$T/late.pid"
    wait $! || rc=$?
    echo $rc >"$T/late.rc"
) | { sleep 1.5; cat; } >"$T/late.out" &
BG_PIDS+=($!)
late=$!
sleep 0.8
kill -USR1 "$(cat "$T/late.pid")"
wait $late
[ "$(cat "$T/late.rc")" = 0 ] || { tail "$T/late.out"; fail "the job behind a late reader exited $(cat "$T/late.rc")"; }
n=$(grep -c '^\[rank0\]: [0-9]*$' "$T/late.out" || true)
[ "$n" = 400000 ] || fail "a late reader got $n of rank 0's 400000 lines"
bad=$(grep -v -E '^(\[rank0\]: [0-9]+|ddprun: .*)$' "$T/late.out" | head -3 || true)
[ -z "$bad" ] || fail "lines spliced on a shared stdout/stderr: $bad"
sort -c -n -t' ' -k2 <(grep '^\[rank0\]' "$T/late.out") || fail "rank 0's lines out of order"
assert_contains "$T/late.out" "ddprun: received SIGUSR1"
ok "a console that reads late: all 400000 lines, in order, ddprun's own lines whole between them"
