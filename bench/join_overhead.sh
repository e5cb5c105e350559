#!/usr/bin/env bash
# What uneven-input support costs per step when every rank has data (ddp_reducer_set_join, one
# allreduce of one integer per synced step; torch: DDP's `with model.join():`, an allreduce per
# forward). 2 ranks under ddprun, the same shapes on both sides: LAYERS parameters of COUNT
# float32, buckets of CAP bytes, STEPS timed steps. ddpc: bench/bucket_rebuild.c (a backward of
# WORK multiply-adds per element, buckets rebuilt); torch: bench/join_torch.py (gloo, a backward
# whose gradients are x). The two sides' steps do different work: compare each side's join/no
# join ratio and the milliseconds join adds, not ddpc's ms against torch's. Interleaved, REPS
# times; the median of the runs (each run: the slower rank's median step).
#   bench/join_overhead.sh [BUILD_DIR] [REPS] [STEPS]
set -euo pipefail
BUILD=${1:-build}
REPS=${2:-5}
STEPS=${3:-40}
PY=${PYTHON:-/usr/bin/python3}
RUN="$BUILD/bin/ddprun"
BIN="$BUILD/bin/bucket_rebuild"
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$BIN" ] && [ -x "$RUN" ] || { echo "no $BIN or $RUN: build first"; exit 1; }
"$PY" -c 'import torch' 2>/dev/null || { echo "no torch for $PY"; exit 1; }
OUT=$(mktemp -d /tmp/ddp-join-overhead.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
SHAPES="16:131072 4:4096" # LAYERS:COUNT — 8 MiB of gradients, and 64 KiB (latency-bound)
CAP=1048576
echo "before: $(cut -d' ' -f1-3 /proc/loadavg) (load average)"
for ((r = 0; r < REPS; r++)); do
    for shape in $SHAPES; do
        L=${shape%:*} C=${shape#*:}
        for j in nojoin join; do
            "$RUN" --standalone --nproc_per_node=2 "$BIN" forward on "$L" "$C" 16 "$STEPS" "$CAP" "$j" \
                2>&1 | tail -1 | sed 's/^\[rank0\]: //' | cut -d' ' -f1 >>"$OUT/ddpc-$shape-$j"
            OMP_NUM_THREADS=1 "$RUN" --standalone --nproc_per_node=2 "$PY" "$HERE/join_torch.py" \
                "$L" "$C" "$STEPS" "$CAP" "$j" 2>&1 | tail -1 | sed 's/^\[rank0\]: //' >>"$OUT/torch-$shape-$j"
        done
    done
done
echo "after:  $(cut -d' ' -f1-3 /proc/loadavg) (load average)"
median() { sort -g "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "2 ranks, $STEPS steps, median of $REPS runs; torch $("$PY" -c 'import torch; print(torch.__version__)')"
printf '%-6s %-14s %10s %10s %9s %9s\n' side shape "no join ms" "join ms" "join/no" "+ms"
for shape in $SHAPES; do
    for side in ddpc torch; do
        a=$(median "$OUT/$side-$shape-nojoin")
        b=$(median "$OUT/$side-$shape-join")
        printf '%-6s %-14s %10.3f %10.3f %8.3fx %9.3f\n' "$side" "${shape%:*}x${shape#*:}" "$a" "$b" \
            "$(awk -v a="$a" -v b="$b" 'BEGIN {print b / a}')" "$(awk -v a="$a" -v b="$b" 'BEGIN {print b - a}')"
    done
done
