#!/usr/bin/env bash
# Launch benchmark: wall time from command to exit of a 4-process job whose ranks meet through the
# rendezvous store, under ddprun and under torchrun (Debian's python3-torch), side by side in one
# run, medians of RUNS runs. Usage: bench/launch.sh [BUILD_DIR] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
RUNS=${2:-5}
PY=/usr/bin/python3 # Debian's interpreter, which has python3-torch
DDPRUN=$BUILD/bin/ddprun
[ -x "$DDPRUN" ] || { echo "build first: make build" >&2; exit 1; }
$PY -c "import torch" 2>/dev/null || { echo "python3-torch missing: scripts/install-deps.sh" >&2; exit 1; }

# time_ms CMD...: wall milliseconds of one run; fails loudly if the job fails
time_ms() {
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/tmp/ddp-bench-launch.out 2>&1 || { cat /tmp/ddp-bench-launch.out >&2; echo "failed: $*" >&2; exit 1; }
    t1=$(date +%s%N)
    echo "$(((t1 - t0) / 1000))" # microseconds
}
ms() { tr ' ' '\n' | grep . | awk '{printf " %.1f", $1 / 1000}'; }

declare -A T
names=(ddprun_store torchrun_store torchrun_pg ddprun_pg python_import)
for ((i = 0; i < RUNS; i++)); do
    # Interleave the contenders so that machine noise hits them alike.
    T[ddprun_store]+=" $(time_ms "$DDPRUN" --master_port "$(free_port)" --nproc_per_node=4 "$BUILD/bin/hello_world")"
    T[torchrun_store]+=" $(time_ms $PY -m torch.distributed.run --redirects 1 --tee 1 \
        --master_port "$(free_port)" --nproc_per_node=4 bench/meet_torch.py store)"
    T[torchrun_pg]+=" $(time_ms $PY -m torch.distributed.run --redirects 1 --tee 1 \
        --master_port "$(free_port)" --nproc_per_node=4 bench/meet_torch.py pg)"
    # the same PyTorch script under ddprun (its MASTER_PORT is left to torch's TCPStore)
    T[ddprun_pg]+=" $(time_ms "$DDPRUN" --master_port "$(free_port)" --nproc_per_node=4 \
        $PY bench/meet_torch.py pg)"
    T[python_import]+=" $(time_ms $PY -c 'import torch.distributed')"
done

d=$(med <<<"${T[ddprun_store]}")
echo "launch of 4 ranks that meet through the store; median of $RUNS runs"
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
printf '%-58s %10s %10s\n' "job" "median ms" "vs ddprun"
row() {
    local m
    m=$(med <<<"${T[$2]}")
    awk -v n="$1" -v m="$m" -v d="$d" -v r="$(ms <<<"${T[$2]}")" \
        'BEGIN {printf "%-58s %10.1f %9.0fx   (runs ms:%s)\n", n, m / 1000, m / d, r}'
}
row "ddprun + hello_world (C, store)" ddprun_store
row "torchrun + TCPStore add/wait (same job)" torchrun_store
row "torchrun + init_process_group(gloo) + barrier" torchrun_pg
row "ddprun + init_process_group(gloo) + barrier (same script)" ddprun_pg
row "for scale: one 'python3 -c import torch.distributed'" python_import
