#!/usr/bin/env bash
# How the shm backend waits, two builds side by side: more ranks than cores, and a host busy with
# other work. The shm allreduce spins before it sleeps; this measures what that costs where a
# spinning rank may hold the core its peer needs. Each repetition runs A then B (B then A in the
# next); medians, and for the busy host the slowest run too (a bad placement by the scheduler
# shows there, not in the median).
#   - one rank more than this machine's cores (oversubscribed): ddpbench's median µs per allreduce, and
#     ddptrain MLP samples/s (the Fashion-MNIST config).
#   - 2 ranks on an idle host: the same (what a spin is for; must not get slower).
#   - 2 ranks beside one CPU hog (`yes`): the wall time of ITERS 4 KiB allreduces (ddpbench,
#     the whole run, start-up included), and ddptrain MLP samples/s.
# Usage: bench/shm_wait.sh BUILD_A BUILD_B [REPS] [ITERS]
#   e.g. git clone -b main . /tmp/old && cmake -S /tmp/old -B /tmp/old/build && \
#        cmake --build /tmp/old/build -j2 && bench/shm_wait.sh /tmp/old/build build 5
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
A=$1 B=$2 REPS=${3:-5} ITERS=${4:-20000}
CAP=60 # seconds: a run of the busy-host allreduce longer than this counts as CAP
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
OVER=$(($(nproc --all) + 1)) # ranks for the oversubscribed rows
HOG=
cleanup() {
    [ -n "$HOG" ] && kill "$HOG" 2>/dev/null
    rm -rf "$OUT"
}
trap cleanup EXIT

bench() { # bench BUILD NPROC SIZES: "bytes us" lines (median per call)
    "$1/bin/ddprun" --standalone --nproc_per_node="$2" --no_prefix "$1/bin/ddpbench" \
        --op allreduce --sizes "$3" --backend shm --csv 2>/dev/null |
        awk -F, '$1=="allreduce" {print $2, $4}'
}
wall() { # wall BUILD: seconds for ITERS 4 KiB allreduces, 2 ranks (CAP if it ran that long)
    local t0 t1
    t0=$(date +%s.%N)
    if ! timeout "$CAP" "$1/bin/ddprun" --standalone --nproc_per_node=2 --no_prefix \
        "$1/bin/ddpbench" --sizes 4K --backend shm --iters "$ITERS" >/dev/null 2>&1; then
        echo "$CAP"
        return
    fi
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", b - a}'
}
train() { ddptrain_rate "$1" "$2" configs/fashion-mlp.yaml 400 "$OUT/run"; } # BUILD NPROC

declare -A R
for ((i = 0; i < REPS; i++)); do
    for w in $(turn_order $i); do
        b=$A
        [ $w = B ] && b=$B
        while read -r bytes us; do R[$w.w3.$bytes]+=" $us"; done < <(bench "$b" "$OVER" 4K,256K,4M)
        while read -r bytes us; do R[$w.w2.$bytes]+=" $us"; done < <(bench "$b" 2 4K,256K)
        R[$w.w3.mlp]+=" $(train "$b" "$OVER")"
        R[$w.idle.mlp]+=" $(train "$b" 2)"
        hog_on
        R[$w.hog.wall]+=" $(wall "$b")"
        R[$w.hog.mlp]+=" $(train "$b" 2)"
        hog_off
    done
done
mx() { tr ' ' '\n' | grep . | sort -g | tail -1; }
echo "A = $A ($(git -C "$(dirname "$A")" rev-parse --short HEAD 2>/dev/null || echo ?)), B = $B ($(git -C "$(dirname "$B")" rev-parse --short HEAD 2>/dev/null || echo ?)); $REPS repetitions, turns alternate"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
printf '%-46s %14s %14s %10s\n' "measure" "A (median)" "B (median)" "A/B"
row() { # row LABEL KEY UNIT: A/B of the medians
    local a b
    a=$(med <<<"${R[A.$2]}")
    b=$(med <<<"${R[B.$2]}")
    printf '%-46s %11.2f %-2s %11.2f %-2s %9.2fx\n' "$1" "$a" "$3" "$b" "$3" \
        "$(awk -v x="$a" -v y="$b" 'BEGIN {print x / y}')"
}
for s in 4096 262144 4194304; do row "$OVER ranks on $(nproc --all) cores: allreduce $((s / 1024)) KiB" "w3.$s" µs; done
row "ddptrain MLP $OVER ranks on $(nproc --all) cores (samples/s)" w3.mlp /s
for s in 4096 262144; do row "2 ranks, idle host: allreduce $((s / 1024)) KiB" "w2.$s" µs; done
row "2 ranks beside a CPU hog: $ITERS × 4 KiB, wall" hog.wall s
printf '%-46s %11.2f s  %11.2f s\n' "  the slowest of those runs (cap $CAP s)" \
    "$(mx <<<"${R[A.hog.wall]}")" "$(mx <<<"${R[B.hog.wall]}")"
row "ddptrain MLP 2 ranks, idle host (samples/s)" idle.mlp /s
row "ddptrain MLP 2 ranks beside a CPU hog (samples/s)" hog.mlp /s
echo "(A/B: A's figure over B's; for times (µs, s) > 1 means B is faster, for samples/s < 1 does)"
echo "(runs: A hog wall:${R[A.hog.wall]} | B hog wall:${R[B.hog.wall]})"
