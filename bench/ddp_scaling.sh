#!/usr/bin/env bash
# DDP scaling: examples/ddp_mlp's steps per second with 2 ranks against 1 rank, the same
# per-rank batch and one thread per rank, and the share of communication hidden behind
# backward; default buckets (25 MiB, first 1 MiB) and 256 KiB buckets. The contenders take
# turns REPS times; medians. Usage: bench/ddp_scaling.sh [BUILD_DIR] [REPS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-5}
STEPS=${3:-300}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
DATA=/usr/share/datasets/fashion-mnist
ARGS=(--data "$DATA" --batch 64 --hidden 512 --steps "$STEPS" --quiet)
MLP=$BUILD/bin/ddp_mlp
line() { grep "steps/s" | sed -n 's/.*: \([0-9.]*\) steps\/s, communication \([0-9.]*\) ms\/step, \([0-9]*\)% hidden.*/\1 \2 \3/p'; }
declare -A R
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for ((i = 0; i < REPS; i++)); do
    R[one]+=" $("$MLP" "${ARGS[@]}" | line | cut -d' ' -f1)"
    R[two]+=" $("$BUILD/bin/ddprun" --standalone --nproc_per_node 2 --no_prefix "$MLP" "${ARGS[@]}" 2>/dev/null | line | tr ' ' ':')"
    R[twoasync]+=" $(DDP_OVERLAP=async "$BUILD/bin/ddprun" --standalone --nproc_per_node 2 --no_prefix "$MLP" "${ARGS[@]}" 2>/dev/null | line | tr ' ' ':')"
    # The ceiling on this machine: two independent 1-rank runs at once (no communication).
    "$MLP" "${ARGS[@]}" >"$tmp" &
    b=$("$MLP" "${ARGS[@]}" | line | cut -d' ' -f1)
    wait
    a=$(line <"$tmp" | cut -d' ' -f1)
    R[indep]+=" $(awk -v a="$a" -v b="$b" 'BEGIN {print (a + b) / 2}')"
    R[two256]+=" $("$BUILD/bin/ddprun" --standalone --nproc_per_node 2 --no_prefix "$MLP" "${ARGS[@]}" --bucket_kb 256 2>/dev/null | line | tr ' ' ':')"
done
one=$(med <<<"${R[one]}")
echo "ddp_mlp (Fashion-MNIST, MLP 784-512-512-10, batch 64 per rank, 1 thread per rank, $STEPS steps); medians of $REPS runs"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
printf '%-38s %10s %12s %14s %10s\n' "run" "steps/s" "efficiency" "comm ms/step" "hidden"
printf '%-38s %10.1f %12s %14s %10s\n' "1 rank" "$one" "-" "-" "-"
ind=$(med <<<"${R[indep]}") # each run's own steps/s, mean of the two
awk -v s="$ind" -v o="$one" 'BEGIN {printf "%-38s %10.1f %12.2f %14s %10s\n", "2 independent 1-rank runs at once", s, s / o, "-", "-"}'
for k in two twoasync two256; do
    s=$(tr ' ' '\n' <<<"${R[$k]}" | cut -d: -f1 | tr '\n' ' ' | med)
    c=$(tr ' ' '\n' <<<"${R[$k]}" | grep . | cut -d: -f2 | tr '\n' ' ' | med)
    h=$(tr ' ' '\n' <<<"${R[$k]}" | grep . | cut -d: -f3 | tr '\n' ' ' | med)
    case $k in
    two) name="2 ranks, default (auto: inline here)" ;;
    twoasync) name="2 ranks, DDP_OVERLAP=async" ;;
    *) name="2 ranks, 256 KiB buckets (auto)" ;;
    esac
    awk -v n="$name" -v s="$s" -v o="$one" -v c="$c" -v h="$h" \
        'BEGIN {printf "%-38s %10.1f %12.2f %14.2f %9.0f%%\n", n, s, s / o, c, h}'
done
echo "(runs: 1 rank:${R[one]} | 2 ranks steps:ms:%:${R[two]} | async:${R[twoasync]} | 256 KiB:${R[two256]})"
