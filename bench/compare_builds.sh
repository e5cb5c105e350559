#!/usr/bin/env bash
# Two builds of ddpc side by side, taking turns in one run, for "no regression" checks after a
# refactor: the shm allreduce (2 ranks, arena buffers, float32 sum; median µs per call) and
# ddptrain's training throughput (MLP and CNN, 2 ranks × 1 thread, median samples/s over 50-step
# windows after the first). Each repetition runs A then B (then B then A in the next, so drift
# in the host favours neither); the table shows the medians and the median of the paired B/A
# ratios (> 1: B faster).
# Usage: bench/compare_builds.sh BUILD_A BUILD_B [REPS]
#   e.g. git worktree add /tmp/old <commit> && cmake -S /tmp/old -B /tmp/old/build && \
#        cmake --build /tmp/old/build -j2 && bench/compare_builds.sh /tmp/old/build build 5
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
A=$1 B=$2 REPS=${3:-5}
SIZES=4096,1048576,16777216,67108864
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

allreduce() { # allreduce BUILD: "bytes,us" lines
    "$1/bin/ddprun" --standalone --nproc_per_node=2 --no_prefix "$1/bin/ddpbench" --op allreduce \
        --sizes "$SIZES" --backend shm --buffers arena --csv 2>/dev/null |
        awk -F, '$1=="allreduce" {print $2 "," $4}'
}
train() { # train BUILD MODEL: median samples/s
    if [ "$2" = cnn ]; then ddptrain_rate "$1" 2 configs/fashion-cnn.yaml 250 "$OUT/run"
    else ddptrain_rate "$1" 2 configs/fashion-mlp.yaml 600 "$OUT/run"; fi
}
declare -A R
for ((i = 0; i < REPS; i++)); do
    for w in $(turn_order $i); do
        b=$A
        [ $w = B ] && b=$B
        while IFS=, read -r bytes us; do R[$w.ar.$bytes]+=" $us"; done < <(allreduce "$b")
        for m in mlp cnn; do R[$w.$m]+=" $(train "$b" $m)"; done
    done
done
ratio() { # ratio KEY HIGHER_IS_BETTER: median of paired B/A (or A/B for times)
    local -a a b
    read -ra a <<<"${R[A.$1]}"
    read -ra b <<<"${R[B.$1]}"
    for ((k = 0; k < ${#a[@]}; k++)); do
        if [ "$2" = 1 ]; then awk -v x="${b[k]}" -v y="${a[k]}" 'BEGIN {print x / y}'
        else awk -v x="${a[k]}" -v y="${b[k]}" 'BEGIN {print x / y}'; fi
    done | tr '\n' ' ' | med
}
echo "A = $A ($(git -C "$(dirname "$A")" rev-parse --short HEAD 2>/dev/null || echo ?)), B = $B ($(git -C "$(dirname "$B")" rev-parse --short HEAD 2>/dev/null || echo ?)); $REPS repetitions, turns alternate"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
printf '%-28s %14s %14s %12s\n' "measure" "A (median)" "B (median)" "B vs A"
for s in ${SIZES//,/ }; do
    printf '%-28s %11.1f µs %11.1f µs %11.3fx\n' "shm allreduce $((s / 1024)) KiB" \
        "$(med <<<"${R[A.ar.$s]}")" "$(med <<<"${R[B.ar.$s]}")" "$(ratio ar.$s 0)"
done
for m in mlp cnn; do
    printf '%-28s %11.0f /s %11.0f /s %11.3fx\n' "ddptrain $m 2 ranks" \
        "$(med <<<"${R[A.$m]}")" "$(med <<<"${R[B.$m]}")" "$(ratio $m 1)"
done
echo "(B vs A > 1: B is faster; allreduce ratios are A's time over B's)"
