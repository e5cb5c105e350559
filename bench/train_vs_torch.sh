#!/usr/bin/env bash
# Training throughput, side by side in one run: ddptrain against PyTorch DDP (gloo, CPU, Debian's
# python3-torch) on the same MLP and CNN, Fashion-MNIST, per-rank batch 64, one thread per rank,
# 2 ranks each; and ddptrain's scaling efficiency (2 ranks × 1 thread against 2 × one rank with
# 1 thread). "1 thread" is literal: every ddptrain rank loads its batches on its training thread
# (data.threads 0, what a rank does anyway when it has no core to spare, like torch's
# num_workers=0). For reference the 1-rank run with the default loader (a prefetch thread on the
# otherwise idle core) is reported too, with the efficiency against it.
# Each run's figure is the median of its 50-step windows after the first. A repetition runs all
# of a model's configurations back to back, so the ratios (ddp/torch, efficiency) are taken
# within each repetition and their median is reported: the host has phases that move every
# absolute figure by ±20% for minutes, and pairing cancels them. The medians of the absolute
# figures, and the ratios of those medians, are printed too.
# Usage: bench/train_vs_torch.sh [BUILD_DIR] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-3}
PY=/usr/bin/python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
steps_for() { [ "$1" = mlp ] && echo 600 || echo 250; }
cfg_for() { [ "$1" = mlp ] && echo configs/fashion-mlp.yaml || echo configs/fashion-cnn.yaml; }

ddptrain_rate() { # ddptrain_rate MODEL NPROC [DATA_THREADS]
    local s
    s=$(steps_for "$1")
    "$BUILD/bin/ddprun" --standalone --nproc_per_node="$2" --no_prefix "$BUILD/bin/ddptrain" \
        --config "$(cfg_for "$1")" --total_steps "$s" --log_every 50 --eval_every 100000 \
        --checkpoint.every 0 --data.threads "${3:-0}" --overwrite true --out_dir "$OUT/run" 2>/dev/null |
        sed -n 's/^step \([0-9]*\)\/.* | \([0-9]*\) samples\/s.*/\1 \2/p' |
        awk -v last="$s" '$1 > 50 && $1 < last {print $2}' | tr '\n' ' ' | med
}
torch_rate() { # torch_rate MODEL
    local port pids=()
    port=$(free_port)
    for r in 0 1; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 \
            "$PY" bench/torch_ddp_train.py "$1" "$(steps_for "$1")" 64 >"$OUT/t.$r" 2>"$OUT/te.$r" &
        pids+=($!)
    done
    wait "${pids[@]}"
    sed -n 's/samples_per_s //p' "$OUT/t.0"
}
declare -A R
for ((i = 0; i < REPS; i++)); do
    for m in mlp cnn; do
        d2=$(ddptrain_rate $m 2); d1=$(ddptrain_rate $m 1); l1=$(ddptrain_rate $m 1 -1)
        t2=$(torch_rate $m)
        R[d2$m]+=" $d2"; R[d1$m]+=" $d1"; R[l1$m]+=" $l1"; R[t2$m]+=" $t2"
        R[rt$m]+=" $(awk -v a="$d2" -v b="$t2" 'BEGIN {print a / b}')"
        R[ef$m]+=" $(awk -v a="$d2" -v b="$d1" 'BEGIN {print a / (2 * b)}')"
        R[el$m]+=" $(awk -v a="$d2" -v b="$l1" 'BEGIN {print a / (2 * b)}')"
    done
done
echo "training samples/s, Fashion-MNIST, batch 64 per rank, 1 thread per rank; medians of $REPS runs"
echo "machine: $(nproc --all) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
echo "ratios: median over repetitions of the ratio within each (ratio of the medians in brackets)"
printf '%-6s %16s %14s %16s %16s %15s %18s %12s\n' model "ddptrain 2 ranks" "PyTorch DDP 2" \
    "ddp/torch" "ddptrain 1 rank" efficiency "1 rank + loader" "eff. vs it"
for m in mlp cnn; do
    d2=$(med <<<"${R[d2$m]}"); d1=$(med <<<"${R[d1$m]}"); t2=$(med <<<"${R[t2$m]}")
    l1=$(med <<<"${R[l1$m]}")
    rt=$(med <<<"${R[rt$m]}"); ef=$(med <<<"${R[ef$m]}"); el=$(med <<<"${R[el$m]}")
    awk -v m=$m -v d2="$d2" -v d1="$d1" -v t2="$t2" -v l1="$l1" -v rt="$rt" -v ef="$ef" -v el="$el" \
        'BEGIN {printf "%-6s %16.0f %14.0f %6.2fx (%5.2fx) %16.0f %7.2f (%5.2f) %18.0f %5.2f (%4.2f)\n",
                m, d2, t2, rt, d2 / t2, d1, ef, d2 / (2 * d1), l1, el, d2 / (2 * l1)}'
done
echo "(runs: $(for k in "${!R[@]}"; do printf '%s:%s ' "$k" "${R[$k]}"; done))"
