#!/usr/bin/env bash
# ddptrain's device and precision keys on this machine: precision fp16/tf32 with device cpu is an
# error before any work, bf16 trains where the CPU has bf16 units (and is an error where not), and
# says when its products fell back from oneDNN (a oneDNN that fails them: failing_onednn.c);
# device cuda without a GPU is a clear error naming the reason;
# device auto without a GPU trains on the CPU and says so in one line; mfu_peak_tflops puts MFU
# in the progress line. On a machine with a GPU the no-GPU cases are skipped (and said so).
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
awk 'BEGIN { for (d = 0; d < 300; d++) print "the cat sat on the mat " d "\n%" }' >text.txt
TINY=(--model.type gpt --data.text "$T/text.txt" --data.doc_sep % --model.n_layer 1
      --model.n_head 2 --model.n_embd 16 --model.block_size 16 --batch_size 2 --optimizer adamw
      --lr 1e-3 --eval_windows 4 --max_new_tokens 0 --log_every 2)

for p in tf32 fp16; do
    rc=0; "$TRAIN" "${TINY[@]}" --precision $p --out_dir p$p >out 2>err || rc=$?
    [ $rc -eq 2 ] || fail "precision $p on the cpu: exit code $rc, expected 2"
    assert_contains err "precision '$p' needs a GPU: the CPU path computes in fp32 or bf16"
    [ ! -d p$p ] || fail "precision $p on the cpu started work"
done
# bf16 on the CPU: oneDNN's bf16 products where the CPU has bf16 units (AVX512_BF16 or AMX);
# a clear error before any work where it has not.
rc=0; "$TRAIN" "${TINY[@]}" --precision bf16 --total_steps 4 --out_dir pbf16 >out 2>err || rc=$?
if have_cpu_bf16; then
    [ $rc -eq 0 ] || { cat out err; fail "precision bf16 on a CPU with bf16 units: exit $rc"; }
    assert_contains out "precision bf16"
    assert_contains out "trained 4 steps"
    assert_not_contains out "fell back from oneDNN"
    # A oneDNN that fails every product: each falls back (to float32, or to a plain loop on the bf16
    # operands), and the run says so once.
    FAILING=$BIN/../tests/fake/libfailing_onednn.so
    [ -f "$FAILING" ] || fail "$FAILING was not built"
    rc=0; DDP_ONEDNN_LIB=$FAILING "$TRAIN" "${TINY[@]}" --precision bf16 --total_steps 4 \
        --out_dir pfail >out 2>err || rc=$?
    [ $rc -eq 0 ] || { cat out err; fail "bf16 with failing products: exit $rc"; }
    assert_contains out "trained 4 steps"
    n=$(grep -cE '^warning: ([0-9]+) of \1 bf16 matrix products on rank 0 fell back from oneDNN to slower code \(.*HINT' out || true)
    [ "$n" = 1 ] || { cat out; fail "bf16 with failing products: $n fallback warnings, expected 1 (all of them)"; }
else
    [ $rc -eq 2 ] || fail "precision bf16 on a CPU without bf16 units: exit code $rc, expected 2"
    assert_contains err "precision bf16 on the CPU needs"
    [ ! -d pbf16 ] || fail "precision bf16 on a CPU without bf16 units started work"
fi
rc=0; "$TRAIN" "${TINY[@]}" --device gpu >out 2>err || rc=$?
[ $rc -eq 2 ] || fail "device gpu: exit code $rc, expected 2"
assert_contains err "'gpu' is not one of cpu|cuda|auto"
ok "reduced precision on the cpu and unknown devices are errors before any work"

gpu=0; "$BIN/test_cuda" >/dev/null 2>&1 && gpu=1
if [ $gpu -eq 0 ]; then
    rc=0; "$TRAIN" "${TINY[@]}" --device cuda --total_steps 2 --out_dir c >out 2>err || rc=$?
    [ $rc -eq 1 ] || fail "device cuda without a GPU: exit code $rc, expected 1"
    assert_contains err "device 'cuda' asked for: cuda: "
    # fp16 on cuda passes every check before the device's (the CUDA GPT implements it): only the
    # missing GPU stops it
    rc=0; "$TRAIN" "${TINY[@]}" --device cuda --precision fp16 --total_steps 2 --out_dir c16 \
        >out 2>err || rc=$?
    [ $rc -eq 1 ] || fail "device cuda precision fp16 without a GPU: exit code $rc, expected 1"
    assert_contains err "device 'cuda' asked for: cuda: "
    assert_not_contains err "not implemented"
    "$TRAIN" "${TINY[@]}" --device auto --total_steps 4 --mfu_peak_tflops 0.001 --out_dir a \
        >out 2>&1 || { cat out; fail "device auto without a GPU"; }
    [ "$(grep -c 'device auto: no usable GPU, training on the CPU (' out)" -eq 1 ] ||
        { cat out; fail "device auto did not say once that it fell back to the CPU"; }
    assert_contains out "device cpu, per-rank batch 2"
    assert_contains out "trained 4 steps"
    grep -Eq 'tokens/s \| mfu [0-9.]+% \| ETA' out || { cat out; fail "no mfu in the progress line"; }
    rc=0; "$TRAIN" "${TINY[@]}" --device auto --precision fp16 --out_dir ab >out 2>err || rc=$?
    [ $rc -eq 2 ] || fail "device auto (no GPU) with fp16: exit code $rc, expected 2"
    assert_contains err "precision 'fp16' needs a GPU"
    ok "no GPU: device cuda is an error (fp16 too: for the GPU alone), device auto trains on the CPU and says so once, MFU"
else
    ok "a GPU is present: the no-GPU cases are skipped (the GPU tests cover device cuda)"
fi
