#!/usr/bin/env bash
# GPT training throughput, side by side in one run: ddptrain (model.type gpt) against PyTorch DDP
# (gloo, CPU, Debian's python3-torch 1.13) training the same GPT-2-shaped model
# (tests/python/gpt_twin.py) with the same B, T, AdamW (betas 0.9/0.95, weight decay 0.1 on 2-D
# weights, clipping at 1.0) and random windows of the same byte-level token file (Debian's
# fortunes, made with ddpprep), at 1 and 2 ranks, one thread per rank. Reports tokens/s (median
# of the progress windows after the first; the median over repetitions, taken in turns), the
# ddptrain/torch ratio, ddptrain's scaling efficiency, MFU and peak RSS per rank — in each
# precision of PRECS (default "fp32 bf16"): fp32 against torch in fp32; bf16 (ddptrain's bf16
# products through oneDNN, on a CPU with bf16 units) against torch under
# torch.autocast("cpu", torch.bfloat16) (oneDNN's bf16 matmuls too), with a last column against
# torch in fp32 (what a PyTorch user runs by default).
#   MFU = FLOPs per token × tokens/s per rank ÷ the rank's peak, where FLOPs per token =
#   6N + 12·L·C·T (nanoGPT's estimate_mfu, PaLM's appendix B; N = parameters without the position
#   embedding) and the peak is OpenBLAS SGEMM on GPT-shaped products with one thread, measured in
#   the same run (bench/sgemm_peak.c); for bf16 rows the MFU is ddptrain's own (its progress line:
#   against its 50 ms bf16 product probe).
#   Memory: the model's own count — parameters, gradients, AdamW's two moments (16 bytes per
#   parameter) and the activations kept for the backward (per layer 16·B·T·C + 2·B·nh·T floats,
#   plus the logits B·T·V twice and the embedding) — beside the measured peak RSS, and that peak
#   less the process's own (the same run with a 1-layer, 16-wide GPT) over the count.
# Usage: [PRECS="fp32 bf16"] bench/gpt_vs_torch.sh [BUILD_DIR] [REPS] ["L/NH/C/T/B/steps/window" ...]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-2}
shift 2 || true
SHAPES=("$@")
[ ${#SHAPES[@]} -gt 0 ] || SHAPES=("2/4/128/64/4/120/20" "6/6/384/256/8/16/4")
read -r -a PRECS <<<"${PRECS:-fp32 bf16}"
PY=/usr/bin/python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

"$BUILD/bin/ddpprep" --out_dir "$OUT/data" --doc_sep % /usr/share/games/fortunes >/dev/null
gcc -O2 -o "$OUT/sgemm_peak" bench/sgemm_peak.c $(pkg-config --cflags --libs openblas)
PEAK=$("$OUT/sgemm_peak" | sed -n 's/^peak_gflops //p')

ddp_rate() { # ddp_rate NPROC L NH C T B STEPS WINDOW PREC: "tokens/s maxrss_kb mfu%"
    "$BUILD/bin/ddprun" --standalone --nproc_per_node="$1" --no_prefix /usr/bin/time -f "maxrss %M" \
        "$BUILD/bin/ddptrain" --model.type gpt --model.n_layer "$2" --model.n_head "$3" \
        --model.n_embd "$4" --model.block_size "$5" --model.vocab_size 256 --batch_size "$6" \
        --data.train "$OUT/data/train.bin" --data.val "$OUT/data/val.bin" --eval_windows 1 \
        --optimizer adamw --lr 3e-4 --betas 0.9,0.95 --weight_decay 0.1 --grad_clip 1.0 \
        --schedule constant --total_steps "$7" --log_every "$8" --eval_every 100000 \
        --checkpoint.every 0 --max_new_tokens 0 --data.threads 0 --precision "$9" \
        --overwrite true --out_dir "$OUT/run" >"$OUT/d.out" 2>&1 || { cat "$OUT/d.out" >&2; exit 1; }
    local rate rss mfu
    rate=$(sed -n 's/^step \([0-9]*\)\/.* | \([0-9]*\) tokens\/s.*/\1 \2/p' "$OUT/d.out" |
        awk -v w="$8" -v last="$7" '$1 > w && $1 <= last {print $2}' | tr '\n' ' ' | med)
    mfu=$(sed -n 's/^step \([0-9]*\)\/.* | mfu \([0-9.]*\)%.*/\1 \2/p' "$OUT/d.out" |
        awk -v w="$8" -v last="$7" '$1 > w && $1 <= last {print $2}' | tr '\n' ' ' | med)
    rss=$(sed -n 's/^maxrss //p' "$OUT/d.out" | sort -n | tail -1)
    echo "$rate $rss $mfu"
}
torch_rate() { # torch_rate NPROC L NH C T B STEPS WINDOW PREC
    local port pids=()
    port=$(free_port)
    for ((r = 0; r < $1; r++)); do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$1 \
            "$PY" bench/torch_gpt_train.py "$OUT/data/train.bin" "$2" "$3" "$4" "$5" "$6" "$7" \
            "$8" "$9" >"$OUT/t.$r" 2>"$OUT/te.$r" &
        pids+=($!)
    done
    wait "${pids[@]}"
    sed -n 's/^tokens_per_s \([0-9.]*\).*/\1/p' "$OUT/t.0"
}
# The process's own memory (libraries, OpenBLAS's and oneDNN's buffers, the data cache's mapping)
# under a model too small to count: a 1-layer, 16-wide GPT on 8 tokens, per precision.
base_rss() { # base_rss PREC: the largest rank's peak RSS in KiB
    "$BUILD/bin/ddprun" --standalone --nproc_per_node=2 --no_prefix /usr/bin/time -f "maxrss %M" \
        "$BUILD/bin/ddptrain" --model.type gpt --model.n_layer 1 --model.n_head 1 \
        --model.n_embd 16 --model.block_size 8 --model.vocab_size 256 --batch_size 1 \
        --data.train "$OUT/data/train.bin" --data.val "$OUT/data/val.bin" --eval_windows 1 \
        --optimizer adamw --total_steps 2 --log_every 1 --eval_every 100000 \
        --checkpoint.every 0 --max_new_tokens 0 --data.threads 0 --precision "$1" \
        --overwrite true --out_dir "$OUT/base" >"$OUT/b.out" 2>&1 || { cat "$OUT/b.out" >&2; exit 1; }
    sed -n 's/^maxrss //p' "$OUT/b.out" | sort -n | tail -1
}
declare -A BASE
for p in "${PRECS[@]}"; do BASE[$p]=$(base_rss "$p"); done
declare -A R
for ((i = 0; i < REPS; i++)); do
    for s in "${SHAPES[@]}"; do
        IFS=/ read -r L NH C T B S Wn <<<"$s"
        for p in "${PRECS[@]}"; do
            k=$p$s
            read -r d2 m2 u2 <<<"$(ddp_rate 2 "$L" "$NH" "$C" "$T" "$B" "$S" "$Wn" "$p")"
            read -r d1 m1 u1 <<<"$(ddp_rate 1 "$L" "$NH" "$C" "$T" "$B" "$S" "$Wn" "$p")"
            t2=$(torch_rate 2 "$L" "$NH" "$C" "$T" "$B" "$S" "$Wn" "$p")
            t1=$(torch_rate 1 "$L" "$NH" "$C" "$T" "$B" "$S" "$Wn" "$p")
            R[d2$k]+=" $d2"; R[d1$k]+=" $d1"; R[t2$k]+=" $t2"; R[t1$k]+=" $t1"; R[m$k]+=" $m2"
            R[u$k]+=" $u2"
            R[r2$k]+=" $(awk -v a="$d2" -v b="$t2" 'BEGIN {print a / b}')"
            R[r1$k]+=" $(awk -v a="$d1" -v b="$t1" 'BEGIN {print a / b}')"
            R[ef$k]+=" $(awk -v a="$d2" -v b="$d1" 'BEGIN {print a / (2 * b)}')"
        done
        if [[ " ${PRECS[*]} " == *" fp32 "* && " ${PRECS[*]} " == *" bf16 "* ]]; then
            R[x$s]+=" $(awk -v a="${R[d2bf16$s]##* }" -v b="${R[t2fp32$s]##* }" 'BEGIN {print a / b}')"
        fi
    done
done
echo "GPT training tokens/s, byte-level fortunes, AdamW, 1 thread per rank; medians of $REPS runs"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
echo "rank peak (OpenBLAS SGEMM, 1 thread): $PEAK GFLOP/s"
printf '%-22s %-5s %10s %10s %8s %10s %10s %8s %6s %6s %14s %14s %9s\n' "L/NH/C/T/B" "prec" "ddp 1" \
    "torch 1" "ratio" "ddp 2" "torch 2" "ratio" "eff." "MFU" "RSS / model" "net RSS/model" "vs t.fp32"
for s in "${SHAPES[@]}"; do
    IFS=/ read -r L NH C T B S Wn <<<"$s"
    for p in "${PRECS[@]}"; do
        k=$p$s
        d2=$(med <<<"${R[d2$k]}"); d1=$(med <<<"${R[d1$k]}"); t2=$(med <<<"${R[t2$k]}")
        t1=$(med <<<"${R[t1$k]}"); m=$(med <<<"${R[m$k]}"); u=$(med <<<"${R[u$k]}")
        x=-; [ "$p" = bf16 ] && [ -n "${R[x$s]:-}" ] && x=$(med <<<"${R[x$s]}")
        awk -v s="$L/$NH/$C/$T/$B" -v p="$p" -v L="$L" -v NH="$NH" -v C="$C" -v T="$T" -v B="$B" \
            -v d1="$d1" -v d2="$d2" -v t1="$t1" -v t2="$t2" -v r1="$(med <<<"${R[r1$k]}")" \
            -v r2="$(med <<<"${R[r2$k]}")" -v ef="$(med <<<"${R[ef$k]}")" -v peak="$PEAK" \
            -v rss="$m" -v base="${BASE[$p]}" -v u="$u" -v x="$x" \
            'BEGIN {
                V = 256; N = L * (12 * C * C + 13 * C) + V * C + 2 * C   # without wpe
                P = N + T * C
                f = 6 * N + 12 * L * C * T
                mfu = p == "fp32" ? 100 * f * (d2 / 2) / (peak * 1e9) : u
                act = 4 * (L * (16 * B * T * C + 2 * B * NH * T) + 2 * B * T * V + 2 * B * T * C)
                model = 16 * P + act
                printf "%-22s %-5s %10.0f %10.0f %7.2fx %10.0f %10.0f %7.2fx %6.2f %5.1f%% %6.0f/%.0f MB %9.2fx %9s\n",
                    s, p, d1, t1, r1, d2, t2, r2, ef, mfu, rss / 1024, model / 1048576,
                    (rss - base) * 1024 / model, x == "-" ? "-" : sprintf("%.2fx", x)
            }'
    done
done
echo "(ratios: median over repetitions of the ratio within each; MFU at 2 ranks, per rank; RSS: the largest rank's peak, against the model's own count (parameters, gradients, AdamW state, activations) — the difference is the process (libraries, OpenBLAS buffers) and the reducer's bucket copies; net RSS/model: the peak less the process's own, measured with a 1-layer, 16-wide GPT in the same precision, over the model's count)"
echo "(runs: $(for k in "${!R[@]}"; do printf '%s:%s ' "$k" "${R[$k]}"; done))"
