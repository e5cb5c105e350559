#!/usr/bin/env bash
# Does the loader hide augmentation-heavy batches behind the training step? bench/loader_transform.c
# on Fashion-MNIST, batch 64, ddp_augment_images (flip + shift 4) PASSES times per batch and a
# STEP_MS training step simulated on the caller's thread. Rows: the augmentation on the caller's
# thread after next() (the only way before the loader took a transform), with 0, 1 and 2
# loading threads; and as the loader's transform, with 0, 1 and 2 threads. Interleaved, REPS
# times; the median and the best ms per batch of each. The overlap needs a second core: on a
# shared machine, runs while another job holds it look like the caller's rows (the load average
# before and after is printed).
#   bench/loader_transform.sh [BUILD_DIR] [REPS] [PASSES] [STEP_MS] [BATCHES]
set -euo pipefail
BUILD=${1:-build}
REPS=${2:-7}
PASSES=${3:-20}
STEP_MS=${4:-1.0}
BATCHES=${5:-400}
BIN="$BUILD/bin/loader_transform"
[ -x "$BIN" ] || { echo "no $BIN: build first"; exit 1; }
OUT=$(mktemp -d /tmp/ddp-loader-transform.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
ROWS=("caller 0" "caller 1" "caller 2" "worker 0" "worker 1" "worker 2")
echo "before: $(cut -d' ' -f1-3 /proc/loadavg) (load average)"
for ((r = 0; r < REPS; r++)); do
    for row in "${ROWS[@]}"; do
        set -- $row
        "$BIN" "$1" "$2" "$PASSES" "$STEP_MS" "$BATCHES" >>"$OUT/$1-$2"
    done
done
median() { sort -g "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "after:  $(cut -d' ' -f1-3 /proc/loadavg) (load average)"
base=$(median "$OUT/caller-1")
echo "augmentation x$PASSES per batch of 64, step ${STEP_MS} ms, $BATCHES batches, median of $REPS"
printf '%-30s %10s %8s %8s   %s\n' "where the augmentation runs" "ms/batch" "vs c1" "best" "runs"
for row in "${ROWS[@]}"; do
    set -- $row
    m=$(median "$OUT/$1-$2")
    best=$(sort -g "$OUT/$1-$2" | head -1)
    printf '%-30s %10.3f %7.2fx %8.3f   %s\n' "$1, threads $2" "$m" \
        "$(awk -v a="$base" -v b="$m" 'BEGIN {print a / b}')" "$best" "$(tr '\n' ' ' <"$OUT/$1-$2")"
done
