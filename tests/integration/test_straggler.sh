#!/usr/bin/env bash
# A real straggler: ddptrain on 2 ranks while this script stops rank 1 for 40 ms out of every
# 60 ms (SIGSTOP/SIGCONT, an external cause like a busy core; nothing in ddptrain knows). A stop
# that lands while rank 1 waits in the allreduce delays both ranks alike; one that lands in its
# work makes it the straggler, so the duty cycle is high enough to show on a loaded machine too.
# Rank 0 must warn, naming rank 1 and not rank 0, with its work per step against the other's,
# once (rate-limited: straggler.every 60 s) however long it stays slow, and log it in
# metrics.jsonl; rank 1's mean work per step there must be the larger, and the report must list
# the warning. The rule's thresholds and counting are unit-tested on synthetic timings
# (unit.test_straggler).
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 1000000 --log_every 20 \
    --eval_every 1000000 --out_dir slow >slow.out 2>&1 &
run=$!
BG_PIDS+=($run)
# Rank 1: the process under ddprun whose environment says RANK=1.
slow=""
for _ in $(seq 600); do
    for p in $(pgrep -P $run) $(for c in $(pgrep -P $run); do pgrep -P "$c"; done); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx RANK=1 && slow=$p
    done
    [ -n "$slow" ] && grep -q "step 20/" slow.out && break
    sleep 0.05
done
[ -n "$slow" ] || { cat slow.out; fail "no rank 1 under ddprun $run"; }
BG_PIDS+=($slow)
(while kill -STOP "$slow" 2>/dev/null; do
    sleep 0.04
    kill -CONT "$slow" 2>/dev/null || break
    sleep 0.02
done) &
stopper=$!
BG_PIDS+=($stopper)
for _ in $(seq 1800); do grep -q "is a straggler" slow.out && break; sleep 0.05; done
sleep 4 # still slow: no second warning within straggler.every
kill $stopper
wait $stopper 2>/dev/null || true
kill -CONT "$slow" 2>/dev/null || true
kill -TERM $run
wait $run 2>/dev/null || true
grep -q "is a straggler" slow.out || { tail -20 slow.out; fail "no straggler warning in 90 s"; }
line=$(grep "is a straggler" slow.out | head -1)
echo "$line"
[[ $line == *"warning: rank 1 is a straggler: "*" ms of work per step against "*" ms (the median of the other ranks)"*" for "*" s (since step "* ]] ||
    fail "the warning does not name rank 1 with its times: $line"
assert_not_contains slow.out "rank 0 is a straggler"
[ "$(grep -c "is a straggler" slow.out)" -eq 1 ] || fail "more than one warning in 4 s: not rate-limited"
grep -q '"straggler_rank": 1' slow/metrics.jsonl || fail "metrics.jsonl lacks the warning"
ok "a rank stopped 2/3 of the time is named as the straggler, once, in the console and metrics.jsonl"

"$TRAIN" --task report --out_dir slow >report.out 2>&1 || { cat report.out; fail "report"; }
assert_contains report.out "1 straggler warning"
# The per-rank times behind the warning: rank 1's mean work per step over the run is the larger.
read -r w0 w1 < <(python3 -c '
import json, sys
b = [[], []]
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "rank_step_ms" in r:
        for k in (0, 1):
            b[k].append(r["rank_step_ms"][k] - r["rank_wait_ms"][k])
print(*(sum(x) / len(x) for x in b))' slow/metrics.jsonl)
awk -v a="$w0" -v b="$w1" 'BEGIN { exit !(b > a) }' ||
    fail "metrics.jsonl: rank 1 worked $w1 ms per step on average, rank 0 $w0"
assert_contains slow/report.html "rank 1: slowest in"
assert_contains slow/report.html "<td>1</td>"
ok "metrics.jsonl: rank 1 worked $w1 ms per step on average, rank 0 $w0; the report lists the warning"
