#!/usr/bin/env bash
# bench/cpu_start.sh [BIN_DIR] — what a CPU-only process pays at start: wall time and peak RSS of
# `ddptrain --help` and of a short CPU ddptrain run (a 1-layer GPT, 4 steps), each the best of
# REPS runs, plus whether any CUDA library was mapped (LD_DEBUG=files lists every library the
# process loaded, dlopen included). Run it on a build before and after a change to compare;
# BIN_DIR defaults to build/bin.
set -euo pipefail
BIN=${1:-build/bin}
REPS=${REPS:-5}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
awk 'BEGIN { for (d = 0; d < 300; d++) print "the cat sat on the mat " d "\n%" }' >"$T/text.txt"
TINY=(--model.type gpt --data.text "$T/text.txt" --data.doc_sep % --model.n_layer 1
      --model.n_head 2 --model.n_embd 16 --model.block_size 16 --batch_size 2 --optimizer adamw
      --lr 1e-3 --eval_windows 4 --max_new_tokens 0 --log_every 2 --device cpu --total_steps 4)

# best wall seconds and best max RSS (MiB) of REPS runs of "$@"
measure() {
    local best_s=999 best_kb=0 i s kb
    for i in $(seq "$REPS"); do
        /usr/bin/time -f '%e %M' -o "$T/time" "$@" >/dev/null 2>&1 || true
        read -r s kb <"$T/time"
        best_s=$(awk -v a="$s" -v b="$best_s" 'BEGIN { print (a < b ? a : b) }')
        [ "$best_kb" -eq 0 ] || [ "$kb" -lt "$best_kb" ] && best_kb=$kb
    done
    printf '%6.2f s %7.1f MiB' "$best_s" "$(awk -v k="$best_kb" 'BEGIN { print k / 1024 }')"
}
cuda_libs() {
    LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -oE 'lib(cublas|cublasLt|cudart|nccl|ddp_gpu)[^ ]*\.so[.0-9]*' |
        sort -u | tr '\n' ' '
}
echo "bin: $BIN  (best of $REPS; load $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-28s %s  cuda libs: %s\n' "ddptrain --help" "$(measure "$BIN/ddptrain" --help)" \
    "$(cuda_libs "$BIN/ddptrain" --help)"
printf '%-28s %s  cuda libs: %s\n' "ddptrain 4 CPU steps (gpt)" \
    "$(measure "$BIN/ddptrain" "${TINY[@]}" --overwrite true --out_dir "$T/o")" \
    "$(cuda_libs "$BIN/ddptrain" "${TINY[@]}" --overwrite true --out_dir "$T/o2")"
