#!/usr/bin/env bash
# gpu_emu.ddptrain_dry: ddptrain --device cuda on the emulated GPU module's dry run
# (DDP_EMU_DRYRUN=1, tests/emu/gpu_rt_emu.cpp), where device memory can be touched only by device
# work (kernels, the emulated NCCL's collectives, the runtime's copies and memsets) and faults
# on any other access — as on a GPU, unlike the emulation's and the fake GPU's host memory, on
# which a host read of a device pointer passes every other test. A tiny GPT through the paths
# the first GPU runs take: 1 rank (auto: nccl), 2 ranks over cuda-staged and nccl (async overlap,
# sharded optimizer, bf16 compression), bf16 and fp16 (the loss scaler's device unscale), the
# host-driven mode, evaluation, a checkpoint and a resume from it (sharded too); ddpbench --device
# cuda; the MLP and the CNN (the emulated cuDNN's work inside the same window; the CNN also on 2
# ranks sharded, saved and resumed) on a Fashion-MNIST slice
# where the machine has the data. Numbers are meaningless (no products are computed): only that
# every run ends without a fault or an error counts.
# usage: test_gpu_emu_dry.sh BINDIR EMU_MODULE NCCL(ON|OFF) [CUDNN_EMU]
. "$(dirname "$0")/../integration/lib.sh"
MODULE=${2:?usage: $0 BINDIR EMU_MODULE NCCL}
NCCL=${3:-OFF}
CUDNN=${4:-}
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
# sharded, resumed from its checkpoint (each rank's half of the AdamW state streamed from its
# device into it): the loaded state goes up to each device after keep narrowed it (state_pending)
run2 r2stagedshres --gpu_backend cuda-staged --shard_optimizer true --compress_bf16 true \
    --resume_from r2stagedsh/checkpoints/step3.safetensors --total_steps 5
if ! grep -q "each rank keeping 1/2 of its state" r2stagedshres.out ||
    ! grep -q "resumed from" r2stagedshres.out; then
    cat r2stagedshres.out
    fail "r2stagedshres: not resumed, or the optimizer's state not split"
fi
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
# the MLP and the CNN (classifier.cu; cuDNN's emulation), where the data is
SRC=/usr/share/datasets/fashion-mnist
if [ -n "$CUDNN" ] && [ -r "$SRC/train-images-idx3-ubyte.gz" ]; then
    mkdir slice
    python3 - "$SRC" slice <<'EOP' || fail "could not write the Fashion-MNIST slice"
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for split, n in (("train", 64), ("t10k", 32)):
    for kind, per in (("images-idx3", 784), ("labels-idx1", 1)):
        name = f"{split}-{kind}-ubyte.gz"
        b = gzip.open(f"{src}/{name}").read()
        head = bytearray(b[:4 + 4 * b[3]])
        struct.pack_into(">I", head, 4, n)
        with gzip.open(f"{dst}/{name}", "wb") as f:
            f.write(bytes(head) + b[len(head):len(head) + n * per])
EOP
    CLS=(--data.dir "$T/slice" --model.channels 4,8 --model.hidden 16 --batch_size 16
         --total_steps 3 --optimizer sgd --lr 0.05 --momentum 0.9 --schedule constant
         --log_every 1 --seed 9 --device cuda)
    cls() { # NAME ARGS…
        local name=$1
        shift
        rc=0; DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 dry "$TRAIN" "${CLS[@]}" \
            --out_dir "$name" "$@" >"$name.out" 2>&1 || rc=$?
        [ $rc -eq 0 ] || { cat "$name.out"; fail "dry run $name: exit $rc"; }
        ok "$name: no host access to device memory"
    }
    cls cnn --model.type cnn
    cls cnnbf16 --model.type cnn --precision bf16
    cls cnnfp16 --model.type cnn --precision fp16
    cls cnnhost --model.type cnn --resident false
    cls mlp --model.type mlp
    # two ranks, the optimizer sharded (ZeRO-1's memory split on the device), a checkpoint and
    # a resume from it (the classifier through resident.cu's keep, save_shards, state_pending)
    cls2() { # NAME ARGS…
        local name=$1
        shift
        rc=0; DDP_EMU_GPUS=2 DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 dry "$DDPRUN" --standalone \
            --nproc_per_node=2 "$TRAIN" "${CLS[@]}" --out_dir "$name" "$@" >"$name.out" 2>&1 || rc=$?
        [ $rc -eq 0 ] || { cat "$name.out"; fail "dry run $name: exit $rc"; }
        grep -q "each rank keeping 1/2 of its state" "$name.out" ||
            { cat "$name.out"; fail "$name: the optimizer's state is not split"; }
        ok "2 ranks, $name: no host access to device memory"
    }
    cls2 cnnsh --model.type cnn --gpu_backend cuda-staged --shard_optimizer true
    cls2 cnnshres --model.type cnn --gpu_backend cuda-staged --shard_optimizer true \
        --resume_from cnnsh/checkpoints/step3.safetensors --total_steps 5
    grep -q "resumed from" cnnshres.out || { cat cnnshres.out; fail "cnnshres: not resumed"; }
else
    echo "the MLP and CNN left out: no emulated cuDNN named or no Fashion-MNIST at $SRC"
fi
