#!/usr/bin/env bash
# What the shm backend's eviction of far peers' lines (DDP_SHM_FLUSH, docs/group.md) is worth:
# the default MLP job's 2-rank training rate (Fashion-MNIST, batch 64 per rank, 1 thread per
# rank, the sharded step) with DDP_SHM_FLUSH=never, auto (the default) and always, run back to
# back in each repetition, beside the cache-line round trip between the two cores measured just
# before (bench/core_distance.c). The host moves this VM's vCPUs between "near" (one last-level
# cache, ~55–110 ns) and "far" (two chiplets, ~350 ns) from second to second, so each repetition
# is classed by the round trips measured before and after it, and repetitions where they disagree
# are left out. Reported: per class, the median of each setting's rate over never's, within each
# repetition.
# Usage: bench/shm_flush.sh [BUILD_DIR] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-20}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cc -O2 -pthread -o "$OUT/core_distance" bench/core_distance.c
rate() { # rate FLUSH: median samples/s over the 50-step windows after the first
    DDP_SHM_FLUSH=$1 "$BUILD/bin/ddprun" --standalone --nproc_per_node=2 --no_prefix \
        "$BUILD/bin/ddptrain" --config configs/fashion-mlp.yaml --total_steps 1000 --log_every 50 \
        --eval_every 100000 --checkpoint.every 0 --data.threads 0 --overwrite true --out_dir "$OUT/run" 2>/dev/null |
        sed -n 's/^step \([0-9]*\)\/.* | \([0-9]*\) samples\/s.*/\1 \2/p' |
        awk '$1 > 50 && $1 < 1000 {print $2}' | tr '\n' ' ' | med
}
declare -A R N
echo "rep  round trip ns (before/after)  never  auto  always"
for ((i = 0; i < REPS; i++)); do
    d0=$("$OUT/core_distance")
    n=$(rate never); a=$(rate auto); w=$(rate always)
    d1=$("$OUT/core_distance")
    printf '%3d  %5s / %-5s  %8s %8s %8s\n' "$i" "$d0" "$d1" "$n" "$a" "$w"
    if [ "$d0" -gt 200 ] && [ "$d1" -gt 200 ]; then c=far
    elif [ "$d0" -le 200 ] && [ "$d1" -le 200 ]; then c=near
    else continue; fi
    N[$c]=$((${N[$c]:-0} + 1))
    R[n$c]+=" $n"
    R[a$c]+=" $(awk -v a="$a" -v b="$n" 'BEGIN {print a / b}')"
    R[w$c]+=" $(awk -v a="$w" -v b="$n" 'BEGIN {print a / b}')"
done
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
printf '%-5s %5s %14s %12s %14s\n' cores reps "never samples/s" "auto/never" "always/never"
for c in near far; do
    [ -n "${N[$c]:-}" ] || { printf '%-5s %5s\n' $c 0; continue; }
    printf '%-5s %5d %14.0f %12.3f %14.3f\n' $c "${N[$c]}" "$(med <<<"${R[n$c]}")" \
        "$(med <<<"${R[a$c]}")" "$(med <<<"${R[w$c]}")"
done
