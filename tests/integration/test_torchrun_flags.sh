#!/usr/bin/env bash
# torchrun command lines as users type them: the single-node form of torchrun's docs
# (--rdzv_backend c10d --rdzv_endpoint localhost:0: port 0 = a free port), its one-letter flags
# (-r, -t, -m), and flags for Python scripts refused with a message naming them.
. "$(dirname "$0")/lib.sh"
get() { sed -n "s/^$2=//p" "$1"; }

# torchrun --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=2
d=$T/port0; mkdir -p "$d"
"$DDPRUN" --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=2 \
    "$WORKER" env "$d" >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "localhost:0 refused"; }
p0=$(get "$d/env.0" DDP_STORE_PORT); p1=$(get "$d/env.1" DDP_STORE_PORT)
[ -n "$p0" ] && [ "$p0" != 0 ] && [ "$p0" = "$p1" ] || fail "DDP_STORE_PORT '$p0' / '$p1' for localhost:0"
[ "$(get "$d/env.0" MASTER_ADDR)" = localhost ] || fail "MASTER_ADDR is not the endpoint's host"
"$DDPRUN" --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:0 --nproc_per_node 2 "$WORKER" rendezvous \
    >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "the ranks did not meet on 127.0.0.1:0"; }
d=$T/port0s; mkdir -p "$d"
"$DDPRUN" --standalone --rdzv_endpoint localhost:0 --nproc_per_node 2 "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "--standalone with localhost:0 refused"; }
[ "$(get "$d/env.0" DDP_STORE_PORT)" != 0 ] || fail "--standalone with localhost:0 gave port 0"
ok "--rdzv_endpoint localhost:0 / 127.0.0.1:0 (also beside --standalone): a free port, the workers meet there (port $p0)"

# IPv6 loopback, torchrun's bracketed form [::1]:PORT (and [::1], ::1 without a port), where the
# machine has ::1
if python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
    for ep in "[::1]:0" "[::1]" "::1"; do
        d=$T/v6_${#ep}; mkdir -p "$d"
        "$DDPRUN" --rdzv_endpoint "$ep" --nproc_per_node 2 "$WORKER" rendezvous >"$T/out" 2>"$T/err" ||
            { cat "$T/err" >&2; fail "the ranks did not meet on --rdzv_endpoint $ep"; }
        "$DDPRUN" --rdzv_endpoint "$ep" --nproc_per_node 2 "$WORKER" env "$d" >"$T/out" 2>"$T/err" ||
            { cat "$T/err" >&2; fail "--rdzv_endpoint $ep refused"; }
        [ "$(get "$d/env.0" MASTER_ADDR)" = ::1 ] || fail "MASTER_ADDR for $ep: $(get "$d/env.0" MASTER_ADDR)"
    done
    assert_contains "$T/err" "store at [::1]:"
    ok "--rdzv_endpoint [::1]:0, [::1] and ::1: the ranks meet over IPv6 loopback, MASTER_ADDR ::1"
    d=$T/v6_addr; mkdir -p "$d"
    "$DDPRUN" --master_addr "[::1]" --master_port "$(free_port)" --nproc_per_node 2 "$WORKER" \
        env "$d" >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "--master_addr [::1] refused"; }
    [ "$(get "$d/env.1" MASTER_ADDR)" = ::1 ] || fail "MASTER_ADDR for --master_addr [::1]"
    MASTER_ADDR="[::1]" MASTER_PORT=$(free_port) "$DDPRUN" --nproc_per_node 2 "$WORKER" \
        rendezvous >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "MASTER_ADDR=[::1] refused"; }
    ok "--master_addr [::1] and MASTER_ADDR=[::1]: taken as ::1, as in --rdzv_endpoint"
else
    echo "no IPv6 loopback here: the [::1] endpoints not run"
fi
for ep in "[::1" "[]:5" "[::1]x"; do
    rc=0
    "$DDPRUN" --rdzv_endpoint "$ep" "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "--rdzv_endpoint '$ep' exited $rc, want 2"
    assert_contains "$T/err" "an IPv6 address goes in brackets"
done
ok "malformed bracketed endpoints: usage errors"
for a in "localhost:29500" "[::1]:29500"; do
    rc=0
    "$DDPRUN" --master_addr "$a" "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "--master_addr '$a' exited $rc, want 2"
    assert_contains "$T/err" "--master_addr '$a' holds a port: give the host alone"
    rc=0
    MASTER_ADDR=$a "$DDPRUN" "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "MASTER_ADDR='$a' exited $rc, want 2"
    assert_contains "$T/err" "MASTER_ADDR in the environment '$a' holds a port"
done
ok "--master_addr / MASTER_ADDR with a port: usage errors naming it"

rc=0
"$DDPRUN" --rdzv_endpoint 127.0.0.1:0 --nnodes 2 --node_rank 0 "$WORKER" env "$T" \
    >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "port 0 with --nnodes 2 exited $rc, want 2"
assert_contains "$T/err" "port 0 (a free port) works only with one node"
rc=0
"$DDPRUN" --rdzv_endpoint 127.0.0.1:x9 "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "a bad endpoint port exited $rc, want 2"
assert_contains "$T/err" "--rdzv_endpoint '127.0.0.1:x9': 'x9' is not a port number"
[ ! -e "$T/env.0" ] || fail "a worker started after a usage error"
# No host before the port (the store listened on every interface and the workers got an empty
# MASTER_ADDR until 2026-11-26; torchrun refuses it); '' is torchrun's default, no endpoint.
rc=0
"$DDPRUN" --rdzv_endpoint :29481 "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--rdzv_endpoint :29481 exited $rc, want 2"
assert_contains "$T/err" "--rdzv_endpoint ':29481': no host before the port; give HOST:PORT"
[ ! -e "$T/env.0" ] || fail "a worker started after a usage error"
ok "port 0 across nodes, a malformed endpoint port, no host: usage errors naming --rdzv_endpoint"

# -r / -t (torchrun's short --redirects / --tee), as '-r 3' and '-t3'
d=$T/short; mkdir -p "$d"
"$DDPRUN" --nproc_per_node 2 --standalone --log_dir "$d/logs" --run_id r3 -r 3 "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || fail "-r 3 refused"
[ -d "$d/logs/r3/attempt_0/1" ] || fail "-r 3 wrote no log folder"
"$DDPRUN" --nproc_per_node 2 --standalone --log_dir "$d/logs" --run_id t3 -t3 "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || fail "-t3 refused"
[ -d "$d/logs/t3/attempt_0/0" ] || fail "-t3 wrote no log folder"
ok "-r 3 and -t3 are --redirects 3 and --tee 3"

# torchrun's --log-line-prefix-template: ${role_name}, ${rank}, ${local_rank} (Python's
# string.Template: $$ is a dollar sign); also with one worker; other names are usage errors.
d=$T/prefix; mkdir -p "$d"
"$DDPRUN" --standalone --nproc_per_node 2 --role trainer \
    --log-line-prefix-template '[${role_name}${local_rank}|${rank}]:' "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || fail "--log-line-prefix-template refused"
assert_contains "$T/out" "[trainer1|1]:env written by rank 1"
assert_contains "$T/out" "[trainer0|0]:env written by rank 0"
"$DDPRUN" --log_line_prefix_template '$$ ' "$WORKER" env "$d" >"$T/out" 2>"$T/err" ||
    fail "one worker with a prefix template"
assert_contains "$T/out" "$ env written by rank 0"
"$DDPRUN" --log_line_prefix_template '$rank/$local_rank ' "$WORKER" env "$d" >"$T/out" 2>"$T/err" ||
    fail "a template without braces"
assert_contains "$T/out" "0/0 env written by rank 0"
for bad in '${node}' '$ranks' '${rank'; do
    rc=0; "$DDPRUN" --log_line_prefix_template "$bad" true >"$T/out" 2>"$T/err" || rc=$?
    [ $rc = 2 ] || fail "--log_line_prefix_template '$bad' exited $rc, want 2"
    assert_contains "$T/err" "is not one of \${role_name}, \${rank}, \${local_rank}"
done
rc=0; "$DDPRUN" --no_prefix --log_line_prefix_template x true >"$T/out" 2>"$T/err" || rc=$?
[ $rc = 2 ] || fail "--no_prefix with a template exited $rc"
"$DDPRUN" --event-log-handler console true >"$T/out" 2>&1 || fail "--event-log-handler refused"
for f in "--logs-specs x" "--numa-binding node" "--virtual-local-rank"; do
    rc=0; "$DDPRUN" $f true >"$T/out" 2>"$T/err" || rc=$?
    [ $rc = 2 ] || fail "$f exited $rc, want 2"
    assert_not_contains "$T/err" "unknown flag"
done
assert_contains "$T/err" "--isolate_gpus gives each worker only its own GPU"
ok "--log-line-prefix-template: torchrun's three names, \$\$, one worker too; bad names refused"

# Python programs, as torchrun runs them: a PROGRAM ending in .py through 'python3 -u', -m NAME
# as 'python3 -u -m NAME', --run_path's script likewise, --no-python runs PROGRAM itself; the
# --local_rank argument of --pass_local_rank right after the script.
cd "$T"
mkdir -p pymods
printf 'import os, sys\nc = open("/proc/self/cmdline").read().split("\\0")\nprint("py", os.environ["RANK"], "-u" in c, sys.argv[1:])\n' >pymods/pyargs.py
cp pymods/pyargs.py script.py
cp pymods/pyargs.py script_noext
rc=0; "$DDPRUN" --nproc_per_node 2 script.py a "b c" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 0 ] || { cat "$T/err"; fail "'ddprun script.py' exited $rc"; }
assert_contains "$T/out" "[rank1]: py 1 True ['a', 'b c']"
for flags in "-m" "--module"; do
    PYTHONPATH=$T/pymods "$DDPRUN" --nproc_per_node 2 $flags pyargs x >"$T/out" 2>"$T/err" ||
        { cat "$T/err"; fail "'ddprun $flags pyargs' exited $?"; }
    assert_contains "$T/out" "[rank0]: py 0 True ['x']"
done
"$DDPRUN" --nproc_per_node 2 --run-path script_noext y >"$T/out" 2>"$T/err" ||
    { cat "$T/err"; fail "'ddprun --run-path script_noext' exited $?"; }
assert_contains "$T/out" "[rank1]: py 1 True ['y']"
"$DDPRUN" --nproc_per_node 2 --pass_local_rank underscore script.py z >"$T/out" 2>"$T/err" ||
    { cat "$T/err"; fail "--pass_local_rank with a script exited $?"; }
assert_contains "$T/out" "[rank1]: py 1 True ['--local_rank=1', 'z']"
printf '#!/bin/sh\necho "direct $RANK"\n' >shell.py && chmod +x shell.py
"$DDPRUN" --nproc_per_node 2 --no-python ./shell.py >"$T/out" 2>"$T/err" ||
    { cat "$T/err"; fail "--no-python ./shell.py exited $?"; }
assert_contains "$T/out" "[rank1]: direct 1"
for flags in "-m --no-python" "--run_path --no_python" "-m --run_path"; do
    rc=0
    # shellcheck disable=SC2086
    "$DDPRUN" --nproc_per_node 2 $flags script.py >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "'$flags' exited $rc, want 2"
    assert_contains "$T/err" "together"
done
rc=0; "$DDPRUN" --nproc_per_node 2 nothere.py >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || fail "'ddprun nothere.py' exited $rc, want 1"
assert_contains "$T/err" "cannot open the script 'nothere.py': No such file or directory"
rc=0; PATH=/nonexistent "$DDPRUN" --nproc_per_node 2 script.py >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || fail "no python3 on PATH: exit $rc, want 1"
assert_contains "$T/err" "cannot run 'python3' for the script 'script.py'"
cd - >/dev/null
ok "script.py, -m NAME, --run_path: through python3 -u (--local_rank after the script); --no-python runs PROGRAM; clear errors"

# torchrun's PET_<FLAG> variables (Kubernetes' PyTorchJob sets them): a flag the command line
# leaves out comes from them, and one on the command line wins; PYTHON_EXEC names the interpreter
d=$T/pet; mkdir -p "$d"
PET_NPROC_PER_NODE=3 PET_STANDALONE=1 PET_MAX_RESTARTS=0 "$DDPRUN" "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "PET_NPROC_PER_NODE=3 PET_STANDALONE=1: exit $?"; }
[ "$(ls "$d"/env.* | wc -l)" -eq 3 ] || fail "PET_NPROC_PER_NODE=3 did not start 3 workers"
assert_contains "$T/err" "flags from the environment, as torchrun takes them: PET_STANDALONE, PET_NPROC_PER_NODE, PET_MAX_RESTARTS"
rm -f "$d"/env.*
PET_NPROC_PER_NODE=3 "$DDPRUN" --standalone --nproc-per-node 2 "$WORKER" env "$d" >"$T/out" 2>"$T/err" ||
    fail "PET_NPROC_PER_NODE beside --nproc-per-node: exit $?"
[ "$(ls "$d"/env.* | wc -l)" -eq 2 ] || fail "the command line's --nproc-per-node 2 did not win"
assert_not_contains "$T/err" "PET_NPROC_PER_NODE"
# the same setting under another name on the command line wins too (--rdzv_endpoint is
# --master_addr and --master_port); --standalone leaves out the store's address and the nodes
p1=$(free_port); p2=$(free_port)
rm -f "$d"/env.*
PET_MASTER_PORT=$p1 PET_MASTER_ADDR=10.255.255.1 "$DDPRUN" --rdzv_endpoint "127.0.0.1:$p2" "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "PET_MASTER_PORT beside --rdzv_endpoint: exit $?"; }
[ "$(get "$d/env.0" DDP_STORE_PORT)" = "$p2" ] || fail "PET_MASTER_PORT won over --rdzv_endpoint"
assert_not_contains "$T/err" "PET_MASTER"
PET_MASTER_PORT=$p1 PET_NNODES=2 PET_RDZV_ENDPOINT=10.255.255.1:$p1 "$DDPRUN" --standalone "$WORKER" \
    env "$d" >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "PET_MASTER_PORT, PET_NNODES beside --standalone: exit $?"; }
[ "$(get "$d/env.0" DDP_STORE_PORT)" != "$p1" ] || fail "--standalone took PET_MASTER_PORT"
assert_not_contains "$T/err" "PET_"
PET_STANDALONE=1 "$DDPRUN" --master_port "$p2" "$WORKER" env "$d" >"$T/out" 2>"$T/err" ||
    { cat "$T/err"; fail "PET_STANDALONE=1 beside --master_port: exit $?"; }
[ "$(get "$d/env.0" DDP_STORE_PORT)" = "$p2" ] || fail "PET_STANDALONE won over --master_port"
PET_NODE_RANK=1 PET_STANDALONE=1 "$DDPRUN" "$WORKER" env "$d" >"$T/out" 2>"$T/err" ||
    { cat "$T/err"; fail "PET_NODE_RANK=1 with PET_STANDALONE=1: exit $?"; }
rc=0; PET_NPROC_PER_NODE=many "$DDPRUN" "$WORKER" env "$d" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "PET_NPROC_PER_NODE=many exited $rc, want 2"
assert_contains "$T/err" "that value came from PET_NPROC_PER_NODE in the environment"
rc=0; PET_STANDALONE=yes "$DDPRUN" "$WORKER" env "$d" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "PET_STANDALONE=yes exited $rc, want 2"
assert_contains "$T/err" "PET_STANDALONE='yes' in the environment: use 1 or 0"
# A run id with '/' (torchrun takes any text; ddprun's names its log folder and /dev/shm
# segments): refused in one line that names where it came from — the flag as given, or the
# PET_ variable (until 2026-11-25 "--run_id" for all three, the variable on a second line after
# "see 'ddprun --help'"). TORCHELASTIC_RUN_ID is the workers' (ddprun sets it), not read, as
# with torchrun.
rc=0; "$DDPRUN" --standalone --rdzv_id a/b "$WORKER" env "$d" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--rdzv_id a/b exited $rc, want 2"
assert_contains "$T/err" "ddprun: --rdzv_id 'a/b': use letters, digits, '_', '.' and '-'"
for var in PET_RUN_ID PET_RDZV_ID; do
    flag=$(echo "${var#PET_}" | tr A-Z a-z)
    rc=0; env $var=a/b "$DDPRUN" --nproc_per_node 1 "$WORKER" env "$d" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "$var=a/b exited $rc, want 2"
    assert_contains "$T/err" "ddprun: --$flag 'a/b': use letters, digits, '_', '.' and '-' (it names ddprun's log folder and shared-memory segments); that value came from $var in the environment, which torchrun reads for --$flag: correct or unset $var"
    [ "$(wc -l <"$T/err")" -eq 1 ] || { cat "$T/err"; fail "$var=a/b: want one line"; }
done
rc=0; TORCHELASTIC_RUN_ID=a/b "$DDPRUN" --standalone --nproc_per_node 1 --run_id ok1 "$WORKER" env "$d" \
    >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "TORCHELASTIC_RUN_ID=a/b: exit $?"; }
[ "$(get "$d/env.0" TORCHELASTIC_RUN_ID)" = ok1 ] || fail "the workers' TORCHELASTIC_RUN_ID is not ddprun's"
printf '#!/bin/sh\necho "fakepy $*"\n' >"$T/fakepy" && chmod +x "$T/fakepy"
touch "$T/nothing.py"
PYTHON_EXEC=$T/fakepy "$DDPRUN" --standalone "$T/nothing.py" a >"$T/out" 2>"$T/err" ||
    fail "PYTHON_EXEC: exit $?"
assert_contains "$T/out" "fakepy -u $T/nothing.py a"
ok "PET_<FLAG> variables as torchrun reads them (the command line wins; bad values name the variable); PYTHON_EXEC"

# --signals_to_handle (torchrun 2.5+): the signals ddprun always handles are accepted, others not
"$DDPRUN" --standalone --signals-to-handle "SIGTERM,SIGINT, SIGHUP,SIGQUIT,SIGUSR1,usr2" "$WORKER" \
    env "$T" >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "--signals-to-handle refused"; }
rc=0; "$DDPRUN" --signals_to_handle SIGTERM,SIGWINCH "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--signals_to_handle SIGWINCH exited $rc, want 2"
assert_contains "$T/err" "'SIGWINCH' is not one ddprun handles"
ok "--signals_to_handle: ddprun's own signals accepted, another refused naming it"

# --start_method (torchrun's spawn|fork|forkserver): listed in --help, accepted without effect;
# another value refused as torchrun refuses it (before 2026-11-25: unlisted, any value taken).
"$DDPRUN" --help >"$T/out" 2>&1
assert_contains "$T/out" "--start_method M"
"$DDPRUN" --standalone --start-method=forkserver "$WORKER" env "$T" >"$T/out" 2>"$T/err" ||
    { cat "$T/err"; fail "--start-method=forkserver refused"; }
rc=0; "$DDPRUN" --start_method thread "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--start_method thread exited $rc, want 2"
assert_contains "$T/err" "--start_method 'thread': torchrun's values are spawn, fork and forkserver"
ok "--start_method: listed, torchrun's values accepted, another refused"

# A mistyped flag: the closest one is suggested (as ddptrain does for keys); a far one is not.
for pair in "--nprocs_per_node:--nproc_per_node" "--nproc:--nproc_per_node" \
    "--master-adress:--master_addr" "--max_restart:--max_restarts" "--standalon:--standalone"; do
    given=${pair%%:*} want=${pair#*:} rc=0
    "$DDPRUN" "$given" 2 "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "'$given' exited $rc, want 2"
    assert_contains "$T/err" "unknown flag '$given'; did you mean '$want'?"
done
rc=0
"$DDPRUN" --frobnicate 5 "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--frobnicate exited $rc, want 2"
assert_not_contains "$T/err" "did you mean"
rc=0
"$DDPRUN" -nproc_per_node 2 "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "-nproc_per_node exited $rc, want 2"
assert_contains "$T/err" "unknown flag '-nproc_per_node' (ddprun's flags start with '--', e.g. '--nproc_per_node'"
ok "mistyped flags: the closest known flag suggested; one dash: say flags take two"

# A program in the current directory without './'.
cd "$T"
printf '#!/bin/sh\nexit 0\n' >prog.sh && chmod +x prog.sh
rc=0; "$DDPRUN" --nproc_per_node 2 prog.sh >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || fail "'ddprun prog.sh' exited $rc, want 1"
assert_contains "$T/err" "'prog.sh' is in the current directory, which is not searched: give './prog.sh'"
ok "a program in the current directory: a hint to add ./"

# --local_ranks_filter: the console shows the ranks named, the log files keep every rank, and a
# failed rank that is filtered out still has its last lines in the failure summary
"$DDPRUN" --standalone --nproc_per_node 2 --local_ranks_filter 1 --log_dir "$T/lf" --run_id lf \
    sh -c 'echo "out of $LOCAL_RANK"; echo "err of $LOCAL_RANK" >&2' >"$T/out" 2>"$T/err" ||
    { cat "$T/err" >&2; fail "--local_ranks_filter 1 run failed"; }
assert_contains "$T/out" "[rank1]: out of 1"
assert_contains "$T/err" "[rank1]: err of 1"
! grep -q "of 0" "$T/out" "$T/err" || fail "local rank 0 reached the console through the filter"
assert_contains "$T/lf/lf/attempt_0/0/stdout.log" "out of 0"
assert_contains "$T/lf/lf/attempt_0/0/stderr.log" "err of 0"
rc=0
"$DDPRUN" --standalone --nproc_per_node 2 --local-ranks-filter=0 "$WORKER" fail 1 3 \
    >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || fail "a failing filtered-out rank: ddprun exited $rc, want 1"
! grep -q "^\[rank1\]: testworker" "$T/err" || fail "filtered-out rank 1's line reached the console"
assert_contains "$T/err" "| testworker rank 1: failing on purpose"
for f in 2 0,5 x , 0,,1; do
    rc=0
    "$DDPRUN" --standalone --nproc_per_node 2 --local_ranks_filter "$f" "$WORKER" env "$T" \
        >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "--local_ranks_filter '$f' exited $rc, want 2"
done
assert_contains "$T/err" "expected local ranks separated by commas"
"$DDPRUN" --standalone --nproc_per_node 2 --local_ranks_filter 2 "$WORKER" env "$T" \
    >"$T/out" 2>"$T/err" || true
assert_contains "$T/err" "names local rank 2, but this node runs 2 workers (local ranks 0-1)"
"$DDPRUN" --standalone --nproc_per_node 2 --local_ranks_filter "" sh -c 'echo "out of $LOCAL_RANK"' \
    >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "--local_ranks_filter '' (no filter) refused"; }
assert_contains "$T/out" "[rank0]: out of 0"
assert_contains "$T/out" "[rank1]: out of 1"
ok "--local_ranks_filter: the console shows rank 1 only, the logs keep rank 0, a filtered-out failure is in the summary; bad lists are usage errors"

# --local_addr: the tcp data connections listen on the address given (127.0.0.2 is this host's
# too), overriding an inherited DDP_LOCAL_ADDR; an address not of this host is refused before
# anything starts; a DDP_LOCAL_ADDR the library cannot listen on fails the group naming it
COLL=$BIN/collcheck
DDP_BACKEND=tcp DDP_LOCAL_ADDR=192.0.2.1 "$DDPRUN" --standalone --nproc_per_node 2 \
    --local_addr 127.0.0.2 "$COLL" --quick >"$T/out" 2>"$T/err" ||
    { cat "$T/err" >&2; fail "tcp over --local_addr 127.0.0.2 failed"; }
rc=0
"$DDPRUN" --standalone --nproc_per_node 2 --local_addr 192.0.2.1 "$COLL" --quick \
    >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--local_addr 192.0.2.1 exited $rc, want 2"
assert_contains "$T/err" "--local_addr '192.0.2.1' is not an address of this host"
rc=0
"$DDPRUN" --standalone --nproc_per_node 2 --local_addr 0.0.0.0 "$COLL" --quick \
    >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 2 ] || fail "--local_addr 0.0.0.0 exited $rc, want 2"
assert_contains "$T/err" "--local_addr '0.0.0.0' is the wildcard address"
rc=0
DDP_BACKEND=tcp DDP_LOCAL_ADDR=0.0.0.0 DDP_TIMEOUT=20 "$DDPRUN" --standalone --nproc_per_node 2 \
    "$COLL" --quick >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || { cat "$T/err" >&2; fail "DDP_LOCAL_ADDR=0.0.0.0: ddprun exited $rc, want 1"; }
assert_contains "$T/err" "DDP_LOCAL_ADDR '0.0.0.0' (ddprun --local_addr) is the wildcard address"
DDP_BACKEND=tcp "$DDPRUN" --standalone --nproc_per_node 2 --local_addr localhost "$COLL" --quick \
    >"$T/out" 2>"$T/err" || { cat "$T/err" >&2; fail "tcp over --local_addr localhost failed"; }
rc=0
DDP_BACKEND=tcp DDP_LOCAL_ADDR=192.0.2.1 DDP_TIMEOUT=20 "$DDPRUN" --standalone --nproc_per_node 2 \
    "$COLL" --quick >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || { cat "$T/err" >&2; fail "an unusable DDP_LOCAL_ADDR: ddprun exited $rc, want 1"; }
assert_contains "$T/err" "cannot listen on DDP_LOCAL_ADDR '192.0.2.1' (ddprun --local_addr)"
ok "--local_addr 127.0.0.2: every collective over tcp there; a foreign address refused at once; an unusable DDP_LOCAL_ADDR fails the group naming it"

# --rdzv_conf: join_timeout is --rdzv_timeout; torchrun's other keys are accepted without effect
# (said once); an unknown key or a malformed list is a usage error
port=$(free_port)
rc=0
"$DDPRUN" --nnodes 2 --node_rank 0 --master_port "$port" --rdzv_conf "join_timeout=1.5, read_timeout = 60" \
    "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] || fail "a rendezvous missing node 1: ddprun exited $rc, want 1"
assert_contains "$T/err" "timed out after 1.5 s (1 of 2 nodes joined; missing node_rank 1)"
assert_contains "$T/err" "--rdzv_conf read_timeout: torchrun's elastic rendezvous settings, without effect"
for c in jointimeout=5 join_timeout is_host= =5 is_host=maybe join_timeout=x; do
    rc=0
    "$DDPRUN" --rdzv_conf "$c" "$WORKER" env "$T" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc -eq 2 ] || fail "--rdzv_conf '$c' exited $rc, want 2"
done
assert_contains "$T/err" "--rdzv_conf join_timeout='x' is not a number of seconds"
ok "--rdzv_conf join_timeout=1.5: the rendezvous gives up after 1.5 s; other torchrun keys accepted and named; bad keys refused"
