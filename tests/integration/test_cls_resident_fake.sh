#!/usr/bin/env bash
# The MLP and CNN's device-resident path (ddptrain --device cuda, resident auto: docs/gpu.md
# "Device-resident training") end to end without a GPU: the GPU module is the test-only
# fake_gpu_gpt, whose MLP/CNN is the CPU classifier with its parameters, gradients and optimizer
# state in "device" memory (fake_gpu_cls.c), the gradients' GPU group cuda-ipc or cuda-staged on
# the fake GPU (DDP_TEST_FAKE_GPU_OPEN=1: the module adds into the reducer's buckets). Checks the
# orchestration, bit for bit against the cpu (the same CPU arithmetic in the same order): the
# CNN at 1 rank (losses, test accuracy, and the checkpoint's every tensor — weights, batchnorm
# running statistics, momentum — equal to the cpu run's file) and at 2 ranks (the running
# statistics on the device, broadcast from rank 0 over the GPU group before the evaluation);
# the MLP with dropout and gradient accumulation at 2 ranks (accumulated on the device buckets);
# the sharded optimizer step (ZeRO-1) with AdamW; a checkpoint taken on the fake GPU resumed
# there = the uninterrupted run, and resumed on the cpu = the cpu's; fp16's loss scaling with an
# inf on rank 1 (both skip, the scale halves); test and predict from a checkpoint resident. The
# CUDA kernels are gpu_emu's (gpu_emu.ddptrain_cnn, gpu_emu.cuda_classifier) and gpu-check's.
. "$(dirname "$0")/lib.sh"
MODULE=${2:?usage: $0 BINDIR FAKE_MODULE}
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
fake() { DDP_GPU_MODULE=$MODULE DDP_TEST_FAKE_GPUS=1 DDP_TEST_FAKE_GPU_OPEN=1 "$@"; }

# losses A B TOL [FROM]: the training losses (steps FROM.. of A, default all) agree (relative)
losses() {
    python3 - "$@" <<'EOP'
import json, sys
def read(p):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
x, y, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
lo = int(sys.argv[4]) if len(sys.argv) > 4 else min(x)
steps = [s for s in x if s >= lo]
assert steps and all(s in y for s in steps), (sorted(x), sorted(y))
d = max(abs(x[s] - y[s]) / abs(x[s]) for s in steps)
print(f"{len(steps)} steps: largest relative difference {d:.1e}")
sys.exit(0 if d <= tol else 1)
EOP
}
# same_tensors A B: two checkpoints hold the same tensors, bit for bit (the metadata aside)
same_tensors() {
    python3 - "$@" <<'EOP'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
diff = [k for k in a if a[k] != b[k]]
print(f"{len(a)} tensors, {len(diff)} differ {diff[:5]}")
sys.exit(1 if diff else 0)
EOP
}
acc() { grep -o "test accuracy [0-9.]*" "$1" | tail -1; }

CNN=(--model.type cnn --model.channels 4,8 --model.hidden 16 --batch_size 32 --total_steps 12
     --eval_every 12 --log_every 1 --lr 0.05 --seed 3 --checkpoint.every 12)
rc=0; "$TRAIN" "${CNN[@]}" --out_dir cpu >cpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu.out; fail "cnn on the cpu: exit $rc"; }
rc=0; fake "$TRAIN" "${CNN[@]}" --device cuda --out_dir gpu >gpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu.out; fail "cnn resident on fake cuda: exit $rc"; }
assert_contains gpu.out "gradients on the GPU over cuda-ipc"
losses cpu/metrics.jsonl gpu/metrics.jsonl 0 || fail "cnn: 12 resident steps differ from the cpu"
[ -n "$(acc cpu.out)" ] && [ "$(acc cpu.out)" = "$(acc gpu.out)" ] ||
    fail "cnn test accuracy: cpu '$(acc cpu.out)', resident '$(acc gpu.out)'"
same_tensors cpu/checkpoints/step12.safetensors gpu/checkpoints/step12.safetensors ||
    fail "cnn: the resident checkpoint's tensors differ from the cpu's"
ok "cnn resident, 1 rank: the cpu's losses and $(acc gpu.out) bit for bit; the checkpoint (weights, running statistics, momentum) = the cpu's file"
rc=0; fake "$TRAIN" --task test --out_dir gpu --device cuda >test.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat test.out; fail "test resident on fake cuda: exit $rc"; }
assert_contains test.out "$(acc cpu.out)"
rc=0; "$TRAIN" --task predict --out_dir gpu --device cpu --predict_out cpu.csv >/dev/null 2>&1 || rc=$?
rc2=0; fake "$TRAIN" --task predict --out_dir gpu --device cuda --predict_out gpu.csv >pred.out 2>&1 ||
    rc2=$?
[ $rc -eq 0 ] && [ $rc2 -eq 0 ] || { cat pred.out; fail "predict: exit $rc (cpu), $rc2 (fake cuda)"; }
cmp -s cpu.csv gpu.csv || fail "predictions resident on fake cuda differ from the cpu's"
ok "test and predict resident on fake cuda (the statistics uploaded with the weights): the cpu's"

rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${CNN[@]}" --out_dir cpu2 >cpu2.out 2>&1 ||
    rc=$?
[ $rc -eq 0 ] || { cat cpu2.out; fail "cnn, 2 cpu ranks: exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${CNN[@]}" --device cuda \
    --overlap async --bucket_kb 1 --out_dir gpu2 >gpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2.out; fail "cnn resident, 2 ranks: exit $rc"; }
losses cpu2/metrics.jsonl gpu2/metrics.jsonl 0 || fail "cnn, 2 ranks: resident differs from the cpu"
[ "$(acc cpu2.out)" = "$(acc gpu2.out)" ] ||
    fail "cnn, 2 ranks, test accuracy: cpu '$(acc cpu2.out)', resident '$(acc gpu2.out)'"
same_tensors cpu2/checkpoints/step12.safetensors gpu2/checkpoints/step12.safetensors ||
    fail "cnn, 2 ranks: the resident checkpoint differs from the cpu's"
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${CNN[@]}" --device cuda \
    --gpu_backend cuda-staged --out_dir gpu2s >gpu2s.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2s.out; fail "cnn resident, 2 ranks over cuda-staged: exit $rc"; }
assert_contains gpu2s.out "gradients on the GPU over cuda-staged"
losses cpu2/metrics.jsonl gpu2s/metrics.jsonl 0 || fail "cnn, cuda-staged: differs from the cpu"
ok "cnn resident, 2 ranks (1 KiB buckets launched from backward; cuda-ipc and cuda-staged): the cpu's losses, $(acc gpu2.out) and checkpoint bit for bit"

MLP=(--model.type mlp --model.hidden 32 --model.dropout 0.3 --batch_size 16 --total_steps 8
     --grad_accum 2 --log_every 1 --eval_every 8 --seed 5)
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${MLP[@]}" --out_dir mcpu2 >mcpu2.out 2>&1 ||
    rc=$?
[ $rc -eq 0 ] || { cat mcpu2.out; fail "mlp, 2 cpu ranks: exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${MLP[@]}" --device cuda \
    --out_dir mgpu2 >mgpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat mgpu2.out; fail "mlp resident, 2 ranks: exit $rc"; }
# exact, where the host-driven path is 1e-6 (test_cls_fake.sh): the gradients accumulate in the
# device buckets as the cpu's do in its own, inside the products
losses mcpu2/metrics.jsonl mgpu2/metrics.jsonl 0 || fail "mlp, 2 ranks: resident differs from the cpu"
ok "mlp resident with dropout and grad_accum 2, 2 ranks: the cpu's losses bit for bit"

# The sharded step on the device (ZeRO-1, AdamW): the cpu's 2 ranks shard too (auto on shm).
ADAM=(--optimizer adamw --lr 0.003 --weight_decay 0.01)
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${CNN[@]}" "${ADAM[@]}" --out_dir acpu2 \
    >acpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat acpu2.out; fail "cnn adamw, 2 cpu ranks: exit $rc"; }
grep -q "optimizer step sharded (ZeRO-1)" acpu2.out || fail "the cpu's 2 ranks are not sharded"
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${CNN[@]}" "${ADAM[@]}" --device cuda \
    --shard_optimizer true --bucket_kb 1 --out_dir sh2 >sh2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat sh2.out; fail "cnn adamw sharded resident, 2 ranks: exit $rc"; }
assert_contains sh2.out "optimizer step sharded (ZeRO-1), each rank keeping 1/2 of its state"
losses acpu2/metrics.jsonl sh2/metrics.jsonl 0 || fail "sharded resident differs from the cpu"
same_tensors acpu2/checkpoints/step12.safetensors sh2/checkpoints/step12.safetensors ||
    fail "sharded resident: the checkpoint (AdamW state gathered on the device) differs from the cpu's"
ok "cnn AdamW sharded (ZeRO-1) on the device, 2 ranks: the cpu's losses and checkpoint bit for bit"

# A checkpoint taken resident: resumed there = the uninterrupted run; resumed on the cpu = the
# cpu's run (the file holds the device's weights, statistics and AdamW state).
HALF=("${CNN[@]}" "${ADAM[@]}" --schedule constant --checkpoint.every 6)
rc=0; "$TRAIN" "${HALF[@]}" --out_dir afull >afull.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat afull.out; fail "cnn adamw, cpu: exit $rc"; }
rc=0; fake "$TRAIN" "${HALF[@]}" --device cuda --out_dir gfull >gfull.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gfull.out; fail "cnn adamw resident: exit $rc"; }
rc=0; fake "$TRAIN" "${HALF[@]}" --device cuda --total_steps 6 --out_dir half >half.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat half.out; fail "cnn adamw resident, 6 steps: exit $rc"; }
cp -r half halfcpu
rc=0; fake "$TRAIN" "${HALF[@]}" --device cuda --resume_from latest --out_dir half >half2.out 2>&1 ||
    rc=$?
[ $rc -eq 0 ] || { cat half2.out; fail "resume resident: exit $rc"; }
losses gfull/metrics.jsonl half/metrics.jsonl 0 7 || fail "resumed resident differs from uninterrupted"
same_tensors gfull/checkpoints/step12.safetensors half/checkpoints/step12.safetensors ||
    fail "resumed resident: the final checkpoint differs from the uninterrupted run's"
rc=0; "$TRAIN" "${HALF[@]}" --resume_from latest --out_dir halfcpu >halfcpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat halfcpu.out; fail "resume the resident checkpoint on the cpu: exit $rc"; }
losses afull/metrics.jsonl halfcpu/metrics.jsonl 0 7 ||
    fail "the resident checkpoint resumed on the cpu differs from the cpu run"
ok "a resident checkpoint (step 6) resumes resident = uninterrupted, and on the cpu = the cpu's run, bit for bit"

# fp16: the loss scaled by 65536, unscaled on the device buckets (exact: powers of two); an inf
# on rank 1 alone at its 3rd backward (step 2 of grad_accum 2) skips the step on both ranks.
rc=0; fake env DDP_TEST_FAKE_GPU_INF_AT=3 DDP_TEST_FAKE_GPU_INF_RANK=1 "$DDPRUN" --standalone \
    --nproc_per_node=2 "$TRAIN" "${MLP[@]}" --device cuda --precision fp16 --out_dir inf \
    >inf.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat inf.out; fail "mlp fp16 resident with an inf, 2 ranks: exit $rc"; }
assert_contains inf.out "step 2: inf or NaN gradients at loss scale 65536: optimizer step skipped, loss scale now 32768"
[ "$(grep -c 'optimizer step skipped' inf.out)" = 1 ] || fail "more than one skip reported"
grep -q '"step": 8, .*"loss_scale": 32768, "skipped_steps": 1' inf/metrics.jsonl ||
    fail "mlp fp16 resident with an inf: the scale or the skip count at step 8 is wrong"
python3 - mcpu2/metrics.jsonl inf/metrics.jsonl <<'EOP' || fail "fp16 resident: step 1 differs from fp32's"
import json, sys
r = lambda p: {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
sys.exit(0 if r(sys.argv[1])[1] == r(sys.argv[2])[1] else 1)
EOP
ok "mlp fp16 resident, 2 ranks: scaled and unscaled exactly; an inf on rank 1 skipped step 2 on both and halved the scale"
