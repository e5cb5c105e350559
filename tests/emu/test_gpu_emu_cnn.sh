#!/usr/bin/env bash
# gpu_emu.ddptrain_cnn: ddptrain --model.type cnn --device cuda end to end on the emulated GPU
# module (classifier.cu's convolutions and batchnorm through the emulated cuDNN, cudnn_emu.cpp),
# on a slice of Fashion-MNIST (the first 256 training and 128 test images, written here as idx
# files: the emulated convolutions are plain loops), against the same run on the cpu: 8 SGD
# steps in fp32, the losses within 1e-5 relative (cuDNN's products here in double, the CPU's in
# float) and the same test accuracy; then 8 steps in bf16, within 5e-2 of the cpu's fp32.
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
acc() { sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$1" | tail -1; }
rc=0; "$TRAIN" "${ARGS[@]}" --out_dir cpu >cpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu.out; fail "cpu run: exit $rc"; }
rc=0; emu "$TRAIN" "${ARGS[@]}" --device cuda --out_dir gpu >gpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu.out; fail "emulated cuda run: exit $rc"; }
grep -q 'emulated on the CPU' gpu.out || { cat gpu.out; fail "the run did not name the emulated GPU"; }
losses cpu/metrics.jsonl gpu/metrics.jsonl 8 1e-5 || fail "fp32: cuda (emulated) ≠ cpu"
[ -n "$(acc cpu.out)" ] && [ "$(acc cpu.out)" = "$(acc gpu.out)" ] ||
    { tail -3 cpu.out gpu.out; fail "test accuracy: cpu $(acc cpu.out), cuda $(acc gpu.out)"; }
ok "cnn fp32: 8 steps on the emulated GPU = the cpu's (test accuracy $(acc gpu.out) both)"
rc=0; emu "$TRAIN" "${ARGS[@]}" --device cuda --precision bf16 --out_dir bf16 >bf16.out 2>&1 ||
    rc=$?
[ $rc -eq 0 ] || { cat bf16.out; fail "emulated cuda bf16 run: exit $rc"; }
losses cpu/metrics.jsonl bf16/metrics.jsonl 8 5e-2 || fail "bf16: cuda (emulated) too far from cpu fp32"
ok "cnn bf16: 8 steps on the emulated GPU within 5e-2 of the cpu's fp32"
