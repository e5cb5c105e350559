#!/usr/bin/env bash
# ZeRO-1's memory split, side by side in one run: the peak RSS per rank of ddptrain training a GPT
# with AdamW, its optimizer step sharded (shard_optimizer true: each rank keeps 1/W of the AdamW
# state) or not (false: every rank keeps all of it), against PyTorch DDP (gloo, CPU, Debian's
# torch 1.13) with plain AdamW and with ZeroRedundancyOptimizer(AdamW), the same GPT twin
# (tests/python/gpt_twin.py), at W ranks. The model is wide and the batch small (B=1, T=16), so
# that the parameters, gradients and AdamW's two moments (16 bytes a parameter) dominate, not the
# activations. Each run trains and saves one checkpoint (ddptrain: rank 0 writes it, the state's
# shards streamed into the file; torch: consolidate_state_dict(to=0), then rank 0's torch.save).
# Reported: peak RSS of rank 0 and of the other ranks (ddptrain), of the largest rank (torch),
# and the saving against the unsharded run beside the expected one (AdamW's 8 bytes a parameter
# × (W−1)/W). ZeRO-2 (shard_gradients true, on top of ZeRO-1): its peak RSS, its saving against
# ZeRO-1 and the expected one (the gradient's 4 bytes a parameter × (W−1)/W, minus the gradient
# pool its DDP line reports).
# Usage: bench/zero_memory.sh [BUILD_DIR] [REPS] [L/NH/C] [WORLDS]
# Environment: BUCKET_KB (ddptrain's bucket_kb for every ddptrain run; 0, the default: 25 MiB
# buckets, whose ~75 MiB pool outweighs ZeRO-2's saving on this model), TORCH=0 (skip the torch
# columns).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-3}
SHAPE=${3:-8/8/512}
read -r -a WORLDS <<<"${4:-2 3}"
BUCKET_KB=${BUCKET_KB:-0}
TORCH=${TORCH:-1}
IFS=/ read -r L NH C <<<"$SHAPE"
T=16 B=1 STEPS=4
PY=/usr/bin/python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BUILD/bin/ddpprep" --out_dir "$OUT/data" --doc_sep % /usr/share/games/fortunes >/dev/null

ddp_rss() { # ddp_rss W SHARD: "rank0_kb others_max_kb pool_mib" (a checkpoint is saved at the
    # end); SHARD false, true (ZeRO-1) or zero2 (ZeRO-2)
    local so=$2 sg=false
    [ "$2" = zero2 ] && so=true sg=true
    rm -rf "$OUT/run"
    "$BUILD/bin/ddprun" --standalone --nproc_per_node="$1" /usr/bin/time -f "maxrss %M" \
        "$BUILD/bin/ddptrain" --model.type gpt --model.n_layer "$L" --model.n_head "$NH" \
        --model.n_embd "$C" --model.block_size $T --model.vocab_size 256 --batch_size $B \
        --data.train "$OUT/data/train.bin" --data.val "$OUT/data/val.bin" --eval_windows 1 \
        --optimizer adamw --lr 3e-4 --betas 0.9,0.95 --weight_decay 0.1 --total_steps $STEPS \
        --log_every $STEPS --eval_every 100000 --checkpoint.every $STEPS --max_new_tokens 0 \
        --data.threads 0 --shard_optimizer $so --shard_gradients $sg --bucket_kb "$BUCKET_KB" \
        --overwrite true --out_dir "$OUT/run" \
        >"$OUT/d.out" 2>&1 || { cat "$OUT/d.out" >&2; exit 1; }
    if [ "$2" = true ]; then
        grep -q "each rank keeping 1/$1 of its state" "$OUT/d.out" || { cat "$OUT/d.out" >&2; exit 1; }
    fi
    local pool=0
    if [ "$2" = zero2 ]; then
        grep -q "(ZeRO-2), each rank keeping 1/$1 of the gradient" "$OUT/d.out" || { cat "$OUT/d.out" >&2; exit 1; }
        pool=$(sed -n 's/.*gradient pool \([0-9.]*\) MiB.*/\1/p' "$OUT/d.out" | head -1)
    fi
    [ -f "$OUT/run/checkpoints/step$STEPS.safetensors" ] || { cat "$OUT/d.out" >&2; exit 1; }
    local r0 rest
    r0=$(sed -n 's/^\[rank0\]: maxrss //p' "$OUT/d.out")
    rest=$(sed -n 's/^\[rank[1-9][0-9]*\]: maxrss //p' "$OUT/d.out" | sort -n | tail -1)
    echo "$r0 $rest $pool"
}
torch_rss() { # torch_rss W ZERO: the largest rank's peak RSS in KiB
    local port pids=()
    port=$(free_port)
    rm -f "$OUT"/t.* "$OUT"/te.* # a larger world's files would be read too
    for ((r = 0; r < $1; r++)); do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$1 \
            "$PY" bench/torch_zero_mem.py "$OUT/data/train.bin" "$L" "$NH" "$C" $T $B $STEPS "$2" \
            "$OUT/torch.pt" \
            >"$OUT/t.$r" 2>"$OUT/te.$r" &
        pids+=($!)
    done
    wait "${pids[@]}" || { cat "$OUT"/te.* >&2; exit 1; }
    cat "$OUT"/t.* | sed -n 's/.*maxrss_kb \([0-9]*\).*/\1/p' | sort -n | tail -1
}
declare -A R P
for ((i = 0; i < REPS; i++)); do
    for w in "${WORLDS[@]}"; do
        read -r a b _ <<<"$(ddp_rss "$w" false)"; R[f0$w]+=" $a"; R[fo$w]+=" $b"
        read -r a b _ <<<"$(ddp_rss "$w" true)"; R[t0$w]+=" $a"; R[to$w]+=" $b"
        read -r a b c <<<"$(ddp_rss "$w" zero2)"; R[z0$w]+=" $a"; R[zo$w]+=" $b"; P[$w]=$c
        if [ "$TORCH" = 1 ]; then
            R[tf$w]+=" $(torch_rss "$w" 0)"
            R[tt$w]+=" $(torch_rss "$w" 1)"
        else
            R[tf$w]+=" 0"; R[tt$w]+=" 0"
        fi
    done
done
N=$(awk -v L="$L" -v C="$C" 'BEGIN {print L * (12 * C * C + 13 * C) + 256 * C + 2 * C + 16 * C}')
echo "ZeRO-1 and ZeRO-2 memory: peak RSS per rank (MiB) of training $STEPS steps and saving one checkpoint; GPT $L/$NH/$C (N = $N parameters, AdamW state $(awk -v n="$N" 'BEGIN {printf "%.0f", 8 * n / 1048576}') MiB), B=$B T=$T; medians of $REPS runs"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d); bucket_kb $BUCKET_KB"
printf '%-3s %17s %17s %12s %9s   %17s %12s %9s   %10s %10s %12s\n' W "ddp whole r0/rest" \
    "ddp ZeRO r0/rest" "saved r0/rest" "expected" "ddp ZeRO-2 r0/rest" "vs ZeRO-1" \
    "expected" "torch" "torch ZeRO" "saved (max)"
for w in "${WORLDS[@]}"; do
    awk -v w="$w" -v n="$N" -v f0="$(med <<<"${R[f0$w]}")" -v fo="$(med <<<"${R[fo$w]}")" \
        -v t0="$(med <<<"${R[t0$w]}")" -v to="$(med <<<"${R[to$w]}")" \
        -v z0="$(med <<<"${R[z0$w]}")" -v zo="$(med <<<"${R[zo$w]}")" -v pool="${P[$w]}" \
        -v tf="$(med <<<"${R[tf$w]}")" -v tt="$(med <<<"${R[tt$w]}")" 'BEGIN {
        printf "%-3s %8.0f/%-8.0f %8.0f/%-8.0f %6.0f/%-5.0f %9.0f   %8.0f/%-8.0f %6.0f/%-5.0f %9.0f   %10.0f %10.0f %12.0f\n", w,
            f0 / 1024, fo / 1024, t0 / 1024, to / 1024, (f0 - t0) / 1024, (fo - to) / 1024,
            8 * n * (w - 1) / w / 1048576, z0 / 1024, zo / 1024, (t0 - z0) / 1024, (to - zo) / 1024,
            4 * n * (w - 1) / w / 1048576 - pool, tf / 1024, tt / 1024, (tf - tt) / 1024 }'
    echo "    (W=$w: ZeRO-2's gradient pool ${P[$w]} MiB)"
done
echo "(runs: $(for k in "${!R[@]}"; do printf '%s:%s ' "$k" "${R[$k]}"; done))"
