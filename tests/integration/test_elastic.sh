#!/usr/bin/env bash
# Elastic node ranges (--nnodes MIN:MAX, torchrun's c10d rendezvous): several ddprun processes on
# 127.0.0.1, the first to listen hosting the store. A round closes with MIN or more after
# last_call_timeout, at once with MAX; a node that comes later re-forms the group larger (no
# restart counted); a node that dies re-forms it smaller (a restart counted); below MIN the
# rendezvous times out naming who came and who is missing, leaving nothing behind. Then a hostile
# user's cases: MIN met at --rdzv_timeout, Ctrl-C and kill -9 / SIGSTOP while the nodes gather,
# two newcomers beside a node slow to stop, the endpoint's port taken, a newcomer as the job
# ends, a death hidden behind a worker's failure.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/nodes_lib.sh"
export DDP_STORE_TOKEN=test-secret-$$

# args PORT NPROC LAST_CALL RDZV_TIMEOUT MAX_RESTARTS DIR WANT: one node's ddprun arguments in
# E (start_node DIR N "${E[@]}")
args() {
    E=(--nnodes 2:3 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:$1 --nproc_per_node $2
        --rdzv_conf "last_call_timeout=$3" --rdzv_timeout $4 --max_restarts $5 --agent_timeout 1
        --monitor_interval 0.1 --grace_period 1 "$WORKER" elastic $6 $7)
}
no_segments() { # no_segments RUN_ID: no /dev/shm segment of the run is left
    # shellcheck disable=SC2012
    [ -z "$(ls /dev/shm 2>/dev/null | grep -F "ddp-$1-" || true)" ] || fail "segments of $1 left"
}

# usage: an elastic range needs c10d (torchrun's static rendezvous takes one count); MIN ≤ MAX
rc=0; "$DDPRUN" --nnodes 1:4 x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--nnodes 1:4 without c10d exited $rc, want 2"
assert_contains "$T/err" "--nnodes 1:4: an elastic range needs --rdzv_backend c10d"
rc=0; "$DDPRUN" --nnodes 3:2 --rdzv_backend c10d x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--nnodes 3:2 exited $rc, want 2"
assert_contains "$T/err" "--nnodes '3:2': MIN is above MAX"
rc=0; "$DDPRUN" --nnodes 1:2 --rdzv_backend c10d --rdzv_conf last_call_timeout=x x >"$T/out" \
    2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "last_call_timeout=x exited $rc, want 2"
assert_contains "$T/err" "--rdzv_conf last_call_timeout is not a number of seconds"
rc=0; "$DDPRUN" --standalone --nnodes 1:2 --rdzv_backend c10d x >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--standalone --nnodes 1:2 exited $rc, want 2"
assert_contains "$T/err" "cannot be combined with --nnodes 1:2 (an elastic range needs"
for n in 0:2 a:b 2: :2 1:2:3; do
    rc=0; "$DDPRUN" --nnodes "$n" --rdzv_backend c10d x >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "--nnodes $n exited $rc, want 2"
    assert_contains "$T/err" "--nnodes '$n': expected N or MIN:MAX, numbers from 1 to 65536"
done
ok "usage: a range without c10d, MIN above MAX, a bad last_call_timeout, with --standalone, malformed"

# 2:3 with 2 nodes of 2 workers: the round closes after last_call_timeout (0.5 s) with world 4
d=$T/two; mkdir -p "$d"
port=$(free_port)
t0=$(now_ms)
args $port 2 0.5 10 0 "$d" 4; start_host "$d" $port "${E[@]}"
args $port 2 0.5 10 0 "$d" 4; run_node "$d" 1 0 "${E[@]}"
node_exit "$d" 0 0
t=$(($(now_ms) - t0))
[ $t -ge 500 ] || fail "the round closed after $t ms, before last_call_timeout"
[ "$(count "$d/elastic.log" "world=4 group=0 groups=2")" = 2 ] &&
    [ "$(count "$d/elastic.log" "world=4 group=1 groups=2")" = 2 ] &&
    [ "$(wc -l <"$d/elastic.log")" = 4 ] || { cat "$d/elastic.log"; fail "worlds in elastic.log"; }
for r in 0 1 2 3; do assert_contains "$d/elastic.log" "rank=$r world=4"; done
assert_contains "$d/elastic.log" "sum=4"
assert_contains "$d/err0" "4 workers on 2 nodes (of 2:3; round 0, restart 0)"
wait_gone "$d" 5
ok "2:3 with 2 nodes: world 4 after last_call_timeout ($t ms), GROUP_WORLD_SIZE 2"

# 2:3 with 3 nodes: MAX closes the round at once (last_call_timeout 20 s never waited)
d=$T/max; mkdir -p "$d"
port=$(free_port)
t0=$(now_ms)
args $port 1 20 10 0 "$d" 3; start_host "$d" $port "${E[@]}"
args $port 1 20 10 0 "$d" 3; start_node "$d" 1 "${E[@]}"
args $port 1 20 10 0 "$d" 3; run_node "$d" 2 0 "${E[@]}"
node_exit "$d" 0 0
node_exit "$d" 1 0
t=$(($(now_ms) - t0))
[ $t -lt 10000 ] || fail "3 of at most 3 nodes waited $t ms"
[ "$(count "$d/elastic.log" "world=3")" = 3 ] || { cat "$d/elastic.log"; fail "world 3"; }
for r in 0 1 2; do assert_contains "$d/elastic.log" "rank=$r world=3 group=$r groups=3 sum=3"; done
wait_gone "$d" 5
ok "2:3 with 3 nodes: starts at once ($t ms), world 3"

# a node started with other flags is turned away alone; the others run without it
d=$T/refuse; mkdir -p "$d"
port=$(free_port)
args $port 1 0.5 10 0 "$d" 2; start_host "$d" $port "${E[@]}"
args $port 1 0.5 10 1 "$d" 2
run_node "$d" x 1 "${E[@]}" # --max_restarts 1 beside node 0's 0
args $port 1 0.5 10 0 "$d" 2; run_node "$d" 1 0 "${E[@]}"
node_exit "$d" 0 0
assert_contains "$d/errx" "node 0 refused this node: node 1 ('"
assert_contains "$d/errx" "runs with --max_restarts 1 --nnodes 2:3 but node 0 with 0 and 2:3"
assert_contains "$d/err0" "refused a node: node 1 ('"
for r in 0 1; do assert_contains "$d/elastic.log" "rank=$r world=2 group=$r groups=2 sum=2"; done
wait_gone "$d" 5
ok "a node with other flags is refused alone; the job runs with the two that agree"

# a third node joins a running 2:3 job: the group re-forms with 3, no restart counted
d=$T/join; mkdir -p "$d"
port=$(free_port)
args $port 1 0.5 10 0 "$d" 3; start_host "$d" $port "${E[@]}"
args $port 1 0.5 10 0 "$d" 3; start_node "$d" 1 "${E[@]}"
wait_lines "$d/elastic.log" "world=2" 2 15
args $port 1 0.5 10 0 "$d" 3; run_node "$d" 2 0 "${E[@]}"
node_exit "$d" 0 0
node_exit "$d" 1 0
for r in 0 1 2; do assert_contains "$d/elastic.log" "restart=0 rank=$r world=3 group=$r groups=3 sum=3"; done
assert_contains "$d/err0" "re-forming the group: node 2 ('"
assert_contains "$d/err0" "not counted against --max_restarts"
assert_contains "$d/err1" "re-forming the group: node 2 ('"
assert_contains "$d/err2" "node 2 waits for the next round"
assert_contains "$d/err0" "3 workers on 3 nodes (of 2:3; round 1, restart 0)"
assert_not_contains "$d/err0" "worker failed"
wait_gone "$d" 5
ok "a node joining a running 2:3 job re-forms it with world 3 (DDP_RESTART_COUNT stays 0)"

# a node of three dies (its ddprun killed): the other two restart the group at world 2
d=$T/kill; mkdir -p "$d"
port=$(free_port)
args $port 1 1 10 1 "$d" 2; start_host "$d" $port "${E[@]}"
args $port 1 1 10 1 "$d" 2; start_node "$d" 1 "${E[@]}"
args $port 1 1 10 1 "$d" 2; start_node "$d" 2 "${E[@]}"
wait_lines "$d/elastic.log" "world=3" 3 15
kill_node 2
node_exit "$d" 0 0
node_exit "$d" 1 0
for r in 0 1; do assert_contains "$d/elastic.log" "restart=1 rank=$r world=2 group=$r groups=2 sum=2"; done
assert_contains "$d/err0" ") lost: its ddprun's connection to the store closed"
assert_contains "$d/err0" "attempt : 1 of 2 (--max_restarts 1)"
assert_contains "$d/err0" "2 workers on 2 nodes (of 2:3; round 1, restart 1)"
wait_gone "$d" 5
ok "a node of three dies: the two others go on at world 2 (one restart counted)"

# below MIN: one of two dies; node 0's next round times out naming the missing node
d=$T/below; mkdir -p "$d"
port=$(free_port)
args $port 1 0.5 1.5 1 "$d" 9; start_host "$d" $port "${E[@]}"
args $port 1 0.5 1.5 1 "$d" 9; start_node "$d" 1 "${E[@]}"
wait_lines "$d/elastic.log" "world=2" 2 15
kill_node 1
node_exit "$d" 0 1
assert_contains "$d/err0" "elastic rendezvous at '127.0.0.1:$port' timed out after 1.5 s: 1 node joined (node 0 ('"
assert_contains "$d/err0" "at least 2 needed (--nnodes 2:3); missing from the last round: node 1 ('"
wait_gone "$d" 5
no_segments "$(sed -n 's/.*run id \([^,]*\).*/\1/p' "$d/err0" | head -1)"
ok "below MIN after a death: the rendezvous times out naming the missing node; nothing left"

# below MIN from the start: a lone node
d=$T/alone; mkdir -p "$d"
port=$(free_port)
args $port 1 1 1 0 "$d" 9; run_node "$d" 0 1 "${E[@]}"
assert_contains "$d/err0" "timed out after 1 s: 1 node joined (node 0 ('"
assert_contains "$d/err0" "at least 2 needed (--nnodes 2:3); start ddprun on more nodes"
[ ! -e "$d/elastic.log" ] || fail "a worker started below MIN"
ok "a lone node of 2:3: the rendezvous times out, no worker started"

# MIN reached but last_call_timeout longer than --rdzv_timeout: the round closes with the nodes
# that came at --rdzv_timeout (before 2026-11-25 it timed out: '1 node joined …, at least 1
# needed')
d=$T/lastcall; mkdir -p "$d"
port=$(free_port)
args $port 1 30 1 0 "$d" 1; E[1]=1:3; run_node "$d" 0 0 "${E[@]}"
assert_contains "$d/elastic.log" "rank=0 world=1 group=0 groups=1 sum=1"
assert_contains "$d/err0" "closing the round at --rdzv_timeout 1 s with 1 node"
assert_not_contains "$d/err0" "timed out"
wait_gone "$d" 5
ok "MIN met, last_call_timeout above --rdzv_timeout: the round closes at --rdzv_timeout"

# Ctrl-C on a node while the nodes gather. A node new to the job leaves the round alone, as
# torch's agent stopped by a signal leaves the rendezvous open; a node that ran in the job stops
# it on every node, as a signal while the workers run does, with no worker started. Before
# 2026-11-25 node 0 closed the round with the gone node in it, started its workers and, after
# --agent_timeout, blamed a dead machine and counted a failure.
d=$T/gatherint; mkdir -p "$d"
port=$(free_port)
args $port 1 2.5 10 0 "$d" 2; E[1]=2:4; start_host "$d" $port "${E[@]}"
start_node "$d" 1 "${E[@]}"
wait_lines "$d/err1" "this is node 1" 1 5
start_node "$d" 2 "${E[@]}"
wait_lines "$d/err2" "this is node 2" 1 5
sleep 0.3
kill -INT $n2
node_exit "$d" 2 130
node_exit "$d" 0 0
node_exit "$d" 1 0
assert_contains "$d/err0" "left the rendezvous: ddprun on node 2 ('"
assert_contains "$d/err0" "received SIGINT while the nodes gathered; the round goes on without it"
for r in 0 1; do assert_contains "$d/elastic.log" "restart=0 rank=$r world=2 group=$r groups=2 sum=2"; done
assert_not_contains "$d/err0" "stopped responding"
wait_gone "$d" 5
ok "SIGINT on a node new to the job while the nodes gather: it leaves, the others run at world 2"

d=$T/gatherint2; mkdir -p "$d"
port=$(free_port)
args $port 1 3 10 1 "$d" 3; E[1]=2:4; start_host "$d" $port "${E[@]}"
start_node "$d" 1 "${E[@]}"
wait_lines "$d/elastic.log" "world=2" 2 10
start_node "$d" 2 "${E[@]}"
wait_lines "$d/err1" "re-forming the group" 1 10
sleep 0.5
t0=$(now_ms)
kill -INT $n1
node_exit "$d" 1 130
node_exit "$d" 0 1
t=$(($(now_ms) - t0))
node_exit "$d" 2 1
[ $t -lt 2500 ] || fail "node 0 took $t ms to stop after node 1's SIGINT"
assert_contains "$d/err0" "ddprun on node 1 ('"
assert_contains "$d/err0" "received SIGINT while the nodes gathered: the job stops"
assert_contains "$d/err2" "received SIGINT while the nodes gathered: the job stops"
assert_not_contains "$d/err0" "stopped responding"
assert_not_contains "$d/elastic.log" "world=3"
wait_gone "$d" 5
ok "SIGINT on a node of the job while the nodes gather stops the job everywhere ($t ms)"

# nodes killed or stopped while the nodes gather are left out of the round (their heartbeats
# stop, as torch's keep-alive); the others start without them, no failure counted; the stopped
# one, continued, comes back as a newcomer and the group re-forms with it. Before 2026-11-25 the
# round closed with them in it and, with --max_restarts 0, the job failed 'stopped responding'.
# The stop must be seen (--agent_timeout 1 s of silence) before the last call ends: with 1.5 s
# from node 3's arrival that left 0.3 s for the test's own steps, which under load they overran
# (the round closed with the stopped node; reproduced by 0.4 s more between arrival and stop).
# The last calls in these gathering cases are 2.5-3 s, so the test's signal surely comes first.
d=$T/gathergone; mkdir -p "$d"
port=$(free_port)
args $port 1 3 10 0 "$d" 3; E[1]=2:5; start_host "$d" $port "${E[@]}"
start_node "$d" 1 "${E[@]}"
wait_lines "$d/err1" "this is node 1" 1 5
start_node "$d" 2 "${E[@]}"
wait_lines "$d/err2" "this is node 2" 1 5
start_node "$d" 3 "${E[@]}"
wait_lines "$d/err3" "this is node 3" 1 5
sleep 0.2
kill -STOP $n2
kill_node 3
wait_lines "$d/elastic.log" "world=2" 2 10
kill -CONT $n2
node_exit "$d" 0 0
node_exit "$d" 1 0
node_exit "$d" 2 0
for r in 0 1; do assert_contains "$d/elastic.log" "restart=0 rank=$r world=2 group=$r groups=2 sum=2"; done
for r in 0 1 2; do assert_contains "$d/elastic.log" "restart=0 rank=$r world=3 group=$r groups=3 sum=3"; done
assert_contains "$d/err0" "node 3 ('"
assert_contains "$d/err0" "left the rendezvous: no heartbeat for 1 s"
assert_contains "$d/err0" "re-forming the group: node 2 ('"
assert_not_contains "$d/err0" "stopped responding"
assert_not_contains "$d/err0" "node 3 ('vm') joined"
wait_gone "$d" 5
ok "nodes killed and stopped while the nodes gather are left out; the stopped one re-forms it"

# a node's ddprun killed (-9) while the nodes gather, with --agent_timeout 10 s: its presence
# mark (its connection to the store closed) drops it within about a second, as while workers
# run, and the round closes at last_call_timeout with the two left. Before 2026-11-25 only its
# heartbeat could (after 10 s): the round closed with the dead node in it and the job failed.
d=$T/gatherkill; mkdir -p "$d"
port=$(free_port)
args $port 1 2.5 20 0 "$d" 2; E[1]=2:4
for i in "${!E[@]}"; do [ "${E[$i]}" = --agent_timeout ] && E[$((i + 1))]=10; done
start_host "$d" $port "${E[@]}"
start_node "$d" 1 "${E[@]}"
wait_lines "$d/err1" "this is node 1" 1 5
start_node "$d" 2 "${E[@]}"
wait_lines "$d/err2" "this is node 2" 1 5
sleep 0.3
t0=$(now_ms)
kill_node 2
wait_lines "$d/err0" "2 workers on 2 nodes (of 2:4; round 0, restart 0)" 1 8
t=$(($(now_ms) - t0))
node_exit "$d" 0 0
node_exit "$d" 1 0
for r in 0 1; do assert_contains "$d/elastic.log" "restart=0 rank=$r world=2 group=$r groups=2 sum=2"; done
assert_contains "$d/err0" "node 2 ('"
assert_contains "$d/err0" "left the rendezvous: its ddprun's connection to the store closed and it has not beaten since"
assert_not_contains "$d/err0" "stopped responding"
[ $t -lt 6000 ] || fail "the round closed $t ms after the kill (last_call_timeout 2.5 s)"
wait_gone "$d" 5
echo "  (kill -9 of a gathering node → the round closes without it: $t ms; --agent_timeout 10 s)"
ok "a gathering node's ddprun killed: dropped by its presence mark, the round closes at once"

# two newcomers at once into a 2:3 job of two nodes, one of whose workers stops slowly (it
# ignores SIGTERM: SIGKILL after --grace_period): the re-formed round keeps that running node's
# place and takes one newcomer; the other waits (before 2026-11-25 the two newcomers filled the
# round at once and the running node was left out)
d=$T/keep; mkdir -p "$d"
printf '#!/bin/sh\ntrap "" TERM\nexec "%s" elastic "%s" 3\n' "$WORKER" "$d" >"$d/slow.sh"
chmod +x "$d/slow.sh"
port=$(free_port)
args $port 1 0.5 10 0 "$d" 3; start_host "$d" $port "${E[@]}"
args $port 1 0.5 10 0 "$d" 3; E=("${E[@]:0:${#E[@]}-4}" "$d/slow.sh")
start_node "$d" 1 "${E[@]}"
wait_lines "$d/elastic.log" "world=2" 2 15
args $port 1 0.5 10 0 "$d" 3; start_node "$d" 2 "${E[@]}"
args $port 1 0.5 10 0 "$d" 3; start_node "$d" 3 "${E[@]}"
node_exit "$d" 0 0
node_exit "$d" 1 0 # slow to stop
rc2=0; wait $n2 || rc2=$?
rc3=0; wait $n3 || rc3=$?
[ $((rc2 + rc3)) -eq 1 ] || fail "newcomers exited $rc2 and $rc3, want one 0 and one 1"
assert_contains "$d/err1" "workers still running 1 s after SIGTERM"
assert_not_contains "$d/err1" "waits for the next round"
for r in 0 1 2; do assert_contains "$d/elastic.log" "rank=$r world=3 group=$r groups=3 sum=3"; done
assert_contains "$d/elastic.log" "rank=1 world=3 group=1"
wait_gone "$d" 5
ok "a running node slow to stop keeps its place when two newcomers fill a 2:3 job"

# the endpoint's port held by a program other than ddprun: the nodes say so and what to do
d=$T/taken; mkdir -p "$d"
port=$(free_port)
"$WORKER" hold-port "$port" 10 >"$d/hold" & BG_PIDS+=($!); h=$!
wait_lines "$d/hold" "holding" 1 5
args $port 1 1 1 0 "$d" 2; run_node "$d" 0 1 "${E[@]}"
kill $h; wait $h || true
assert_contains "$d/err0" "a program other than ddprun holds that port, so stop it or give every node another --rdzv_endpoint port"
ok "the endpoint's port held by another program: said, with what to do"

# a newcomer while a node's workers have already finished: no re-form (the job is ending; the
# finished workers would run again), the newcomer waits and leaves when the job ends
d=$T/ending; mkdir -p "$d"
printf '#!/bin/sh\n[ "$GROUP_RANK" = 1 ] && exit 0\necho "rank $RANK world $WORLD_SIZE" >>"%s/ran"\nsleep 1.8\n' "$d" >"$d/prog.sh"
chmod +x "$d/prog.sh"
port=$(free_port)
args $port 1 0.5 10 0 "$d" 3; E=("${E[@]:0:${#E[@]}-4}" "$d/prog.sh")
start_host "$d" $port "${E[@]}"
start_node "$d" 1 "${E[@]}"
wait_lines "$d/ran" "world 2" 1 10
sleep 0.3
run_node "$d" 2 1 "${E[@]}"
node_exit "$d" 0 0
node_exit "$d" 1 0
assert_not_contains "$d/err0" "re-forming"
[ "$(wc -l <"$d/ran")" = 1 ] || { cat "$d/ran"; fail "the workers ran again"; }
assert_contains "$d/err2" "node 2 waits for the next round"
assert_contains "$d/err2" "the job ended (node 0's ddprun exits with status 0) before a place opened for node 2; nothing ran on this node"
ok "a newcomer while a node's workers have finished: no re-form, it leaves when the job ends"

# a node dies and a worker of another fails before its heartbeat is missed (--agent_timeout 5
# s): the restarted round closes after last_call_timeout with the two left, not after the dead
# node's silence (a full round alone waits for the last round's nodes)
d=$T/diefail; mkdir -p "$d"
printf '#!/bin/sh\nif [ "$DDP_RESTART_COUNT" = 0 ] && [ "$GROUP_RANK" = 1 ]; then\n  touch "%s/fail1"; while [ ! -e "%s/go" ]; do sleep 0.05; done; exit 1\nfi\nexec "%s" elastic "%s" 2\n' "$d" "$d" "$WORKER" "$d" >"$d/prog.sh"
chmod +x "$d/prog.sh"
port=$(free_port)
args $port 1 1 10 1 "$d" 2; E=("${E[@]:0:${#E[@]}-4}" "$d/prog.sh")
for i in "${!E[@]}"; do [ "${E[$i]}" = --agent_timeout ] && E[$((i + 1))]=5; done
start_host "$d" $port "${E[@]}"
start_node "$d" 1 "${E[@]}"
wait_lines "$d/err1" "this is node 1" 1 5
start_node "$d" 2 "${E[@]}"
wait_files "$d" fail1 1 10
sleep 0.3
t0=$(now_ms)
kill_node 2
touch "$d/go"
node_exit "$d" 0 0
node_exit "$d" 1 0
t=$(($(now_ms) - t0))
for r in 0 1; do assert_contains "$d/elastic.log" "restart=1 rank=$r world=2 group=$r groups=2 sum=2"; done
[ $t -lt 4500 ] || fail "the restart after a death and a failure took $t ms (--agent_timeout 5 s)"
wait_gone "$d" 5
ok "a node dead but not yet missed does not hold up the restarted round ($t ms)"
