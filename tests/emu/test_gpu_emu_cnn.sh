#!/usr/bin/env bash
# gpu_emu.ddptrain_cnn: ddptrain --model.type cnn|mlp --device cuda end to end on the emulated GPU
# module (classifier.cu's convolutions and batchnorm through the emulated cuDNN, cudnn_emu.cpp),
# on a slice of Fashion-MNIST (the first 256 training and 128 test images, written here as idx
# files: the emulated convolutions are plain loops), against the same runs on the cpu. ddptrain
# goes device-resident there (parameters, batchnorm statistics, gradients and optimizer state on
# the device, the reducer over a GPU group: cuda-staged named, and at 2 ranks also auto's cuda-ipc
# on one shared emulated GPU; the emulated module has no NCCL).
# Bounds measured on this emulation (cuDNN's and cuBLAS's products in double here, the CPU's in
# float), each with a margin:
#   cnn fp32, SGD, 1 rank: losses 1e-5 relative (measured 2.5e-8), the same test accuracy, the
#     checkpoint's tensors within 1e-5 of each tensor's largest value (9.4e-7) plus 1e-7 absolute
#     (1.7e-8: the conv biases' momentum, whose gradient is zero but for rounding, batchnorm
#     following); host-driven (--resident false) = resident bit for bit (the device's SGD is the
#     CPU's arithmetic); bf16 within 5e-2 of the cpu's fp32 (6.8e-4), = host-driven bit for bit
#     (the 16-bit weights rounded from the stepped masters each forward); 4 steps, a checkpoint and a
#     resume = 8 steps, bit for bit;
#   cnn, 2 ranks (DDP_EMU_GPUS=2, 1 KiB buckets): losses 1e-5 (2.3e-8), the same accuracy (the
#     running statistics broadcast from rank 0 over the GPU group), the checkpoint as above; the
#     channels 3,5 (views not 16-byte aligned), unsharded and sharded (ZeRO-1): losses 1e-5 of
#     the cpu's 2 ranks (1.4e-8), the checkpoints 1e-5 of the cpu's (3.6e-7);
#   mlp with dropout, AdamW: 1 rank losses 1e-5 (1.7e-8), tensors 5e-5 (6.1e-6: AdamW divides
#     small gradients' differences by their small norms), host-driven = resident bit for bit;
#     2 ranks with the sharded step (ZeRO-1) on the device against 2 sharded cpu ranks: losses
#     1e-5 (8.6e-9), tensors 5e-5 (2.4e-6).
# usage: test_gpu_emu_cnn.sh BINDIR EMU_MODULE CUDNN_EMU
. "$(dirname "$0")/../integration/lib.sh"
MODULE=${2:?usage: $0 BINDIR EMU_MODULE CUDNN_EMU}
CUDNN=${3:?usage: $0 BINDIR EMU_MODULE CUDNN_EMU}
SRC=/usr/share/datasets/fashion-mnist
[ -r "$SRC/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST at $SRC"; exit 77; }
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
mkdir slice
python3 - "$SRC" slice <<'EOP' || fail "could not write the Fashion-MNIST slice"
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for split, n in (("train", 256), ("t10k", 128)):
    for kind, per in (("images-idx3", 784), ("labels-idx1", 1)):
        name = f"{split}-{kind}-ubyte.gz"
        b = gzip.open(f"{src}/{name}").read()
        dims = b[3]
        head = bytearray(b[:4 + 4 * dims])
        struct.pack_into(">I", head, 4, n)
        with gzip.open(f"{dst}/{name}", "wb") as f:
            f.write(bytes(head) + b[len(head):len(head) + n * per])
EOP
ARGS=(--model.type cnn --data.dir "$T/slice" --model.channels 4,8 --model.hidden 16
      --batch_size 16 --total_steps 8 --optimizer sgd --lr 0.05 --momentum 0.9
      --schedule constant --log_every 1 --seed 9)
emu() { DDP_GPU_MODULE=$MODULE DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 DDP_REQUIRE_GPU=1 "$@"; }
GPU=(--device cuda --gpu_backend cuda-staged)
losses() { # A B N TOL: the N training losses of two metrics files agree to TOL
    python3 - "$@" <<'EOP'
import json, sys
a, b, n, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def read(p):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
x, y = read(a), read(b)
d = max(abs(x[s] - y[s]) / abs(x[s]) for s in range(1, n + 1))
print(f"steps 1-{n}: largest relative difference {d:.1e} (tolerance {tol:.0e})")
sys.exit(0 if d <= tol else 1)
EOP
}
# tensors A B REL: every float32 tensor of two checkpoints within REL × its largest |value| +
# 1e-7 (REL 0: bit for bit)
tensors() {
    python3 - "$@" <<'EOP'
import array, json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: array.array("f", b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if v["dtype"] == "F32"}
a, b, rel = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a and a.keys() == b.keys(), sorted(set(a) ^ set(b))
worst, absd, bad = 0.0, 0.0, []
for k in a:
    top = max(abs(v) for v in a[k])
    d = max(abs(p - q) for p, q in zip(a[k], b[k]))
    if rel == 0 and a[k].tobytes() != b[k].tobytes() or rel > 0 and d > rel * top + 1e-7:
        bad.append(k)
    absd = max(absd, d)
    if top > 1e-6:  # not the rounding noise of a gradient that is zero (conv bias before batchnorm)
        worst = max(worst, d / top)
print(f"{len(a)} tensors: largest difference {worst:.1e} of the tensor's largest value (those "
      f"above 1e-6), {absd:.1e} absolute; beyond the bound: {bad[:4]}")
sys.exit(1 if bad else 0)
EOP
}
acc() { sed -n 's/^\(\[rank0\]: \)\{0,1\}test accuracy \([0-9.]*\).*/\2/p' "$1" | tail -1; }
ck() { echo "$1/checkpoints/step8.safetensors"; }
run() { # NAME ARGS…: a run that must succeed, output in NAME.out
    local name=$1 rc=0
    shift
    "$@" --out_dir "$name" >"$name.out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$name.out"; fail "$name: exit $rc"; }
}

run cpu "$TRAIN" "${ARGS[@]}"
run gpu emu "$TRAIN" "${ARGS[@]}" "${GPU[@]}"
grep -q 'emulated on the CPU' gpu.out || { cat gpu.out; fail "the run did not name the emulated GPU"; }
grep -q 'gradients on the GPU over cuda-staged' gpu.out || { cat gpu.out; fail "not device-resident"; }
losses cpu/metrics.jsonl gpu/metrics.jsonl 8 1e-5 || fail "fp32: cuda (emulated) ≠ cpu"
[ -n "$(acc cpu.out)" ] && [ "$(acc cpu.out)" = "$(acc gpu.out)" ] ||
    { tail -3 cpu.out gpu.out; fail "test accuracy: cpu $(acc cpu.out), cuda $(acc gpu.out)"; }
tensors "$(ck cpu)" "$(ck gpu)" 1e-5 || fail "fp32: the resident checkpoint ≠ the cpu's"
run host emu "$TRAIN" "${ARGS[@]}" --device cuda --resident false
losses host/metrics.jsonl gpu/metrics.jsonl 8 0 || fail "host-driven ≠ resident"
tensors "$(ck host)" "$(ck gpu)" 0 || fail "host-driven's checkpoint ≠ resident's"
ok "cnn fp32, resident: 8 steps on the emulated GPU = the cpu's (test accuracy $(acc gpu.out) both, the checkpoint's tensors within 1e-5), = host-driven bit for bit"
run bf16 emu "$TRAIN" "${ARGS[@]}" "${GPU[@]}" --precision bf16
losses cpu/metrics.jsonl bf16/metrics.jsonl 8 5e-2 || fail "bf16: cuda (emulated) too far from cpu fp32"
# the 16-bit weights are rounded from the masters the device's optimizer stepped, at each forward
# (host-driven: at each upload): the same values
run bf16h emu "$TRAIN" "${ARGS[@]}" --device cuda --resident false --precision bf16
tensors "$(ck bf16h)" "$(ck bf16)" 0 || fail "bf16: host-driven's checkpoint ≠ resident's"
ok "cnn bf16, resident: 8 steps on the emulated GPU within 5e-2 of the cpu's fp32, = host-driven bit for bit"
run half emu "$TRAIN" "${ARGS[@]}" "${GPU[@]}" --total_steps 4 --checkpoint.every 4
run half emu "$TRAIN" "${ARGS[@]}" "${GPU[@]}" --resume_from latest
losses gpu/metrics.jsonl half/metrics.jsonl 8 0 || fail "resumed ≠ uninterrupted"
tensors "$(ck gpu)" "$(ck half)" 0 || fail "resumed: the final checkpoint ≠ the uninterrupted run's"
ok "cnn resident: 4 steps, a checkpoint and a resume = 8 steps on the emulated GPU, bit for bit"

run cpu2 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}"
run gpu2 env DDP_EMU_GPUS=2 DDP_GPU_MODULE=$MODULE DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 \
    DDP_REQUIRE_GPU=1 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" "${GPU[@]}" \
    --bucket_kb 1
losses cpu2/metrics.jsonl gpu2/metrics.jsonl 8 1e-5 || fail "2 ranks: cuda (emulated) ≠ cpu"
[ -n "$(acc cpu2.out)" ] && [ "$(acc cpu2.out)" = "$(acc gpu2.out)" ] ||
    fail "2 ranks, test accuracy: cpu $(acc cpu2.out), cuda $(acc gpu2.out)"
tensors "$(ck cpu2)" "$(ck gpu2)" 1e-5 || fail "2 ranks: the checkpoint ≠ the cpu's"
ok "cnn resident, 2 ranks over cuda-staged: the cpu's losses, test accuracy $(acc gpu2.out) and checkpoint"
# the same 2 ranks sharing ONE emulated GPU: auto's cuda-ipc (gpu-check's fashion-cnn runs so)
run gpu2i env DDP_EMU_GPUS=1 DDP_GPU_MODULE=$MODULE DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 \
    DDP_REQUIRE_GPU=1 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --bucket_kb 1
grep -q 'gradients on the GPU over cuda-ipc' gpu2i.out || { cat gpu2i.out; fail "2 ranks on one GPU: not cuda-ipc"; }
losses cpu2/metrics.jsonl gpu2i/metrics.jsonl 8 1e-5 || fail "2 ranks over cuda-ipc: cuda (emulated) ≠ cpu"
tensors "$(ck cpu2)" "$(ck gpu2i)" 1e-5 || fail "2 ranks over cuda-ipc: the checkpoint ≠ the cpu's"
ok "cnn resident, 2 ranks on one emulated GPU over cuda-ipc: the cpu's losses and checkpoint"
# channels 3,5 so that batchnorm's γ, β (3 or 5 floats) and the conv weights are not 16-byte
# aligned in the reducer's buckets, nor, sharded (ZeRO-1), in its packed copy of the parameters
# that the model is bound to: the strict emulated cuDNN aborts if one reaches it. Seed 1: with
# seed 9 these runs' checkpoints differ from the cpu's by 1.8e-4 of conv1.weight's momentum (and,
# by step 8, 2e-5 of bn1.weight's), the device's resident and host-driven runs bit for bit the
# same: at step 3 rank 0's first max-pool has a window whose two largest inputs are 2 ulp apart
# (1.32586622, 1.32586598), the cpu's float and the emulated cuDNN's double arithmetic pick
# different ones, and that one pooled pixel's gradient reaches conv1.weight's channel 2 through
# a different input patch (4.1e-5 there, 4e-8 in the other channels); not a reducer's or the
# device path's fault, the max-pool's gradient being discontinuous at a tie
SH=(--model.type cnn --data.dir "$T/slice" --model.channels 3,5 --model.hidden 16
    --batch_size 16 --total_steps 8 --optimizer sgd --lr 0.05 --momentum 0.9
    --schedule constant --log_every 1 --seed 1)
run scpu2 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${SH[@]}"
run u2 env DDP_EMU_GPUS=2 DDP_GPU_MODULE=$MODULE DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 \
    DDP_REQUIRE_GPU=1 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${SH[@]}" "${GPU[@]}" \
    --bucket_kb 1
run csh2 env DDP_EMU_GPUS=2 DDP_GPU_MODULE=$MODULE DDP_CUDNN_LIB=$CUDNN DDP_EMU_CUDNN_STRICT=1 \
    DDP_REQUIRE_GPU=1 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${SH[@]}" "${GPU[@]}" \
    --bucket_kb 1 --shard_optimizer true
grep -q "optimizer step sharded (ZeRO-1)" csh2.out || fail "the cnn's emulated GPUs' run is not sharded"
losses scpu2/metrics.jsonl u2/metrics.jsonl 8 1e-5 || fail "cnn 3,5: cuda (emulated) ≠ cpu"
losses scpu2/metrics.jsonl csh2/metrics.jsonl 8 1e-5 || fail "cnn sharded: cuda (emulated) ≠ cpu"
tensors "$(ck scpu2)" "$(ck u2)" 1e-5 || fail "cnn 3,5: the checkpoint ≠ the cpu's"
tensors "$(ck scpu2)" "$(ck csh2)" 1e-5 || fail "cnn sharded: the checkpoint ≠ the cpu's"
ok "cnn 3,5 resident at 2 ranks, unsharded and sharded (ZeRO-1): the cpu's losses and checkpoint"

MLP=(--model.type mlp --data.dir "$T/slice" --model.hidden 32 --model.dropout 0.2 --batch_size 16
     --total_steps 8 --optimizer adamw --lr 0.003 --weight_decay 0.01 --schedule constant
     --log_every 1 --seed 9)
run mcpu "$TRAIN" "${MLP[@]}"
run mgpu emu "$TRAIN" "${MLP[@]}" "${GPU[@]}"
losses mcpu/metrics.jsonl mgpu/metrics.jsonl 8 1e-5 || fail "mlp: cuda (emulated) ≠ cpu"
tensors "$(ck mcpu)" "$(ck mgpu)" 5e-5 || fail "mlp: the resident checkpoint ≠ the cpu's"
run mhost emu "$TRAIN" "${MLP[@]}" --device cuda --resident false
tensors "$(ck mhost)" "$(ck mgpu)" 0 || fail "mlp: host-driven's checkpoint ≠ resident's"
run mcpu2 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${MLP[@]}"
grep -q "optimizer step sharded (ZeRO-1)" mcpu2.out || fail "the cpu's 2 ranks are not sharded"
run msh2 env DDP_EMU_GPUS=2 DDP_GPU_MODULE=$MODULE DDP_REQUIRE_GPU=1 "$DDPRUN" --standalone \
    --nproc_per_node=2 "$TRAIN" "${MLP[@]}" "${GPU[@]}" --shard_optimizer true --bucket_kb 1
grep -q "optimizer step sharded (ZeRO-1)" msh2.out || fail "the emulated GPUs' run is not sharded"
losses mcpu2/metrics.jsonl msh2/metrics.jsonl 8 1e-5 || fail "mlp sharded: cuda (emulated) ≠ cpu"
tensors "$(ck mcpu2)" "$(ck msh2)" 5e-5 || fail "mlp sharded: the checkpoint ≠ the cpu's"
ok "mlp with dropout, AdamW, resident: = the cpu's at 1 rank (= host-driven bit for bit) and sharded (ZeRO-1) at 2 ranks"
