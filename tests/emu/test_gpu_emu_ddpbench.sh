#!/usr/bin/env bash
# gpu_emu.ddpbench: ddpbench --device cuda on the emulated GPU module, every collective at two
# sizes, results checked exactly (ddpbench's own check: wrong = 0), over cuda-staged and cuda-ipc
# (2 ranks sharing one emulated device) and, where libddp has it, nccl (2 ranks, one emulated
# device each). Its bookkeeping values (times, the count of wrong elements) go through a device
# scratch: passed from the host's stack to a GPU group they made the emulation stop the run,
# and would have made a real GPU's collectives fail.
# usage: test_gpu_emu_ddpbench.sh BINDIR EMU_MODULE NCCL(ON|OFF)
. "$(dirname "$0")/../integration/lib.sh"
MODULE=${2:?usage: $0 BINDIR EMU_MODULE NCCL}
NCCL=${3:-OFF}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_GPU_MODULE=$MODULE DDP_REQUIRE_GPU=1
backends=(cuda-staged cuda-ipc)
[ "$NCCL" = ON ] && backends+=(nccl)
for be in "${backends[@]}"; do
    gpus=1; [ $be = nccl ] && gpus=2
    for op in allreduce broadcast allgather reduce_scatter; do
        out=$T/$be.$op
        DDP_EMU_GPUS=$gpus "$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$BIN/ddpbench" \
            --device cuda --op $op --sizes 4K,256K --backend $be --iters 3 --csv >"$out" 2>&1 ||
            { cat "$out"; fail "ddpbench --device cuda --op $op over $be"; }
        rows=$(awk -F, -v op=$op '$1 == op && $7 == 0' "$out" | wc -l)
        [ "$rows" -eq 2 ] || { cat "$out"; fail "$op over $be: want 2 rows with 0 wrong"; }
    done
    assert_contains "$T/$be.allreduce" ",$be"
    ok "ddpbench --device cuda over $be: every collective at 4K and 256K, exact"
done
