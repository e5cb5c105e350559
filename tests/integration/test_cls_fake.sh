#!/usr/bin/env bash
# The MLP and CNN's host-driven device-cuda path (src/nn/classifier.c; ddptrain --resident
# false, the library's default; docs/gpu.md) end to end
# without a GPU: the GPU module is the test-only fake_gpu_gpt, whose MLP/CNN is the CPU classifier
# (fake_gpu_cls.c). Checks the host's side: ddptrain trains the CNN on "cuda" with the losses and
# test accuracy of the cpu run (parameters and running statistics uploaded each forward, the
# statistics brought back, gradients added into the reducer's buckets); 2 ranks with dropout; a
# checkpoint taken on "cuda" holds the running statistics (the cpu's test of it gives the same
# accuracy), and test and predict there give the cpu's; 2 ranks with dropout and gradient
# accumulation; precision bf16 reaches the module (the fake computes it as the CPU's bf16, so the
# losses are the cpu bf16 run's, not fp32's), fp16 runs GradScaler's loop (the loss scaled and the
# gradients unscaled exactly: the cpu's fp32 losses; an inf on one rank skips the step on both
# and halves the scale); fp16 on the cpu is still refused. The CUDA kernels and cuDNN are
# test_cuda_classifier's.
. "$(dirname "$0")/lib.sh"
MODULE=${2:?usage: $0 BINDIR FAKE_MODULE}
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
fake() { DDP_GPU_MODULE=$MODULE DDP_TEST_FAKE_GPUS=1 "$@"; }
# ddptrain goes device-resident on cuda by default (test_cls_resident_fake.sh); this test holds
# the host-driven path, which resident false keeps (the cpu runs ignore it)
HOST=(--resident false)

# losses A B TOL: every training loss in two metrics files agrees (relative)
losses() {
    python3 - "$@" <<'EOP'
import json, sys
def read(p):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
x, y, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
assert x and x.keys() == y.keys(), (sorted(x), sorted(y))
d = max(abs(x[s] - y[s]) / abs(x[s]) for s in x)
print(f"{len(x)} steps: largest relative difference {d:.1e}")
sys.exit(0 if d <= tol else 1)
EOP
}

CNN=(--model.type cnn --model.channels 4,8 --model.hidden 16 --batch_size 32 --total_steps 12
     --eval_every 12 --log_every 1 --lr 0.05 --seed 3 --checkpoint.every 12 "${HOST[@]}")
rc=0; "$TRAIN" "${CNN[@]}" --out_dir cpu >cpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu.out; fail "cnn on the cpu: exit $rc"; }
rc=0; fake "$TRAIN" "${CNN[@]}" --device cuda --out_dir gpu >gpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu.out; fail "cnn on fake cuda: exit $rc"; }
assert_contains gpu.out "device cuda:0 (Fake GPU 0"
losses cpu/metrics.jsonl gpu/metrics.jsonl 1e-12 || fail "12 cnn steps on fake cuda differ from the cpu"
acc=$(grep -o "test accuracy [0-9.]*" cpu.out | tail -1)
[ -n "$acc" ] || { cat cpu.out; fail "no test accuracy in the cpu run"; }
assert_contains gpu.out "$acc"
ok "cnn on fake cuda (host-driven): the cpu's 12 losses and its $acc"

# The checkpoint written on "cuda" holds the running statistics the device computed: the cpu's
# test of it is the cpu run's.
rc=0; "$TRAIN" --task test --out_dir gpu --device cpu >test.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat test.out; fail "test of the cuda checkpoint on the cpu: exit $rc"; }
assert_contains test.out "$acc"
ok "the checkpoint taken on fake cuda holds the batchnorm running statistics ($acc on the cpu)"

# test and predict on "cuda" (evaluation forwards, the logits from the device model)
rc=0; fake "$TRAIN" --task test --out_dir gpu --device cuda "${HOST[@]}" >test2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat test2.out; fail "test on fake cuda: exit $rc"; }
assert_contains test2.out "$acc"
rc=0; "$TRAIN" --task predict --out_dir gpu --device cpu --predict_out cpu.csv >/dev/null 2>&1 ||
    rc=$?
rc2=0; fake "$TRAIN" --task predict --out_dir gpu --device cuda "${HOST[@]}" --predict_out gpu.csv >pred.out 2>&1 ||
    rc2=$?
[ $rc -eq 0 ] && [ $rc2 -eq 0 ] || { cat pred.out; fail "predict: exit $rc (cpu), $rc2 (fake cuda)"; }
[ "$(wc -l <gpu.csv)" -eq 10001 ] || fail "predictions on fake cuda: want a header and 10000 rows"
cmp -s cpu.csv gpu.csv || fail "predictions on fake cuda differ from the cpu's"
ok "test and predict on fake cuda: the cpu's accuracy and predictions"

MLP=(--model.type mlp --model.hidden 32 --model.dropout 0.3 --batch_size 16 --total_steps 8
     --grad_accum 2 --log_every 1 --eval_every 8 --seed 5 "${HOST[@]}")
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${MLP[@]}" --out_dir cpu2 >cpu2.out 2>&1 ||
    rc=$?
[ $rc -eq 0 ] || { cat cpu2.out; fail "2 ranks mlp on the cpu: exit $rc"; }
rc=0; fake "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${MLP[@]}" --device cuda \
    --out_dir gpu2 >gpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2.out; fail "2 ranks mlp on fake cuda: exit $rc"; }
# 1e-6, not exact: with accumulation the cpu's backward adds each product into the gradient inside
# the sgemm (beta 1), the device path computes it apart and adds it after (one more rounding)
losses cpu2/metrics.jsonl gpu2/metrics.jsonl 1e-6 || fail "2 ranks: fake cuda differs from the cpu"
ok "mlp with dropout, 2 ranks, grad_accum 2 on fake cuda: the cpu's losses"

# bf16: the precision reaches the device model (the fake's arithmetic is the CPU's bf16, where
# this CPU has bf16 units; elsewhere the fake refuses it as the CPU does)
rc=0; "$TRAIN" "${CNN[@]}" --precision bf16 --out_dir cbf >cbf.out 2>&1 || rc=$?
rc2=0; fake "$TRAIN" "${CNN[@]}" --device cuda --precision bf16 --out_dir bf >bf.out 2>&1 || rc2=$?
if [ $rc -eq 0 ]; then
    [ $rc2 -eq 0 ] || { cat bf.out; fail "cnn bf16 on fake cuda: exit $rc2"; }
    assert_not_contains bf.out "not implemented"
    losses cbf/metrics.jsonl bf/metrics.jsonl 1e-12 || fail "cnn bf16 on fake cuda differs from the cpu's bf16"
    ! losses cpu/metrics.jsonl bf/metrics.jsonl 0 >/dev/null || fail "cnn bf16 on fake cuda: fp32's losses"
    ok "cnn bf16 on fake cuda: the cpu's bf16 losses (the precision reached the module), not fp32's"
else
    [ $rc2 -ne 0 ] || fail "cnn bf16 on fake cuda ran where the cpu has no bf16 (the fake computes the cpu's)"
    ok "cnn bf16: this cpu has no bf16 products (exit $rc): the comparison is skipped"
fi

# fp16: GradScaler's loop around the host-driven model (the loss scaled by 65536 and the gradients
# unscaled by the reducer: powers of two, exact in the fake's fp32)
rc=0; fake "$TRAIN" "${CNN[@]}" --device cuda --precision fp16 --out_dir f16 >f16.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat f16.out; fail "cnn fp16 on fake cuda: exit $rc"; }
losses cpu/metrics.jsonl f16/metrics.jsonl 1e-6 || fail "cnn fp16 on fake cuda differs from the cpu's fp32"
grep -q '"loss_scale": 65536, "skipped_steps": 0' f16/metrics.jsonl || fail "cnn fp16: no loss_scale in the metrics"
ok "cnn fp16 on fake cuda: scaled and unscaled exactly (the cpu's fp32 losses), scale 65536 in the metrics"

# An inf on rank 1 alone at its 3rd backward (step 2 of grad_accum 2): both ranks skip that step,
# the scale halves, training goes on.
rc=0; fake env DDP_TEST_FAKE_GPU_INF_AT=3 DDP_TEST_FAKE_GPU_INF_RANK=1 "$DDPRUN" --standalone \
    --nproc_per_node=2 "$TRAIN" "${MLP[@]}" --device cuda --precision fp16 --out_dir inf \
    >inf.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat inf.out; fail "mlp fp16 with an inf, 2 ranks: exit $rc"; }
assert_contains inf.out "step 2: inf or NaN gradients at loss scale 65536: optimizer step skipped, loss scale now 32768"
[ "$(grep -c 'optimizer step skipped' inf.out)" = 1 ] || fail "more than one skip reported"
grep -q '"step": 8, .*"loss_scale": 32768, "skipped_steps": 1' inf/metrics.jsonl ||
    fail "mlp fp16 with an inf: the scale or the skip count at step 8 is wrong"
ok "mlp fp16, 2 ranks: an inf on rank 1 skipped the step on both and halved the scale"

# fp16 on the cpu: refused before any work, as before
rc=0; "$TRAIN" "${CNN[@]}" --precision fp16 --out_dir c16 >c16.out 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat c16.out; fail "cnn fp16 on the cpu: exit $rc, want 2"; }
assert_contains c16.out "precision 'fp16' needs a GPU"
ok "cnn fp16 on the cpu: refused in one line (exit 2)"
