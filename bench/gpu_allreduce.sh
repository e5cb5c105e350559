#!/usr/bin/env bash
# Allreduce on GPU buffers, side by side (float32 sum, in place, median time per call): ddpc's nccl
# backend at world 1 against torch.distributed's NCCL at world 1; ddpc's cuda-ipc and cuda-staged
# backends with 2 ranks on one GPU against torch.distributed's gloo on CUDA tensors (also staged
# through the host), both beside the device's copy bandwidth limit that ddpbench measures (read + write of the
# buffer once: 2·S bytes). Runs only on a machine with a GPU; needs a python3 with torch+CUDA
# (PY=...). Usage: bench/gpu_allreduce.sh [BUILD_DIR] [SIZES]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SIZES=${2:-1048576,16777216,67108864,268435456}
PY=${PY:-python3}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
raw=$OUT/gpu_allreduce.csv
: >"$raw"
sizes_sp=${SIZES//,/ }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

ddpc() { # ddpc NAME NPROC BACKEND
    "$BUILD/bin/ddprun" --standalone --nproc_per_node="$2" --no_prefix "$BUILD/bin/ddpbench" \
        --device cuda --op allreduce --sizes "$SIZES" --backend "$3" --csv 2>"$OUT/ddpc.$1.err" |
        awk -F, -v n="$1" '$1=="allreduce" {print n "," $2 "," $4; print n "_limit," $2 "," $8}'
}
torch_peer() { # torch_peer NPROC BACKEND
    local port pids=() r
    port=$(free_port)
    for ((r = 0; r < $1; r++)); do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r LOCAL_RANK=$r WORLD_SIZE=$1 \
            TORCH_BACKEND=$2 "$PY" bench/torch_cuda_allreduce.py $sizes_sp \
            >"$OUT/torch.$2.$r" 2>"$OUT/torch.$2.err.$r" &
        pids+=($!)
    done
    local rc=0 p
    for p in "${pids[@]}"; do wait "$p" || rc=1; done # each rank's own status
    [ $rc -eq 0 ] || return 1
    cat "$OUT/torch.$2.0"
}
failed() { # failed WHAT ERRFILE: say so, with the last lines of its messages
    echo "# $1 failed:" >&2
    tail -6 "$2" 2>/dev/null | sed 's/^/#   /' >&2
}
ddpc nccl_w1 1 nccl >>"$raw" || failed "ddpc nccl" "$OUT/ddpc.nccl_w1.err"
torch_peer 1 nccl >>"$raw" || failed "torch nccl" "$OUT/torch.nccl.err.0"
ddpc staged_w2 2 cuda-staged >>"$raw" || failed "ddpc cuda-staged" "$OUT/ddpc.staged_w2.err"
ddpc ipc_w2 2 cuda-ipc >>"$raw" || failed "ddpc cuda-ipc" "$OUT/ddpc.ipc_w2.err"
torch_peer 2 gloo >>"$raw" || failed "torch gloo on CUDA tensors" "$OUT/torch.gloo.err.0"

echo "allreduce on GPU buffers, float32 sum, in place: median time per call (µs)"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $(date -u +%Y-%m-%d)"
awk -F, '
/^#/ { next }
{ v[$1 "," $2] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++ns] = $2 } }
function g(k) { return (k in v) ? v[k] : -1 }
function t(x) { return x > 0 ? sprintf("%.1f", x) : "-" }                 # a time, "-" if not measured
function r(n, d) { return n > 0 && d > 0 ? sprintf("%.2fx", n / d) : "-" } # a ratio of two measured
END {
    printf "%10s %10s %11s %9s %10s %10s %12s %9s | %10s %10s %10s %11s %11s\n", "bytes", "ddpc-nccl", "torch-nccl", "limit-w1", "ddpc-stg2", "ddpc-ipc2", "torch-gloo2", "limit-w2", "torch/ddpc", "nccl/limit", "gloo/stg2", "stg2/limit", "ipc2/limit"
    for (i = 1; i <= ns; i++) {
        s = order[i]; a = g("nccl_w1," s); b = g("torch_nccl," s); c = g("staged_w2," s); d = g("torch_gloo," s)
        p = g("ipc_w2," s)
        l1 = g("nccl_w1_limit," s); l2 = g("staged_w2_limit," s)
        if (l2 <= 0) l2 = g("ipc_w2_limit," s)
        printf "%10d %10s %11s %9s %10s %10s %12s %9s | %10s %10s %10s %11s %11s\n", s, t(a), t(b), t(l1), t(c), t(p), t(d), t(l2), r(b, a), r(a, l1), r(d, c), r(c, l2), r(p, l2)
    }
}' "$raw"
