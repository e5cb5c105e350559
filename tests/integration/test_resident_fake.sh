#!/usr/bin/env bash
# ddptrain's device-resident GPU path (docs/gpu.md), end to end without a GPU: the GPU module is
# the test-only fake_gpu_gpt (its "GPU GPT" is the CPU GPT, its device memory host memory), the
# gradients' GPU group runs cuda-ipc (auto; cuda-staged named once) on the fake GPU. Checks the
# orchestration: the DDP line names the gradients' group; 10 steps on "cuda" = 10 on the cpu (1 and 2 ranks); a checkpoint
# taken on "cuda" holds the trained weights and AdamW state (resuming it on the cpu continues the
# cpu run) and resumes on "cuda" = the uninterrupted run; test from it on "cuda". And fp16's
# dynamic loss scaling (GradScaler): scaled and unscaled exactly (= the float32 run); an inf on
# rank 1 alone skips the step on both ranks and halves the scale; a resume after a skip carries
# the scale and AdamW's step count. The CUDA kernels themselves are scripts/gpu-check.sh's.
. "$(dirname "$0")/lib.sh"
MODULE=${2:?usage: $0 BINDIR FAKE_MODULE}
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
tiny_gpt
ARGS=("${TINY_GPT[@]}")
fake() { DDP_GPU_MODULE=$MODULE DDP_TEST_FAKE_GPUS=1 DDP_TEST_FAKE_GPU_OPEN=1 "$@"; }

# losses A B FROM TO TOL: the training losses of steps FROM..TO in two metrics files agree
losses() {
    python3 - "$@" <<'EOP'
import json, sys
a, b, lo, hi, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def read(p):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
x, y = read(a), read(b)
d = max(abs(x[s] - y[s]) / abs(x[s]) for s in range(lo, hi + 1))
print(f"steps {lo}-{hi}: largest relative difference {d:.1e}")
sys.exit(0 if d <= tol else 1)
EOP
}

rc=0; "$TRAIN" "${ARGS[@]}" --total_steps 10 --out_dir cpu >cpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu.out; fail "cpu run: exit $rc"; }
rc=0; fake "$TRAIN" "${ARGS[@]}" --device cuda --total_steps 10 --out_dir gpu >gpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu.out; fail "fake cuda run: exit $rc"; }
assert_contains gpu.out "gradients on the GPU over cuda-ipc"
assert_contains gpu.out "device cuda:0 (Fake GPU 0"
losses cpu/metrics.jsonl gpu/metrics.jsonl 1 10 1e-5 || fail "10 steps on fake cuda differ from the cpu"
ok "device-resident: 10 steps on the fake GPU = 10 on the cpu; the DDP line names the gradients' GPU group"

rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --total_steps 6 \
    --out_dir cpu2 >cpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu2.out; fail "2 ranks on the cpu: exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --total_steps 6 --overlap async --bucket_kb 8 --out_dir gpu2 >gpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2.out; fail "2 ranks on fake cuda: exit $rc"; }
losses cpu2/metrics.jsonl gpu2/metrics.jsonl 1 6 1e-5 || fail "2 ranks: fake cuda differs from the cpu"
assert_contains gpu2.out "gradients on the GPU over cuda-ipc"
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --total_steps 6 --gpu_backend cuda-staged --out_dir gpu2s >gpu2s.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2s.out; fail "2 ranks on fake cuda over cuda-staged: exit $rc"; }
assert_contains gpu2s.out "gradients on the GPU over cuda-staged"
losses cpu2/metrics.jsonl gpu2s/metrics.jsonl 1 6 1e-5 || fail "2 ranks: cuda-staged differs from the cpu"
ok "device-resident, 2 ranks sharing the fake GPU, small buckets launched from backward on the progress thread: the same losses as 2 cpu ranks"

# CUDA IPC refused (rank 1's opens fail, as in a container without a shared IPC namespace):
# auto's cuda-ipc gives way to cuda-staged on both ranks, the DDP line says why, same losses.
rc=0; fake env DDP_TEST_FAKE_IPC_REFUSED=1 "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" \
    "${ARGS[@]}" --device cuda --total_steps 3 --out_dir refused >refused.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat refused.out; fail "CUDA IPC refused: exit $rc"; }
assert_contains refused.out "gradients on the GPU over cuda-staged: ranks share a GPU, and cuda-ipc: member 1"
assert_contains refused.out "(CUDA IPC refused:"
losses cpu2/metrics.jsonl refused/metrics.jsonl 1 3 1e-5 || fail "the fallback's losses differ"
ok "CUDA IPC refused on one rank: auto falls back to cuda-staged on both, says why, same losses"

# Dropout on the GPU (every dropout of the model: the embedding's, the attention probabilities',
# the residual branches'): the module gets the model's seed and each batch's step and first
# sample, the masks are the CPU's, so 2 ranks with dropout 0.1 on the fake GPU = on the cpu.
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --model.dropout 0.1 \
    --total_steps 6 --out_dir dropc >dropc.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat dropc.out; fail "dropout, 2 cpu ranks: exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --model.dropout 0.1 \
    --device cuda --total_steps 6 --out_dir dropg >dropg.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat dropg.out; fail "dropout, 2 ranks on fake cuda: exit $rc"; }
losses dropc/metrics.jsonl dropg/metrics.jsonl 1 6 0 || fail "dropout on fake cuda differs from the cpu"
losses cpu2/metrics.jsonl dropg/metrics.jsonl 1 1 1e-6 && fail "dropout 0.1 changed no loss"
ok "dropout 0.1 on the fake GPU, 2 ranks: the cpu's masks and losses bit for bit"

# The sharded optimizer step on the GPU (ZeRO-1): the buckets reduce-scattered on the GPU group,
# each rank's AdamW on its shard on the device, the parameters (bound to the reducer's, as on the
# cpu) allgathered. The cpu's 2 ranks shard too (shard_optimizer auto on shm): the same sums in
# the same order, so the losses are equal bit for bit. Each rank's device optimizer keeps its
# shard's state only (ZeRO-1's memory split: ddp_model_device_keep); a checkpoint from it holds
# the whole AdamW state (the shards streamed from the devices into rank 0's file): resumed on the
# cpu, it continues the cpu run exactly, and its tensors are the unsharded cpu run's.
grep -q "optimizer step sharded (ZeRO-1)" cpu2.out || fail "the cpu's 2 ranks are not sharded"
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --shard_optimizer true --total_steps 6 --overlap async --bucket_kb 8 --out_dir sh2 \
    >sh2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat sh2.out; fail "sharded, 2 ranks on fake cuda: exit $rc"; }
assert_contains sh2.out "gradients on the GPU over cuda-ipc"
assert_contains sh2.out "optimizer step sharded (ZeRO-1), each rank keeping 1/2 of its state"
grep -q "optimizer step sharded" gpu2.out && fail "shard_optimizer auto sharded on the GPU"
losses cpu2/metrics.jsonl sh2/metrics.jsonl 1 6 0 || fail "sharded on fake cuda differs from the cpu"
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --shard_optimizer true --total_steps 3 --checkpoint.every 3 --out_dir sh3 >sh3.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat sh3.out; fail "sharded, 3 steps on fake cuda: exit $rc"; }
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --total_steps 6 \
    --resume_from latest --out_dir sh3 >sh3b.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat sh3b.out; fail "resuming the sharded GPU checkpoint on the cpu: exit $rc"; }
losses cpu2/metrics.jsonl sh3/metrics.jsonl 4 6 0 ||
    fail "the sharded GPU checkpoint resumed on the cpu differs: AdamW state not gathered"
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --total_steps 3 \
    --shard_optimizer false --checkpoint.every 3 --out_dir un3 >un3.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat un3.out; fail "unsharded cpu run, 3 steps: exit $rc"; }
"$BIN/ckpt_tool" dump un3/checkpoints/step3.safetensors | grep '^T ' >un3.txt
"$BIN/ckpt_tool" dump sh3/checkpoints/step3.safetensors | grep '^T ' >sh3.txt
grep -q '^T .* ' sh3.txt && [ "$(grep -c . sh3.txt)" -gt 20 ] || fail "no tensors dumped from sh3"
cmp -s un3.txt sh3.txt || fail "the sharded GPU checkpoint's tensors differ from the unsharded cpu run's"
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --shard_optimizer true --total_steps 3 --checkpoint.every 3 --out_dir sh4 >sh4.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat sh4.out; fail "sharded, 3 steps on fake cuda (2): exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --shard_optimizer true --total_steps 6 --resume_from latest --out_dir sh4 >sh4b.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat sh4b.out; fail "resuming sharded on fake cuda: exit $rc"; }
losses cpu2/metrics.jsonl sh4/metrics.jsonl 4 6 0 || fail "sharded resume on fake cuda differs"
ok "sharded optimizer step on the fake GPU, each rank keeping half the state: = 2 sharded cpu ranks bit for bit; its checkpoint = the unsharded cpu run's, resumes on the cpu and, sharded, on the fake GPU exactly; auto leaves it off on the GPU"

# A checkpoint taken on the GPU: resumed there = the uninterrupted run; the file holds the
# device's weights and optimizer state (the cpu resumes it and continues the same way).
rc=0; fake "$TRAIN" "${ARGS[@]}" --device cuda --total_steps 5 --checkpoint.every 5 \
    --out_dir half >half.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat half.out; fail "5 steps on fake cuda: exit $rc"; }
cp -r half halfcpu
rc=0; fake "$TRAIN" "${ARGS[@]}" --device cuda --total_steps 10 --resume_from latest \
    --out_dir half >half2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat half2.out; fail "resume on fake cuda: exit $rc"; }
losses gpu/metrics.jsonl half/metrics.jsonl 6 10 1e-5 || fail "resumed on fake cuda differs"
rc=0; "$TRAIN" "${ARGS[@]}" --total_steps 10 --resume_from latest --out_dir halfcpu \
    >halfcpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat halfcpu.out; fail "resume on the cpu: exit $rc"; }
losses cpu/metrics.jsonl halfcpu/metrics.jsonl 6 10 1e-5 ||
    fail "the GPU's checkpoint resumed on the cpu differs: weights or AdamW state not saved"
ok "a checkpoint taken on the fake GPU resumes there and on the cpu = the uninterrupted runs"

ck=$(ls half/checkpoints/step10.safetensors)
rc=0; fake "$TRAIN" --task test --device cuda --checkpoint "$ck" --out_dir half \
    --data.text "$T/text.txt" --data.doc_sep % --eval_windows 8 >test.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat test.out; fail "test on fake cuda: exit $rc"; }
rc=0; "$TRAIN" --task test --device cpu --checkpoint "$ck" --out_dir half --data.text "$T/text.txt" \
    --data.doc_sep % --eval_windows 8 >testcpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat testcpu.out; fail "test on the cpu: exit $rc"; }
a=$(grep -o 'val loss [0-9.]*' test.out | tail -1); b=$(grep -o 'val loss [0-9.]*' testcpu.out | tail -1)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "test on fake cuda '$a' vs cpu '$b'"
ok "test from the checkpoint on the fake GPU: $a, as on the cpu"

# gpt_dump's fp16 loop (what test_gpt_bf16_torch.py fp16 runs against torch's GradScaler on a
# GPU): on the fake GPU, whose arithmetic is float32's, 10 steps = float32 on the cpu exactly,
# and every step used the loss scale 65536.
mkdir -p gd32 gd16
/usr/bin/env python3 - gd32 <<'EOP'
import struct, sys
def w(name, seed):
    v, x = [], seed
    for _ in range(10 * 2 * 8):
        x = (x * 1103515245 + 12345) % 2**31
        v.append(x % 50)
    open(f"{sys.argv[1]}/{name}", "wb").write(struct.pack(f"<{len(v)}i", *v))
w("tokens.bin", 1); w("targets.bin", 2)
EOP
cp gd32/tokens.bin gd32/targets.bin gd16/
GD=("$BIN/gpt_dump" train 1 2 16 8 50 1 2 10 0.001 0)
OPENBLAS_NUM_THREADS=1 "${GD[0]}" gd32 "${GD[@]:1}" >gd32.out 2>&1 || { cat gd32.out; fail "gpt_dump fp32"; }
fake env DDP_GPT_DUMP_DEVICE=cuda DDP_GPT_DUMP_PRECISION=fp16 OPENBLAS_NUM_THREADS=1 \
    "${GD[0]}" gd16 "${GD[@]:1}" >gd16.out 2>&1 || { cat gd16.out; fail "gpt_dump fp16 on fake cuda"; }
cmp gd32/out_loss.bin gd16/out_loss.bin || fail "gpt_dump fp16 (loss scaling) on the fake GPU: losses differ from fp32's"
/usr/bin/env python3 -c "
import struct, sys
v = struct.unpack('<10d', open('gd16/out_scale.bin', 'rb').read())
sys.exit(0 if v == (65536.0,) * 10 else 'scales %s' % (v,))" || fail "gpt_dump fp16: loss scales"
ok "gpt_dump fp16's GradScaler loop on the fake GPU: = fp32 bit for bit, scale 65536 each step"

# fp16: the loss scaled by 65536 and the gradients unscaled, exactly (powers of two): = float32.
rc=0; fake "$TRAIN" "${ARGS[@]}" --device cuda --precision fp16 --total_steps 10 --out_dir f16 \
    >f16.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat f16.out; fail "fp16 on fake cuda: exit $rc"; }
losses cpu/metrics.jsonl f16/metrics.jsonl 1 10 1e-5 || fail "fp16 with loss scaling differs"
grep -q '"loss_scale": 65536, "skipped_steps": 0' f16/metrics.jsonl || fail "fp16: no loss_scale"
# TensorBoard holds them too (tags are stored as plain bytes in the records).
grep -qa 'train/loss_scale' f16/tb/events.out.tfevents.* || fail "fp16: no train/loss_scale in TensorBoard"
grep -qa 'train/skipped_steps' f16/tb/events.out.tfevents.* || fail "fp16: no train/skipped_steps in TensorBoard"
ok "fp16 loss scaling on the fake GPU: scaled and unscaled exactly, scale 65536 in the metrics and TensorBoard"

# An inf on rank 1 alone at step 3: both ranks skip it, the scale halves, the run goes on; a
# checkpoint after the skip resumes = the uninterrupted run (scale and AdamW's step saved).
INF=(env DDP_TEST_FAKE_GPU_INF_AT=3 DDP_TEST_FAKE_GPU_INF_RANK=1)
rc=0; fake "${INF[@]}" "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
    --device cuda --precision fp16 --total_steps 10 --out_dir inf >inf.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat inf.out; fail "fp16 with an inf: exit $rc"; }
assert_contains inf.out "step 3: inf or NaN gradients at loss scale 65536: optimizer step skipped, loss scale now 32768"
[ "$(grep -c 'optimizer step skipped' inf.out)" = 1 ] || fail "more than one skip reported"
grep -q '"step": 10, .*"loss_scale": 32768, "skipped_steps": 1' inf/metrics.jsonl ||
    fail "fp16 with an inf: the scale or the skip count at step 10 is wrong"
losses cpu2/metrics.jsonl inf/metrics.jsonl 1 2 1e-5 || fail "fp16 2 ranks: steps before the inf differ"
rc=0; fake "${INF[@]}" "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
    --device cuda --precision fp16 --total_steps 5 --checkpoint.every 5 --out_dir infr \
    >infr.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat infr.out; fail "fp16 with an inf, 5 steps: exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda \
    --precision fp16 --total_steps 10 --resume_from latest --out_dir infr >infr2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat infr2.out; fail "fp16 resume after a skip: exit $rc"; }
losses inf/metrics.jsonl infr/metrics.jsonl 6 10 1e-5 || fail "fp16 resume after a skip differs"
grep -q '"step": 10, .*"loss_scale": 32768' infr/metrics.jsonl || fail "resume lost the loss scale"
ok "fp16: an inf on rank 1 skipped step 3 on both ranks and halved the scale; resumed after it = uninterrupted"
rc=0; fake "${INF[@]}" "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
    --device cuda --precision fp16 --shard_optimizer true --total_steps 10 --out_dir infsh \
    >infsh.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat infsh.out; fail "fp16 sharded with an inf: exit $rc"; }
grep -q '"step": 10, .*"loss_scale": 32768, "skipped_steps": 1' infsh/metrics.jsonl ||
    fail "fp16 sharded with an inf: the scale or the skip count at step 10 is wrong"
losses inf/metrics.jsonl infsh/metrics.jsonl 1 10 0 || fail "fp16 sharded with an inf differs"
ok "fp16 with the sharded step: the same skip, scale and losses"


# N ranks × B ≡ 1 rank × N·B on the device-resident path (the windows follow the global sample).
rc=0; fake "$TRAIN" "${ARGS[@]}" --device cuda --batch_size 8 --total_steps 6 --out_dir one8 \
    >one8.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat one8.out; fail "1 rank × 8 on fake cuda: exit $rc"; }
losses one8/metrics.jsonl gpu2/metrics.jsonl 1 1 1e-6 || fail "2 ranks × 4 ≠ 1 rank × 8 (step 1)"
losses one8/metrics.jsonl gpu2/metrics.jsonl 2 6 1e-5 || fail "2 ranks × 4 ≠ 1 rank × 8"
ok "device-resident: 2 ranks × 4 windows = 1 rank × 8"

# A rank killed mid-training: its peer's collective on the GPU group fails, and ddprun ends the
# job with its summary, fast, leaving nothing behind.
env DDP_GPU_MODULE="$MODULE" DDP_TEST_FAKE_GPUS=1 DDP_TEST_FAKE_GPU_OPEN=1 "$DDPRUN" \
    --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --device cuda --total_steps 1000000 \
    --log_every 0 --out_dir killed >killed.out 2>&1 &
runner=$!
BG_PIDS+=("$runner")
victim=""
for _ in $(seq 200); do
    for p in $(pgrep -P "$runner" || true); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1' && victim=$p
    done
    [ -n "$victim" ] && grep -q "DDP:" killed.out 2>/dev/null && break
    sleep 0.05
done
[ -n "$victim" ] || { cat killed.out; fail "no rank 1 worker to kill"; }
sleep 0.5
t0=$(now_ms)
kill -KILL "$victim"
rc=0; wait "$runner" || rc=$?
took=$(($(now_ms) - t0))
[ $rc -ne 0 ] || fail "a killed rank: ddprun exited 0"
grep -q "rank 1" killed.out || { cat killed.out; fail "ddprun's summary does not name rank 1"; }
[ $took -lt 10000 ] || fail "a killed rank took $took ms to end the job"
[ -z "$(pgrep -P "$runner" || true)" ] || fail "workers left after the job ended"
ok "device-resident, a rank killed mid-training: the job ended in $took ms with ddprun's summary"
