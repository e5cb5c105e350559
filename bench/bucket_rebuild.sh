#!/usr/bin/env bash
# What rebuilding the reducer's buckets along the first step's ready order gains (torch's
# _rebuild_buckets; opts.rebuild_buckets). bench/bucket_rebuild.c: a synthetic model of LAYERS
# layers of COUNT float32 gradients, backward from the last layer, WORK multiply-adds per
# element, buckets of CAP bytes, 2 ranks under ddprun. Three registration orders (forward: the
# initial reverse-registration layout is already right; backward: it is the worst one; shuffled)
# × rebuild off / on, with the buckets on the progress thread (DDP_OVERLAP=async) and with the
# host's default (auto: inline where ranks ≥ cores). Interleaved, REPS times; per run the slower
# rank's median ms per step; here the median of the runs and on / off. The load average before
# and after is printed: the overlap needs a core to spare, and the machine may be shared.
#   bench/bucket_rebuild.sh [BUILD_DIR] [REPS] [LAYERS] [COUNT] [WORK] [STEPS] [CAP]
set -euo pipefail
BUILD=${1:-build}
REPS=${2:-7}
LAYERS=${3:-16}
COUNT=${4:-131072}
WORK=${5:-16}
STEPS=${6:-40}
CAP=${7:-1048576}
BIN="$BUILD/bin/bucket_rebuild"
RUN="$BUILD/bin/ddprun"
[ -x "$BIN" ] && [ -x "$RUN" ] || { echo "no $BIN or $RUN: build first"; exit 1; }
OUT=$(mktemp -d /tmp/ddp-bucket-rebuild.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
echo "before: $(cut -d' ' -f1-3 /proc/loadavg) (load average)"
for ((r = 0; r < REPS; r++)); do
    for ov in async auto; do
        for order in forward backward shuffled; do
            for rb in off on; do
                line=$(DDP_OVERLAP=$ov "$RUN" --standalone --nproc_per_node=2 "$BIN" "$order" "$rb" \
                    "$LAYERS" "$COUNT" "$WORK" "$STEPS" "$CAP" 2>&1 | tail -1 | sed 's/^\[rank0\]: //')
                set -- $line
                echo "$1" >>"$OUT/$ov-$order-$rb"
                echo "$2" >>"$OUT/$ov-$order-$rb.hidden"
            done
        done
    done
done
echo "after:  $(cut -d' ' -f1-3 /proc/loadavg) (load average)"
median() { sort -g "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
mb=$(awk -v l="$LAYERS" -v c="$COUNT" 'BEGIN {printf "%.1f", l * c * 4 / 1048576}')
echo "2 ranks, $LAYERS layers × $COUNT floats ($mb MB of gradients), buckets of $CAP B, work $WORK, $STEPS steps, median of $REPS runs"
printf '%-8s %-9s %10s %10s %8s %8s %8s   %s\n' overlap order "off ms" "on ms" "off/on" "hid off" "hid on" "runs off | on"
for ov in async auto; do
    for order in forward backward shuffled; do
        f="$OUT/$ov-$order"
        a=$(median "$f-off")
        b=$(median "$f-on")
        printf '%-8s %-9s %10.3f %10.3f %7.3fx %8.2f %8.2f   %s| %s\n' "$ov" "$order" "$a" "$b" \
            "$(awk -v a="$a" -v b="$b" 'BEGIN {print a / b}')" "$(median "$f-off.hidden")" \
            "$(median "$f-on.hidden")" "$(tr '\n' ' ' <"$f-off")" "$(tr '\n' ' ' <"$f-on")"
    done
done
