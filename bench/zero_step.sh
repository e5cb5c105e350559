#!/usr/bin/env bash
# What ZeRO costs in step time: ddptrain training a GPT with AdamW at W ranks, whole (every rank
# keeps all of the optimizer state and gradient), ZeRO-1 (shard_optimizer true: reduce-scatter
# the gradient, a 1/W optimizer step, allgather the parameters) and ZeRO-2 (shard_gradients true
# on top: backward writes into a pool of bucket slots, each reduce-scattered into the rank's
# persistent 1/W shard as it fills), at grad_accum 1 and 2 (with accumulation, ZeRO-2 reduces
# every micro-step; whole and ZeRO-1 only the last, under no_sync). Tokens/s: the median of the
# logged windows after the first; the modes take turns, REPS times; medians of those. The model
# is small and the batch too, so that communication and the optimizer weigh in the step (at
# larger batches compute hides all three alike).
# Usage: bench/zero_step.sh [BUILD_DIR] [REPS] [L/NH/C] [W] [T/B]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-3}
SHAPE=${3:-4/8/512}
W=${4:-2}
TB=${5:-32/2}
IFS=/ read -r L NH C <<<"$SHAPE"
IFS=/ read -r T B <<<"$TB"
STEPS=24 EVERY=4
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BUILD/bin/ddpprep" --out_dir "$OUT/data" --doc_sep % /usr/share/games/fortunes >/dev/null

run() { # run MODE ACCUM: median tokens/s; MODE whole, zero1 or zero2
    local so=false sg=false
    [ "$1" != whole ] && so=true
    [ "$1" = zero2 ] && sg=true
    "$BUILD/bin/ddprun" --standalone --nproc_per_node="$W" --no_prefix "$BUILD/bin/ddptrain" \
        --model.type gpt --model.n_layer "$L" --model.n_head "$NH" --model.n_embd "$C" \
        --model.block_size "$T" --model.vocab_size 256 --batch_size "$B" --grad_accum "$2" \
        --data.train "$OUT/data/train.bin" --data.val "$OUT/data/val.bin" --eval_windows 1 \
        --optimizer adamw --lr 3e-4 --betas 0.9,0.95 --weight_decay 0.1 --total_steps $STEPS \
        --log_every $EVERY --eval_every 100000 --checkpoint.every 0 --max_new_tokens 0 \
        --data.threads 0 --shard_optimizer $so --shard_gradients $sg --overwrite true \
        --out_dir "$OUT/run" >"$OUT/d.out" 2>&1 || { cat "$OUT/d.out" >&2; exit 1; }
    if [ "$1" = zero2 ]; then
        grep -q "(ZeRO-2)" "$OUT/d.out" || { cat "$OUT/d.out" >&2; exit 1; }
    fi
    sed -n 's/^step \([0-9]*\)\/.* | \([0-9.]*\) tokens\/s.*/\1 \2/p' "$OUT/d.out" |
        awk -v e=$EVERY '$1 > e {print $2}' | tr '\n' ' ' | med
}
declare -A R
MODES="whole zero1 zero2"
for ((i = 0; i < REPS; i++)); do
    for a in 1 2; do
        for m in $MODES; do R[$m.$a]+=" $(run $m $a)"; done
    done
done
N=$(awk -v l="$L" -v c="$C" -v t="$T" 'BEGIN {printf "%.1f", (12 * l * c * c + 256 * c + t * c) / 1e6}')
echo "ddptrain GPT $L/$NH/$C (~$N M parameters), T=$T, batch $B per rank, AdamW, $W ranks × 1 thread; tokens/s, medians of $REPS runs"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
printf '%-12s %-28s %12s %12s\n' "grad_accum" "mode" "tokens/s" "vs whole"
for a in 1 2; do
    whole=$(med <<<"${R[whole.$a]}")
    for m in $MODES; do
        case $m in
        whole) name="whole (no sharding)" ;;
        zero1) name="ZeRO-1 (shard_optimizer)" ;;
        *) name="ZeRO-2 (+ shard_gradients)" ;;
        esac
        t=$(med <<<"${R[$m.$a]}")
        printf '%-12s %-28s %12.0f %11.3fx\n' "$a" "$name" "$t" "$(awk -v x="$t" -v y="$whole" 'BEGIN {print x / y}')"
    done
done
for k in "${!R[@]}"; do echo "($k:${R[$k]})"; done | sort
