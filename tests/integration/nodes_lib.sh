# nodes_lib.sh — what the multi-node ddprun tests share (sourced after lib.sh; test_elastic.sh,
# test_nodeloss.sh): several ddprun "nodes" on 127.0.0.1, each started in the background with its
# output in DIR/outN and DIR/errN, waited for by the lines it prints, killed, and its exit status
# checked, showing its stderr when it is not the one wanted.

# start_node DIR N ARGS...: ddprun ARGS in the background, stdout in DIR/outN and stderr in
# DIR/errN; its pid (ddprun itself, for kill -9) in the variable nN and in lib.sh's BG_PIDS
start_node() {
    local d=$1 n=$2
    shift 2
    "$DDPRUN" "$@" >"$d/out$n" 2>"$d/err$n" &
    BG_PIDS+=($!)
    printf -v "n$n" %s "$!"
}

# listening PORT: whether a socket listens on PORT, read from /proc/net/tcp and tcp6 (a probe
# connection would be a stranger in the store's log)
listening() {
    awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 }
        END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# start_host DIR PORT ARGS...: start_node DIR 0 ARGS, then waits until it listens on PORT: the node
# that hosts the store (under c10d numbering, node 0 is whichever listens first) is up before
# the others start
start_host() {
    local d=$1 port=$2 i
    shift 2
    start_node "$d" 0 "$@"
    for ((i = 0; i < 200; i++)); do
        listening "$port" && return 0
        alive "$n0" || break
        sleep 0.05
    done
    cat "$d/err0" >&2 || true
    fail "node 0 did not listen on port $port within 10 s"
}

# node_exit DIR N WANT: waits for node N (started by start_node); fails, showing DIR/errN, unless
# it exited WANT
node_exit() {
    local pid="n$2" rc=0
    wait "${!pid}" || rc=$?
    [ "$rc" -eq "$3" ] || { cat "$1/err$2" >&2 || true; fail "node $2 exited $rc, want $3"; }
}

# run_node DIR N WANT ARGS...: start_node, then node_exit (a node in the foreground)
run_node() {
    local d=$1 n=$2 want=$3
    shift 3
    start_node "$d" "$n" "$@"
    node_exit "$d" "$n" "$want"
}

# kill_node N: kill -9 of node N's ddprun, reaped (without bash's "Killed" note)
kill_node() {
    local pid="n$1"
    {
        kill -9 "${!pid}"
        wait "${!pid}" || true
    } 2>/dev/null
}

# count FILE TEXT: how many lines of FILE hold TEXT
count() {
    local c
    c=$(grep -c -- "$2" "$1" 2>/dev/null) || true
    echo "${c:-0}"
}

# wait_lines FILE TEXT N SECONDS: until N lines of FILE hold TEXT; else fails, showing FILE.
# SECONDS is what an idle machine needs with room to spare; the wait goes on for at least 30 s,
# as under TSan with four tests on two cores a round with its workers' start can take several
# times that. The deadline only catches a hang: the tests that promise a time measure it
# themselves.
wait_lines() {
    local i limit=$4
    [ "${limit%.*}" -ge 30 ] || limit=30
    for ((i = 0; i < limit * 20; i++)); do
        [ "$(count "$1" "$2")" -ge "$3" ] && return 0
        sleep 0.05
    done
    cat "$1" >&2 || true
    fail "expected $3 lines '$2' in $1 within $4 s"
}

# wait_ms FILE TEXT T0 [SECONDS]: prints the milliseconds from T0 (now_ms) until TEXT is in FILE,
# waiting SECONDS (15) at most
wait_ms() {
    wait_lines "$1" "$2" 1 "${4:-15}"
    echo $(($(now_ms) - $3))
}
