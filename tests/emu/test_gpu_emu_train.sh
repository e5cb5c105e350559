#!/usr/bin/env bash
# gpu_emu.ddptrain: ddptrain --device cuda end to end on the emulated GPU module (the real
# module's host and device code on the CPU: tests/emu/CMakeLists.txt), a tiny GPT, against the
# same run on the cpu: 10 steps on 1 rank (then --task test and predict, with and without the
# key/value cache, from its checkpoint), then 6 steps on 2 ranks (DDP_EMU_GPUS=2, one
# emulated device per rank, the gradients over cuda-staged, then over nccl: nccl.c on the
# emulated NCCL, tests/emu/nccl_emu.cpp, with --overlap async, unsharded and sharded, where
# libddp has the backend). The losses agree to 1e-6 relative (the GPU's products are cuBLAS's,
# here plain loops in double; the kernels' own reductions differ in order). Then the 2 ranks with the optimizer sharded on the GPU
# (the parameters bound to the reducer's views: resident.cu's bind_params), against the cpu in
# fp32 and against the unsharded run in bf16 (whose weights' 16-bit copy is then rounded tensor
# by tensor). Then 6 steps on 2 ranks sharing one emulated device (DDP_EMU_GPUS=1: auto's
# cuda-ipc, the emulation's IPC mapping each peer's memfd-backed blocks), unsharded and sharded,
# gpucheck's exact collectives over cuda-ipc (3 ranks, many chunks), and 1 rank whose auto nccl
# falls back to cuda-ipc (the emulated NCCL's init made to fail: DDP_EMU_NCCL_FAIL=init).
# usage: test_gpu_emu_train.sh BINDIR EMU_MODULE
. "$(dirname "$0")/../integration/lib.sh"
MODULE=${2:?usage: $0 BINDIR EMU_MODULE}
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
cd "$T"
tiny_gpt
ARGS=("${TINY_GPT[@]}")
emu() { DDP_GPU_MODULE=$MODULE DDP_REQUIRE_GPU=1 "$@"; }
losses() { # A B N: the N training losses of two metrics files agree to 1e-6
    python3 - "$@" <<'EOP'
import json, sys
a, b, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def read(p):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
x, y = read(a), read(b)
d = max(abs(x[s] - y[s]) / abs(x[s]) for s in range(1, n + 1))
print(f"steps 1-{n}: largest relative difference {d:.1e}")
sys.exit(0 if d <= 1e-6 else 1)
EOP
}
rc=0; "$TRAIN" "${ARGS[@]}" --total_steps 10 --out_dir cpu >cpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu.out; fail "cpu run: exit $rc"; }
rc=0; DDP_EMU_PEAK_FILE=$T/peak-gpu emu "$TRAIN" "${ARGS[@]}" --device cuda --gpu_backend cuda-staged \
    --total_steps 10 --out_dir gpu >gpu.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu.out; fail "emulated cuda run: exit $rc"; }
grep -q 'emulated on the CPU' gpu.out || { cat gpu.out; fail "the run did not name the emulated GPU"; }
losses cpu/metrics.jsonl gpu/metrics.jsonl 10 || fail "1 rank: cuda (emulated) ≠ cpu"
ok "1 rank: 10 steps on the emulated GPU = the cpu's"
# evaluating its checkpoint on the GPU (--task test) makes no optimizer state there, nor the
# reducer's gradient buckets: its device peak is at least AdamW's 8 bytes and the gradients' 4 a
# parameter below training's (the loaded state stays on the host; until 2026-11-25 the buckets
# were made, and the peak was 8 bytes a parameter below only)
rc=0; DDP_EMU_PEAK_FILE=$T/peak-test emu "$TRAIN" --task test --device cuda \
    --checkpoint gpu/checkpoints/step10.safetensors --out_dir gput >gput.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gput.out; fail "emulated cuda --task test: exit $rc"; }
python3 - "$T/peak-gpu" "$T/peak-test" gpu/checkpoints/step10.safetensors <<'EOP' ||
import json, math, struct, sys
train, test = (max(int(l) for l in open(p)) for p in sys.argv[1:3])
f = open(sys.argv[3], "rb")
head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
n = sum(math.prod(v["shape"]) for k, v in head.items() if k != "__metadata__" and not k.startswith("optim."))
print(f"device peak, bytes: training {train}, --task test {test}; AdamW's state {8 * n}, "
      f"the gradients {4 * n}")
sys.exit(0 if test <= train - 12 * n else 1)
EOP
    fail "--task test on the GPU made the optimizer's state or the gradient buckets there"
ok "1 rank: --task test from its checkpoint makes no optimizer state or gradient buckets on the emulated GPU"
# generation on the emulated GPU from the same checkpoint: the key/value cache (the device's own
# c_attn buffers, a token at a time, ddp__cuda_gpt_forward_cached) gives the text every token
# recomputing its context gives, and the cpu's, through the cached first block_size tokens and
# the sliding window after them (sampled with a seed: logits 1e-6 apart pick the same tokens)
pgen() { "$TRAIN" --task predict --checkpoint gpu/checkpoints/step10.safetensors --out_dir gpup \
    --prompt "the cat" --max_new_tokens 40 --temperature 1 --seed 4 "$@"; }
DDP_EMU_PEAK_FILE=$T/peak-pred emu pgen --device cuda >p1 2>p1.err ||
    { cat p1.err; fail "emulated cuda predict: failed"; }
grep -q "key/value cache on" p1.err || { cat p1.err; fail "the GPU's predict does not use the cache"; }
emu pgen --device cuda --kv_cache false >p2 2>/dev/null || fail "emulated cuda predict, kv_cache false"
pgen --device cpu >p3 2>p3.err || { cat p3.err; fail "cpu predict"; }
[ "$(wc -c <p1)" -ge 47 ] && cmp -s p1 p2 && cmp -s p1 p3 ||
    fail "generation differs: cached $(cat p1) / uncached $(cat p2) / cpu $(cat p3)"
ok "1 rank: generation on the emulated GPU with its key/value cache = without = the cpu's"
# predict makes its model for one sequence, not batch_size (4 here): its device peak is below
# --task test's by at least three sequences' logits (3 × block_size × vocab floats; until
# 2026-11-26 it held batch_size × block_size positions of every activation for nothing)
python3 - "$T/peak-test" "$T/peak-pred" <<'EOP' ||
import sys
test, pred = (max(int(l) for l in open(p)) for p in sys.argv[1:3])
print(f"device peak, bytes: --task test {test}, predict {pred}")
sys.exit(0 if pred <= test - 3 * 16 * 256 * 4 else 1)
EOP
    fail "predict on the GPU holds a batch_size model"
ok "1 rank: predict's model on the emulated GPU is made for one sequence"
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --total_steps 6 \
    --out_dir cpu2 >cpu2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu2.out; fail "cpu run, 2 ranks: exit $rc"; }
emu2() { # OUT_DIR ARGS…: 6 steps on 2 emulated GPUs over cuda-staged (or the --gpu_backend in ARGS)
    local out=$1
    shift
    rc=0; DDP_EMU_GPUS=2 emu "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
        --device cuda --gpu_backend cuda-staged --total_steps 6 --out_dir "$out" "$@" \
        >"$out.out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$out.out"; fail "emulated cuda run $out: exit $rc"; }
}
emu2 gpu2
losses cpu2/metrics.jsonl gpu2/metrics.jsonl 6 || fail "2 ranks: cuda (emulated) ≠ cpu"
ok "2 ranks over cuda-staged: 6 steps on the emulated GPUs = the cpu's"
# --task test on 2 emulated GPUs (no reducer: rank 0's loaded weights reach rank 1 by broadcast
# over the GPU group) = on 1
rc=0; DDP_EMU_GPUS=2 emu "$DDPRUN" --standalone --nproc_per_node=2 --no_prefix "$TRAIN" --task test \
    --device cuda --gpu_backend cuda-staged --checkpoint gpu/checkpoints/step10.safetensors \
    --out_dir gput2 >gput2.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gput2.out; fail "emulated cuda --task test, 2 ranks: exit $rc"; }
[ "$(grep '^val loss' gput2.out | cut -d' ' -f1-5)" = "$(grep '^val loss' gput.out | cut -d' ' -f1-5)" ] &&
    grep -q '^val loss' gput.out || { cat gput.out gput2.out; fail "--task test: 2 emulated GPUs ≠ 1"; }
ok "--task test on 2 emulated GPUs (the weights broadcast without a reducer) = on 1"
# A rank whose device does not answer the memory query (rank 1's, made to fail): null in
# metrics.jsonl (-1.000 until 2026-11-25), rank 0's figure in the progress line, the report and
# the last line, which names the rank of each of its two figures
DDP_EMU_MEMINFO_FAIL=1 emu2 gpu2m
python3 - gpu2m/metrics.jsonl <<'EOP' || fail "rank 1's unknown GPU memory is not null"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
print("rank_gpu_mem_mib:", [r["rank_gpu_mem_mib"] for r in rows])
sys.exit(0 if rows and all(r["rank_gpu_mem_mib"][1] is None and r["rank_gpu_mem_mib"][0] > 0
                           for r in rows) else 1)
EOP
grep -Eq '^\[rank0\]: trained 6 steps in [0-9.]+ s \(largest: peak RSS [0-9]+ MiB on rank [01], [0-9.]+ GiB in use on rank 0.s GPU\)$' gpu2m.out ||
    { cat gpu2m.out; fail "the last line does not name rank 0's GPU"; }
[ "$(grep -c "note: rank 1's GPU memory in use is not reported" gpu2m.out)" -eq 1 ] ||
    { cat gpu2m.out; fail "rank 0 does not say once that rank 1's GPU memory is unknown"; }
"$TRAIN" --task report --out_dir gpu2m >gpu2m.rep 2>&1 || { cat gpu2m.rep; fail "report of gpu2m"; }
grep -q "in use on the fullest GPU" gpu2m/report.html || fail "the report has no GPU memory curve"
ok "2 ranks, rank 1's GPU memory unknown: null in metrics.jsonl, rank 0's in the last line and the report"
NCCL_BUILT=0 # libddp has the nccl backend (DDP_NCCL): the runs over it
grep -q '^DDP_NCCL:BOOL=ON' "$BIN/../CMakeCache.txt" 2>/dev/null && NCCL_BUILT=1
if [ $NCCL_BUILT = 1 ]; then
    emu2 gpu2n --gpu_backend nccl --overlap async
    grep -q "gradients on the GPU over nccl" gpu2n.out || { cat gpu2n.out; fail "not over nccl"; }
    losses cpu2/metrics.jsonl gpu2n/metrics.jsonl 6 || fail "2 ranks over nccl: cuda (emulated) ≠ cpu"
    ok "2 ranks over nccl (the emulated NCCL), overlap async: 6 steps on the emulated GPUs = the cpu's"
fi
DDP_EMU_PEAK_FILE=$T/peak-gpu2s emu2 gpu2s --shard_optimizer true
losses cpu2/metrics.jsonl gpu2s/metrics.jsonl 6 || fail "2 ranks sharded: cuda (emulated) ≠ cpu"
grep -q "each rank keeping 1/2 of its state" gpu2s.out || { cat gpu2s.out; fail "the state is not split"; }
# the memory in use on each rank's (emulated) GPU, in metrics.jsonl and the progress line:
# sharded, each rank holds half the AdamW moments and the model's own parameter copy is freed
# (the reducer's holds them), so it needs less than unsharded on each rank
grep -q "| gpu mem [0-9.]* GiB$" gpu2s.out || { cat gpu2s.out; fail "no gpu mem in the progress line"; }
python3 - gpu2/metrics.jsonl gpu2s/metrics.jsonl <<'EOP' || fail "sharded does not use less GPU memory"
import json, sys
def last(p):
    return [json.loads(l) for l in open(p) if '"loss"' in l][-1]["rank_gpu_mem_mib"]
u, s = last(sys.argv[1]), last(sys.argv[2])
print(f"GPU memory per rank, MiB: unsharded {u}, sharded {s}")
sys.exit(0 if len(u) == len(s) == 2 and all(b < a for a, b in zip(u, s)) else 1)
EOP
# ZeRO-1's memory split on the device (resident.cu's optim_keep): a checkpoint at step 3 streams
# each rank's half of the AdamW state from its device into rank 0's file (small chunks), and the
# run resumed from it (every rank loads the whole state, then keeps its half) = the run above.
DDP_TEST_GATHER_SCRATCH=256 emu2 gpu2sc --shard_optimizer true --total_steps 3 --checkpoint.every 3
DDP_EMU_PEAK_FILE=$T/peak-gpu2sc emu2 gpu2sc --shard_optimizer true --resume_from latest
# resumed, no rank's device ever held more than the uninterrupted run's did (the loaded AdamW
# state goes up after keep narrowed it: state_pending; not the whole of it first)
python3 - "$T/peak-gpu2s" "$T/peak-gpu2sc" <<'EOP' || fail "the resumed sharded run held more device memory"
import sys
fresh, resumed = ([int(l) for l in open(p) if int(l) > 0] for p in sys.argv[1:])
print(f"device memory peak per rank, bytes: uninterrupted {fresh}, resumed {resumed}")
sys.exit(0 if len(fresh) == len(resumed) == 2 and max(resumed) <= max(fresh) else 1)
EOP
losses gpu2s/metrics.jsonl gpu2sc/metrics.jsonl 6 || fail "2 ranks sharded, resumed at step 3 ≠ uninterrupted"
ok "2 ranks, the optimizer sharded on the emulated GPUs, each keeping half its state: 6 steps = the cpu's; saved at step 3 and resumed = uninterrupted"
emu2 gpu2h --precision bf16
emu2 gpu2hs --precision bf16 --shard_optimizer true
losses gpu2h/metrics.jsonl gpu2hs/metrics.jsonl 6 || fail "bf16: sharded ≠ unsharded"
ok "bf16, 2 ranks: the optimizer sharded on the emulated GPUs = unsharded"
rc=0; DDP_EMU_GPUS=1 emu "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
    --device cuda --overlap async --total_steps 6 --out_dir gpu2i >gpu2i.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2i.out; fail "emulated cuda run, 2 ranks on one GPU: exit $rc"; }
grep -q "gradients on the GPU over cuda-ipc" gpu2i.out || { cat gpu2i.out; fail "auto did not pick cuda-ipc"; }
losses cpu2/metrics.jsonl gpu2i/metrics.jsonl 6 || fail "2 ranks over cuda-ipc: cuda (emulated) ≠ cpu"
ok "2 ranks on one emulated GPU over cuda-ipc: 6 steps = the cpu's"
rc=0; "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" --total_steps 6 \
    --shard_optimizer true --out_dir cpu2s >cpu2s.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat cpu2s.out; fail "cpu run, 2 ranks, sharded: exit $rc"; }
rc=0; DDP_EMU_GPUS=1 emu "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" "${ARGS[@]}" \
    --device cuda --gpu_backend cuda-ipc --shard_optimizer true --total_steps 6 \
    --out_dir gpu2is >gpu2is.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gpu2is.out; fail "emulated cuda run, 2 ranks over cuda-ipc, sharded: exit $rc"; }
losses cpu2s/metrics.jsonl gpu2is/metrics.jsonl 6 || fail "2 ranks over cuda-ipc, sharded: ≠ cpu"
ok "2 ranks on one emulated GPU over cuda-ipc, sharded optimizer: = the cpu's"
if [ $NCCL_BUILT = 1 ]; then
    emu2 gpu2ns --gpu_backend nccl --overlap async --shard_optimizer true
    losses cpu2s/metrics.jsonl gpu2ns/metrics.jsonl 6 || fail "2 ranks over nccl, sharded: ≠ cpu"
    ok "2 ranks over nccl (the emulated NCCL), sharded optimizer: = the cpu's"
fi
rc=0; DDP_EMU_GPUS=1 emu "$DDPRUN" --standalone --nproc_per_node 3 "$BIN/gpucheck" --quick \
    --backend cuda-ipc --arena 1048576 --expect cuda-ipc >gc3.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gc3.out; fail "gpucheck, 3 ranks over cuda-ipc in 256 KiB chunks: exit $rc"; }
grep "gpucheck: ok" gc3.out
ok "gpucheck: 3 ranks on one emulated GPU over cuda-ipc, every collective exact"
# One rank, auto: nccl where libddp has it; when NCCL's init fails (here made to), the group of
# one falls back to cuda-ipc (nothing to communicate) and says why, instead of failing ddptrain's
# 1-rank runs.
rc=0; DDP_EMU_NCCL_FAIL=init emu "$BIN/gpucheck" --quick --expect cuda-ipc >gc1.out 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat gc1.out; fail "gpucheck, 1 rank, auto on a module without NCCL: exit $rc"; }
if [ $NCCL_BUILT = 1 ]; then
    grep -q "NCCL could not make its communicator" gc1.out ||
        { cat gc1.out; fail "1 rank: the reason does not say why NCCL was not used"; }
fi
ok "gpucheck: 1 rank, auto with NCCL's init failing: cuda-ipc, every collective exact"
