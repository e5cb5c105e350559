#!/usr/bin/env bash
# gpu_emu.ddptrain_dry: ddptrain --device cuda on the emulated GPU module's dry run
# (DDP_EMU_DRYRUN=1, tests/emu/gpu_rt_emu.cpp), where device memory can be touched only by device
# work (kernels, the emulated NCCL's collectives, the runtime's copies and memsets) and faults
# on any other access — as on a GPU, unlike the emulation's and the fake GPU's host memory, on
# which a host read of a device pointer passes every other test. A tiny GPT through the paths
# the first GPU runs take: 1 rank (auto: nccl), 2 ranks over cuda-staged and nccl (async overlap,
# sharded optimizer, bf16 compression), bf16 and fp16 (the loss scaler's device unscale), the
# host-driven mode, evaluation, a checkpoint and a resume from it. Numbers are meaningless (no
# products are computed): only that every run ends without a fault or an error counts.
# usage: test_gpu_emu_dry.sh BINDIR EMU_MODULE NCCL(ON|OFF)
. "$(dirname "$0")/../integration/lib.sh"
MODULE=${2:?usage: $0 BINDIR EMU_MODULE NCCL}
NCCL=${3:-OFF}
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
tiny_gpt
ARGS=("${TINY_GPT[@]}" --device cuda --total_steps 3 --eval_every 2)
dry() { DDP_GPU_MODULE=$MODULE DDP_REQUIRE_GPU=1 DDP_EMU_DRYRUN=1 "$@"; }
run1() { # NAME ARGS…: one rank
    local name=$1
    shift
    rc=0; dry "$TRAIN" "${ARGS[@]}" --out_dir "$name" "$@" >"$name.out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$name.out"; fail "dry run $name: exit $rc"; }
    ok "1 rank, $name: no host access to device memory"
}
run2() { # NAME ARGS…: two ranks, one emulated GPU each
    local name=$1
    shift
    rc=0; DDP_EMU_GPUS=2 dry "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
        --out_dir "$name" "$@" >"$name.out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$name.out"; fail "dry run $name: exit $rc"; }
    ok "2 ranks, $name: no host access to device memory"
}
run1 r1
grep -q 'emulated on the CPU' r1.out || { cat r1.out; fail "the run did not use the emulated GPU"; }
run1 r1resume --resume_from r1/checkpoints/step3.safetensors --total_steps 5
run1 r1bf16 --precision bf16
run1 r1fp16 --precision fp16
run1 r1host --resident false
run2 r2staged --gpu_backend cuda-staged
run2 r2stagedsh --gpu_backend cuda-staged --shard_optimizer true --compress_bf16 true
if [ "$NCCL" = ON ]; then
    run2 r2nccl --gpu_backend nccl --overlap async
    run2 r2ncclsh --gpu_backend nccl --overlap async --shard_optimizer true --precision fp16
    run2 r2ncclc --gpu_backend nccl --overlap async --compress_bf16 true --precision bf16
fi
# ddpbench --device cuda (bench/gpu_allreduce.sh's program) on GPU buffers up to 1 MiB (the dry
# run copies those for real, so its own check of the results still holds)
bench2() { # BACKEND
    rc=0; DDP_EMU_GPUS=2 dry "$DDPRUN" --standalone --nproc_per_node=2 "$BIN/ddpbench" --device cuda \
        --backend "$1" --op all --sizes 4K,256K,1M --iters 3 >"bench-$1.out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "bench-$1.out"; fail "dry ddpbench over $1: exit $rc"; }
    ok "2 ranks, ddpbench --device cuda over $1: no host access to device memory"
}
bench2 cuda-staged
[ "$NCCL" != ON ] || bench2 nccl
