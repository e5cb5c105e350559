#!/usr/bin/env bash
# ZeRO-1's memory split on the GPU: the memory in use on each rank's GPU (ddptrain's
# rank_gpu_mem_mib: cudaMemGetInfo's total − free) while ddptrain trains the GPT-2 124M shape
# (12 layers, 12 heads, n_embd 768, vocabulary 50304, T 1024) in bf16 with AdamW, device-resident,
# its optimizer step unsharded (shard_optimizer false: every rank keeps all of AdamW's moments and
# the model's own parameters) or sharded (true: each rank keeps 1/W of the moments, and the
# model's parameter buffer is freed for the reducer's copy), at W ranks; also the largest rank's
# host peak RSS (as of the last progress line) and the whole job's peak RSS while rank 0 writes
# the checkpoint at the end (GNU time over ddprun: the largest process of the tree).
#
#   bench/gpu_zero_memory.sh emu [BUILD] [WORLDS]   the emulated GPU module's dry run
#       (tests/emu: DDP_EMU_DRYRUN=1, one emulated 80 GiB device per rank, nothing computed):
#       what ddpc itself cudaMallocs, counted by the emulated runtime — no CUDA context, cuBLAS
#       workspace or NCCL buffers, which a real GPU adds (some hundreds of MiB a process)
#   bench/gpu_zero_memory.sh gpu [BUILD] [WORLDS]   a real GPU (the module beside BUILD's
#       programs): with one GPU every rank shares it (cuda-ipc), and each rank's figure is the
#       whole device's, every rank's memory and contexts together; then PyTorch's twin on the
#       same GPU, one process (W 1 is ddpc's one-process figure beside it)
# Prints one line per run and the saving against the unsharded run beside the expected one
# (AdamW's 8 bytes a parameter × (W−1)/W; the reducer's copy of the parameters, which the
# sharded step needs, takes the place of the model's own, which is freed).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-emu}
BUILD=${2:-build}
read -r -a WORLDS <<<"${3:-2 4}"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 DDP_DATA_CACHE=$OUT/cache
case $MODE in
emu)
    MOD=$BUILD/gpu_emu/libddp_gpu_emu.so
    [ -e "$MOD" ] || { echo "no emulated module at $MOD: build the tests first" >&2; exit 2; }
    ENVS=(DDP_GPU_MODULE=$MOD DDP_REQUIRE_GPU=1 DDP_EMU_DRYRUN=1)
    BACKEND=cuda-staged
    ;;
gpu)
    ENVS=(DDP_REQUIRE_GPU=1)
    BACKEND=auto
    ;;
*)
    echo "usage: $0 emu|gpu [BUILD] [WORLDS]" >&2
    exit 2
    ;;
esac
# a text of 3000 documents (ddptrain tokenizes it: bytes), enough windows of 1024 tokens
awk 'BEGIN { srand(3); split("the a cat dog sat ran on under mat log", w, " ");
             for (d = 0; d < 3000; d++) { s = ""; for (i = 0; i < 60; i++) s = s w[1 + int(rand() * 10)] " ";
             print s "\n%" } }' >"$OUT/text.txt"
TIMER=() # GNU time for the job's peak RSS, where the machine has it
[ -x /usr/bin/time ] && TIMER=(/usr/bin/time -f "maxrss %M" -o "$OUT/time")
P=124475904 # GPT-2 124M's parameters at vocabulary 50304 (gpt.c's list, bias true)
# The GPUs the ranks spread over: each emulated rank has its own device; on a real machine
# nvidia-smi's count (1 if it has none to ask). A rank's figure is its whole device's, so with
# fewer GPUs than ranks it holds the savings of every rank on that device.
NGPU=1
[ "$MODE" = gpu ] && NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${NGPU:-0}" -ge 1 ] || NGPU=1
echo "GPT-2 124M shape, bf16, batch 4 × 1024 tokens, AdamW, device-resident ($MODE)"
printf '%-3s %-9s %14s %14s %16s\n' W step "GPU MiB/rank" "host RSS MiB" "job peak RSS MiB"
for W in "${WORLDS[@]}"; do
    declare -A gpu=()
    shards=(false true)
    [ "$W" -gt 1 ] || shards=(false) # one rank: nothing to shard
    for sh in "${shards[@]}"; do
        rm -rf "$OUT/run"
        rm -f "$OUT/time"
        env "${ENVS[@]}" DDP_EMU_GPUS="$W" "${TIMER[@]}" "$BUILD/bin/ddprun" --standalone --nproc_per_node="$W" "$BUILD/bin/ddptrain" \
            --model.type gpt --data.text "$OUT/text.txt" --data.doc_sep % --model.n_layer 12 \
            --model.n_head 12 --model.n_embd 768 --model.block_size 1024 \
            --model.vocab_size 50304 --batch_size 4 --optimizer adamw --precision bf16 \
            --max_new_tokens 0 --log_every 1 --eval_every 0 --eval_windows 4 --device cuda \
            --gpu_backend "$BACKEND" --total_steps 2 --shard_optimizer "$sh" \
            --out_dir "$OUT/run" >"$OUT/run.out" 2>&1 || { cat "$OUT/run.out" >&2; exit 1; }
        if [ "$sh" = true ]; then
            grep -q "each rank keeping 1/$W of its state" "$OUT/run.out" ||
                { cat "$OUT/run.out" >&2; exit 1; }
        fi
        read -r g r < <(python3 - "$OUT/run/metrics.jsonl" <<'EOP'
import json, sys
row = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][-1]
print(max(row["rank_gpu_mem_mib"]), max(row["rank_peak_rss_mib"]))
EOP
)
        gpu[$sh]=$g
        job=-
        [ -e "$OUT/time" ] && job=$(awk '/maxrss/ {printf "%.0f", $2 / 1024}' "$OUT/time")
        name=unsharded
        [ "$sh" = true ] && name=sharded
        printf '%-3s %-9s %14.1f %14.1f %16s\n' "$W" "$name" "$g" "$r" "$job"
    done
    [ "$W" -gt 1 ] || continue
    per=1 # ranks whose memory one figure holds: those sharing the fullest device
    [ "$MODE" = gpu ] && per=$(((W + NGPU - 1) / NGPU))
    python3 - "${gpu[false]}" "${gpu[true]}" "$W" "$P" "$per" <<'EOP'
import sys
u, s, W, P, per = (float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                   int(sys.argv[5]))
want = per * 8 * P * (W - 1) / W / 2**20
where = "a rank" if per == 1 else f"on a device ({per} ranks share it)"
print(f"    W={W}: sharded saves {u - s:.1f} MiB {where} ({100 * (u - s) / u:.1f}%); expected "
      f"{want:.1f} (AdamW's moments × (W-1)/W{f' × {per} ranks' if per > 1 else ''})")
EOP
done
# PyTorch on the same GPU (gpu mode, where torch has CUDA): the torch twin of the GPT
# (tests/python/gpt_twin.py), one process, the same shape, batch and precision (autocast bf16),
# fused AdamW, 2 steps: the memory in use on the device (torch.cuda.mem_get_info, the figure
# ddptrain reports) and the caching allocator's peak (max_memory_allocated).
# (torch with the machine's own library path: scripts/gpu-check.sh's SYS_LD_LIBRARY_PATH, where
# it put gpu-carry's libraries first for ddpc's programs)
torchpy() { LD_LIBRARY_PATH="${SYS_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" python3 "$@"; }
if [ "$MODE" = gpu ] && torchpy -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    torchpy - <<'EOP'
import os, sys
import torch
sys.path.insert(0, os.path.join("tests", "python"))
from gpt_twin import GPT, Config
torch.manual_seed(0)
model = GPT(Config(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randint(0, 50257, (4, 1024), device="cuda")
for _ in range(2):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(x, x)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"1   torch     {(total - free) / 2**20:14.1f}   (torch {torch.__version__}, eager; "
      f"max_memory_allocated {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB)")
EOP
fi
