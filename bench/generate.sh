#!/usr/bin/env bash
# Generation speed, side by side in one run: ddptrain --task predict with its key/value cache (the
# default, kv_cache true) and without it (every token a forward of its whole context, as nanoGPT's
# sample.py), beside PyTorch (Debian's python3-torch 1.13) generating from the same checkpoint
# the nanoGPT way and with a key/value cache (bench/generate_torch.py; what transformers' generate
# does). Greedy (temperature 0), so the four texts can be compared: the table says whether they
# are the same ids. One process each, threads = the cores (OpenBLAS's and torch's).
# A shape is L/NH/C/T[/P] (byte-level vocabulary, 256): the checkpoint is one training step of it
# on Debian's fortunes; NEW tokens follow a prompt of P bytes (default 6, "Q: Why"; more: the
# start of a fortunes file), prompt + NEW ≤ T (the cache's range). Reports tokens/s (the median
# of REPS runs, taken in turns), the ratios, and the limit of a batch of one: every token reads
# every weight, so tokens/s ≤ the bandwidth of a matrix-vector product over the weights' bytes
# (measured by torch.mv in the same run).
# usage: bench/generate.sh [BUILD] [REPS] [NEW] ["L/NH/C/T[/P]" ...]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-3}
NEW=${3:-120}
shift 3 || true
SHAPES=("$@")
[ ${#SHAPES[@]} -gt 0 ] || SHAPES=("4/4/128/128" "12/12/768/1024")
PY=/usr/bin/python3
export LC_ALL=C # ${#PROMPT} counts bytes
THREADS=$(nproc)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "generation, $NEW tokens after a prompt, greedy; median tokens/s of $REPS; $THREADS threads"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)"
printf '%-18s %8s %9s %8s %10s %8s %8s %9s %8s  %s\n' shape ddpc-kv ddpc-full torch-kv \
    torch-full "kv/t-kv" "kv/t-full" "kv/full" "limit" "same text"
for shape in "${SHAPES[@]}"; do
    IFS=/ read -r L NH C T P <<<"$shape"
    PROMPT="Q: Why"
    [ -z "${P:-}" ] || PROMPT=$(head -c "$P" /usr/share/games/fortunes/computers | tr -d "\\0")
    run="$OUT/run-$L-$C"
    "$BUILD/bin/ddptrain" --config configs/gpt-fortunes.yaml --model.n_layer "$L" \
        --model.n_head "$NH" --model.n_embd "$C" --model.block_size "$T" --batch_size 1 \
        --total_steps 1 --eval_every 0 --max_new_tokens 0 --tensorboard false \
        --overwrite true --out_dir "$run" >"$OUT/train.log" 2>&1 ||
        { cat "$OUT/train.log"; exit 1; }
    declare -A rate=() ids=()
    for ((i = 0; i < REPS; i++)); do
        for kv in true false; do
            "$BUILD/bin/ddptrain" --task predict --out_dir "$run" --max_new_tokens "$NEW" \
                --temperature 0 --kv_cache "$kv" --prompt "$PROMPT" >"$OUT/text" 2>"$OUT/err"
            rate[$kv]+=" $(sed -n 's/^generated .* (\([0-9.]*\) tokens\/s.*/\1/p' "$OUT/err")"
            ids[$kv]=$(tail -c +$((${#PROMPT} + 1)) "$OUT/text" | head -c "$NEW" | sha1sum | cut -c1-12)
        done
    done
    "$PY" bench/generate_torch.py "$run" "$PROMPT" "$NEW" --threads "$THREADS" --reps "$REPS" \
        >"$OUT/torch"
    tkv=$(awk '$1 == "cached" {print $2}' "$OUT/torch")
    tfull=$(awk '$1 == "recompute" {print $2}' "$OUT/torch")
    kv=$(echo "${rate[true]}" | med)
    full=$(echo "${rate[false]}" | med)
    same=$(echo "${ids[true]} ${ids[false]} $(awk '$1 != "limit" {print $3}' "$OUT/torch" | tr '\n' ' ')" |
        tr ' ' '\n' | grep . | sort -u | wc -l)
    limit=$(awk '$1 == "limit" {print $2}' "$OUT/torch")
    printf '%-18s %8.0f %9.0f %8.0f %10.0f %7.2fx %8.2fx %8.2fx %8.0f  %s\n' "$shape" "$kv" \
        "$full" "$tkv" "$tfull" "$(echo "$kv / $tkv" | bc -l)" "$(echo "$kv / $tfull" | bc -l)" \
        "$(echo "$kv / $full" | bc -l)" "$limit" \
        "$([ "$same" = 1 ] && echo "all four" || echo "differ")"
    unset rate ids
done
