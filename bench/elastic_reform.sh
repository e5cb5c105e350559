#!/usr/bin/env bash
# Elastic re-form benchmark: how long an elastic job (--nnodes 1:2, c10d rendezvous on
# 127.0.0.1) takes to run at its new size when a node joins (grow: from the second node's launch
# to both workers running at world 2) and when that node's machine dies (shrink: from SIGKILL of
# its launcher and worker to the survivor's worker running at world 1), under ddprun and under
# torchrun (Debian's python3-torch), the same Python worker (bench/elastic_worker.py: a gloo
# group, an allreduce every 20 ms) and the same flags (--monitor_interval 0.1, last_call_timeout
# 1 s, --max_restarts 3), interleaved, medians of RUNS runs.
# Usage: bench/elastic_reform.sh [BUILD_DIR] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
RUNS=${2:-3}
PY=/usr/bin/python3 # Debian's interpreter, which has python3-torch
DDPRUN=$BUILD/bin/ddprun
[ -x "$DDPRUN" ] || { echo "build first: make build" >&2; exit 1; }
$PY -c "import torch" 2>/dev/null || { echo "python3-torch missing: scripts/install-deps.sh" >&2; exit 1; }
W=$(mktemp -d /tmp/ddp-bench-elastic.XXXXXX)
A='' B=''
# Only the launchers' own process groups: `kill -- -0` would be this script's.
trap 'for p in $A $B; do kill -9 -- -"$p" 2>/dev/null; done; rm -rf "$W"' EXIT

# until_lines FILE PATTERN COUNT: waits (60 s at most) until FILE has COUNT lines matching.
until_lines() {
    for _ in $(seq 600); do
        [ "$(grep -c "$2" "$1" 2>/dev/null)" -ge "$3" ] && return 0
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1:" >&2; tail -20 "$1" >&2; exit 1
}
# at FILE PATTERN N: the time.time() the worker printed on its Nth line matching PATTERN.
at() { grep "$2" "$1" | sed -n "$3p" | sed 's/.* at //'; }

# one LAUNCHER...: one grow and one shrink; prints "grow_s shrink_s".
one() {
    local port t0 t1 grow shrink
    port=$(free_port)
    local flags=(--nnodes 1:2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint
                 "127.0.0.1:$port" --rdzv_id elastic-bench --max_restarts 3 --monitor_interval 0.1
                 --rdzv_conf last_call_timeout=1 --redirects 1 --tee 1)
    setsid "$@" "${flags[@]}" $WORKER >"$W/A.log" 2>&1 &
    A=$!
    until_lines "$W/A.log" "world 1 rank" 1
    t0=$(date +%s.%N)
    setsid "$@" "${flags[@]}" $WORKER >"$W/B.log" 2>&1 &
    B=$!
    until_lines "$W/A.log" "world 2 rank" 1
    until_lines "$W/B.log" "world 2 rank" 1
    grow=$(echo "$(at "$W/A.log" "world 2 rank" 1) $(at "$W/B.log" "world 2 rank" 1) $t0" |
           awk '{print ($1 > $2 ? $1 : $2) - $3}')
    sleep 1
    t1=$(date +%s.%N)
    kill -9 -- -"$B"
    wait "$B" 2>/dev/null || true
    until_lines "$W/A.log" "world 1 rank" 2
    shrink=$(echo "$(at "$W/A.log" "world 1 rank" 2) $t1" | awk '{print $1 - $2}')
    kill -TERM -- -"$A" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$A" 2>/dev/null || break; sleep 0.1; done
    kill -9 -- -"$A" 2>/dev/null || true
    wait "$A" 2>/dev/null || true
    echo "$grow $shrink"
}

declare -A G S
for ((i = 0; i < RUNS; i++)); do
    # torchrun runs a .py with its own interpreter; ddprun runs the program it is given.
    WORKER="bench/elastic_worker.py"
    read -r g s < <(one $PY -m torch.distributed.run)
    G[torchrun]+=" $g" S[torchrun]+=" $s"
    WORKER="$PY bench/elastic_worker.py"
    read -r g s < <(one "$DDPRUN")
    G[ddprun]+=" $g" S[ddprun]+=" $s"
done
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%F); torch $($PY -c 'import torch; print(torch.__version__)')"
printf '%-10s %-28s %-28s\n' launcher "grow s (median; runs)" "shrink s (median; runs)"
for l in ddprun torchrun; do
    printf '%-10s %-28s %-28s\n' "$l" "$(echo "${G[$l]}" | med) (${G[$l]# })" "$(echo "${S[$l]}" | med) (${S[$l]# })"
done
echo "torchrun / ddprun: grow $(echo "$(echo "${G[torchrun]}" | med) $(echo "${G[ddprun]}" | med)" | awk '{printf "%.2f", $1 / $2}')×, shrink $(echo "$(echo "${S[torchrun]}" | med) $(echo "${S[ddprun]}" | med)" | awk '{printf "%.2f", $1 / $2}')×"
