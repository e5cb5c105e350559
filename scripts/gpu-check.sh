#!/usr/bin/env bash
# The CUDA path's checks on a lent GPU machine, in two halves, so that the machine's minutes go
# to running, not building (that machine has CUDA 13 and PyTorch 2.11 but no -dev libraries and
# no package registry; each call carries at most 64 MiB).
#
#   scripts/gpu-check.sh build   HERE, on a development machine: configures build-gpu/ (CUDA on,
#                                warnings as errors, sm_80 and sm_90), builds the GPU tests, the
#                                benchmark and the tools, and fills gpu-carry/ (git-ignored) with
#                                the binaries and the shared libraries they load that a GPU
#                                machine may lack (OpenBLAS, libyaml, jansson, cmocka, zlib,
#                                gfortran), and the GPU module libddp_gpu.so in gpu-carry/lib
#                                (the programs find it in their ../lib: docs/gpu.md).
#                                cuBLAS/cuBLASLt, cuDNN and NCCL are NOT carried (~1.5 GB): the run
#                                half finds the machine's own (CUDA's lib64, or PyTorch's nvidia
#                                wheels). The CUDA runtime is linked statically into the module.
#   scripts/gpu-check.sh run     THERE, from the repository root with gpu-pack/ carried (the
#                                device tool: carry ["gpu-pack"]; below): every GPU test with
#                                DDP_REQUIRE_GPU=1 (a skip is a failure), the GPT on the GPU
#                                against PyTorch (tests/python/test_gpt_torch.py with
#                                DDP_GPT_DUMP_DEVICE=cuda), the GPU backends (integration.gpu:
#                                tests/integration/test_gpu.sh), ddptrain's GPT 10 steps
#                                on cpu and on cuda compared (fp32, bf16 against the CPU's
#                                bf16 or fp32, fp16 with loss scaling against the CPU's fp32;
#                                the flash attention, DDP_CUDA_ATTENTION=flash, in fp32 against
#                                the cpu and in bf16 against the batched path, without and with
#                                dropout),
#                                the bf16 and fp16 GPTs against torch autocast (fp16 with
#                                GradScaler; tests/python/test_gpt_bf16_torch.py), then one
#                                table (the Fashion-MNIST CNN is the cnn verb's). Writes the
#                                log to $OUT/gpu-check.log when $OUT is set.
#                                Exit status: 0 only if every check passed.
#   scripts/gpu-check.sh bench [--quick]   THERE, a call of its own: the GPU benchmarks (gpu_bench,
#                                the GELU epilogues' A/B, bench/gpu_gpt_torch.py for PyTorch eager
#                                and torch.compile on the same GPU); --quick: smaller shapes.
#   scripts/gpu-check.sh cnn     THERE, a call of its own: the CNN's 0.91 in fp32, bf16 and fp16.
# run, bench and cnn stop starting checks at GPU_CHECK_BUDGET seconds (560; a check not started
# is SKIPPED, a failure) so that their table comes back within the device call's 600 s.
# Each of run, bench, cnn and allreduce is one device call (≤ 600 s); in that order of worth.
#   scripts/gpu-check.sh pack    HERE (the end of build): gpu-pack/ (git-ignored), what every
#                                device call carries: gpu-carry as one xz tarball (~7 MB) and the
#                                Fashion-MNIST files (30 MB, from gpu-data/ or the machine's Debian
#                                package) for the CNN checks, together under the 64 MiB a call
#                                carries. Every THERE verb unpacks it first. Carry ["gpu-pack"] in
#                                each call: a lent machine stays warm only ~30 s after a call, so
#                                nothing left in /tmp by one call can be counted on in the next.
#   scripts/gpu-check.sh data    HERE: gpu-data/fashion-mnist (git-ignored, 30 MB: the four IDX
#                                files) where the dataset is elsewhere (data DIR); then pack.
#                                (stash-data, THERE: the older way, a copy in /tmp/ddp-gpu-data
#                                from a call carrying gpu-data; found by run only while warm.)
#   scripts/gpu-check.sh allreduce     THERE, after run: bench/gpu_allreduce.sh (issue 13's
#                                allreduce figures on GPU buffers) over gpu-carry's programs.
#   scripts/gpu-check.sh rehearse      HERE, after build (and the tests' build/, which makes the
#                                emulated GPU module build/gpu_emu/libddp_gpu_emu.so): run's
#                                checks and bench/gpu_allreduce.sh at two small sizes with
#                                gpu-carry's programs on the emulated GPU (DDP_GPU_MODULE), so the
#                                script's own logic (each check's command, the comparisons of
#                                metrics files) runs before a GPU's minutes are spent on it.
#                                Expected to fail only where no emulation reaches: test_cuda_kernels
#                                (it links the CUDA runtime itself), the torch-on-cuda checks
#                                (Debian's torch has no GPU), the Fashion-MNIST CNN (too slow
#                                emulated: timed out). Its first run found two bugs no CPU test
#                                could: the flash checks' python was indented (a syntax error),
#                                and ddpbench --device cuda passed host values to a GPU group.
#
# Status: the build half works here; the run half has NOT been run yet (no GPU was lent to the
# session that wrote it), so treat its first run as its test.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRY=$ROOT/gpu-carry
BINS=(test_cuda test_cuda_kernels test_cuda_gpt test_cuda_classifier test_device test_amp test_model gpu_bench
      ddptrain ddprun gpt_dump gpucheck ddpbench reducercheck joincheck)

build() {
    set -e
    # No MPI backend: nothing here needs it, and libmpi would bring Open MPI's libraries along.
    cmake -S . -B build-gpu -DDDP_WERROR=ON -DDDP_CUDA=ON -DDDP_MPI=OFF -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="80;90" >/dev/null
    cmake --build build-gpu -j "${JOBS:-2}" --target "${BINS[@]}" ddp_gpu
    rm -rf "$CARRY"
    mkdir -p "$CARRY/bin" "$CARRY/lib"
    # Whether the module has the NCCL backend (integration.gpu expects nccl at world 1 if so).
    sed -n 's/^DDP_NCCL:BOOL=//p' build-gpu/CMakeCache.txt >"$CARRY/nccl"
    for b in "${BINS[@]}"; do
        cp "build-gpu/bin/$b" "$CARRY/bin/"
        strip --strip-debug "$CARRY/bin/$b"
    done
    # The GPU module, loaded on first GPU use from the programs' ../lib (docs/gpu.md).
    cp build-gpu/lib/libddp_gpu.so "$CARRY/lib/"
    strip --strip-debug "$CARRY/lib/libddp_gpu.so"
    # The shared libraries the binaries load, but not glibc's, the compiler's runtime or CUDA's
    # (the GPU machine's own match its driver; cuDNN's dispatcher loads sub-libraries of its own
    # version from its own directory: never carried apart from them).
    for b in "$CARRY"/bin/*; do
        ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
    done | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
        libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++.so* | \
            libgcc_s.so* | libcublas* | libcudart* | libcuda.so* | libnccl* | libcudnn* | \
            libddp_gpu.so) ;;
        *) cp -L "$lib" "$CARRY/lib/" ;;
        esac
    done
    local mib
    mib=$(du -sm "$CARRY" | cut -f1)
    echo "gpu-carry: $mib MiB ($(ls "$CARRY/bin" | wc -l) programs, $(ls "$CARRY/lib" | wc -l) libraries)"
    ls "$CARRY/lib"
    pack
}

# HERE: gpu-pack/ (git-ignored), what a device call carries: gpu-carry as one xz tarball (49 MiB
# of programs and libraries, OpenBLAS most of it, come to about 7 MB) and, when found here, the
# Fashion-MNIST files (30 MB, already gzip'd) for the CNN checks. Both fit one call's 64 MiB
# beside the working tree, so every call (run, cnn, bench, allreduce) carries ["gpu-pack"] and
# nothing has to survive between calls: a lent machine stays warm only ~30 s after a call, so a
# copy stashed in /tmp by one call is usually gone by the next.
pack() {
    set -e
    [ -x "$CARRY/bin/test_cuda" ] || { echo "no $CARRY: run 'scripts/gpu-check.sh build' first" >&2; exit 2; }
    local P=$ROOT/gpu-pack fm
    rm -rf "$P"
    mkdir -p "$P"
    tar -C "$ROOT" -cf - gpu-carry | xz -T2 -6 >"$P/carry.tar.xz"
    for fm in "$ROOT/gpu-data/fashion-mnist" /usr/share/datasets/fashion-mnist; do
        if [ -e "$fm/train-images-idx3-ubyte.gz" ]; then
            mkdir -p "$P/fashion-mnist"
            cp "$fm"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$P/fashion-mnist/"
            break
        fi
    done
    [ -d "$P/fashion-mnist" ] ||
        echo "note: no Fashion-MNIST here (gpu-data/ or /usr/share/datasets): the CNN checks will fail" >&2
    local tree mib
    tree=$(git -C "$ROOT" ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    mib=$(( ($(du -sb "$P" | cut -f1) + tree + (1 << 20) - 1) >> 20 ))
    echo "gpu-pack: $(du -sh "$P" | cut -f1) ($(ls "$P" | tr '\n' ' ')); with the working tree: $mib MiB"
    if [ "$mib" -gt 62 ]; then
        echo "gpu-pack and the working tree are over 62 MiB: a device call carries at most 64 MiB in all" >&2
        exit 1
    fi
    echo "next, on the GPU machine (device tool, carry [\"gpu-pack\"]): bash scripts/gpu-check.sh run"
}

# THERE: gpu-carry/ from a carried gpu-pack/carry.tar.xz, unless an up-to-date one is there
# (carried as itself, the older way). python3's tarfile where the machine has no xz.
unpack() {
    local tarball=$ROOT/gpu-pack/carry.tar.xz
    [ -e "$tarball" ] || return 0
    [ -x "$CARRY/bin/test_cuda" ] && [ "$CARRY/bin/test_cuda" -nt "$tarball" ] && return 0
    rm -rf "$CARRY"
    if command -v xz >/dev/null 2>&1; then
        tar -C "$ROOT" -xJf "$tarball"
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$tarball" "$ROOT"
    fi || { echo "could not unpack $tarball" >&2; exit 2; }
    touch "$CARRY/bin/test_cuda"
}

# The directory holding the machine's copy of a CUDA library (libcublasLt.so.13, libnccl.so.2:
# the module links them; libcudnn.so.9: it loads cuDNN for the CNN): CUDA's own or the
# system's, else PyTorch's nvidia-* wheels.
find_cuda_lib() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
        /usr/lib/x86_64-linux-gnu; do
        [ -e "$d/$1" ] && { echo "$d"; return; }
    done
    local site
    site=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)
    [ -n "$site" ] && find "$site/nvidia" -name "$1*" -printf '%h\n' 2>/dev/null | head -1
}

# Where Fashion-MNIST is for the CNN check: carried (gpu-data), stashed by an earlier call, or the
# machine's own Debian package.
find_fashion() {
    local d
    for d in "$ROOT/gpu-pack/fashion-mnist" "$ROOT/gpu-data/fashion-mnist" \
        /tmp/ddp-gpu-data/fashion-mnist /usr/share/datasets/fashion-mnist; do
        [ -e "$d/train-images-idx3-ubyte.gz" ] && { echo "$d"; return; }
    done
}

# LD_LIBRARY_PATH for the carried programs: gpu-carry/lib, then the machine's cuBLAS and NCCL.
# (SYS_LD_LIBRARY_PATH keeps the machine's own, for python3 and torch, which need none of ours.)
setup_env() {
    unpack
    [ -x "$CARRY/bin/test_cuda" ] || { echo "no $CARRY/bin: run 'scripts/gpu-check.sh build' here first and carry gpu-pack (or gpu-carry)" >&2; exit 2; }
    mkdir -p "${OUT:-/tmp}"
    LOG=${OUT:-/tmp}/gpu-check.log
    : >"$LOG"
    local cub
    cub=$(find_cuda_lib libcublasLt.so.13)
    [ -n "$cub" ] || echo "warning: no libcublasLt.so.13 found; the programs will not load" | tee -a "$LOG"
    local nccl
    nccl=$(find_cuda_lib libnccl.so.2)
    [ -n "$nccl" ] || echo "warning: no libnccl.so.2 found; the GPU module will not load" | tee -a "$LOG"
    local dnn
    dnn=$(find_cuda_lib libcudnn.so.9)
    [ -n "$dnn" ] || echo "warning: no libcudnn.so.9 found; the CNN checks will fail (the GPT needs no cuDNN)" | tee -a "$LOG"
    export SYS_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
    export LD_LIBRARY_PATH="$CARRY/lib${cub:+:$cub}${nccl:+:$nccl}${dnn:+:$dnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS from: ${cub:-none}; NCCL from: ${nccl:-none}; cuDNN from: ${dnn:-none}" | tee -a "$LOG"
}

# python3 with the machine's own library path (torch must not load gpu-carry's zlib & co.).
syspy() {
    LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" python3 "$@"
}
export -f syspy # check() runs its command under timeout, through bash -c

# A device call ends at 600 s (the device tool's limit per command) wherever it stands: the
# checks and benchmarks stop starting work at BUDGET seconds of this script (SECONDS counts from
# its start, the unpacking included), so that the table is printed before that.
BUDGET=${GPU_CHECK_BUDGET:-560}
limit_for() { # limit_for WANT: WANT seconds, or what is left of the budget if less (≥ 0)
    local left=$((BUDGET - SECONDS))
    [ "$left" -lt 0 ] && left=0
    if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# run_bounded WANT COMMAND...: COMMAND under timeout with at most WANT s of what is left of the
# budget; with less than 20 s left, not started (said; exit 124) — "timeout 0" would be no limit
run_bounded() {
    local lim
    lim=$(limit_for "$1")
    shift
    if [ "$lim" -lt 20 ]; then
        echo "SKIPPED (the call's budget, GPU_CHECK_BUDGET=$BUDGET s, was spent): $*"
        return 124
    fi
    timeout -k 5 "$lim" "$@"
}

# run PART [--quick]: PART checks (the correctness checks), cnn (the CNN in fp32, bf16 and fp16)
# or bench (the benchmarks); each is one device call's work (≤ 600 s; BUDGET above).
run() {
    local part=$1 quick=""
    shift
    [ "${1:-}" = "--quick" ] && quick=--quick
    setup_env
    export DDP_REQUIRE_GPU=1 OPENBLAS_NUM_THREADS=4
    # NCCL's own words when something fails (its default prints nothing; ddpc's messages carry
    # ncclGetLastError's line, this adds the lines before it). If its communicator cannot be made
    # on the lent machine (a sandbox refusing cuMem's handles), NCCL_CUMEM_ENABLE=0 is the first
    # thing to try; 1-rank groups fall back to cuda-ipc meanwhile, and the "over nccl" checks fail.
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    local -a names results
    nvidia-smi -L 2>&1 | tee -a "$LOG"
    # what decides whether 2 ranks may share the GPU (compute mode Default; Exclusive_Process
    # refuses the second rank's context) and whether IPC and pinning can work (the runtime)
    nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current,memory.total \
        --format=csv 2>&1 | tee -a "$LOG"
    uname -r 2>&1 | tee -a "$LOG"
    # check NAME COMMAND...: records passed/FAILED (exit status) and logs the output. Each check
    # has CHECK_LIMIT seconds (default 150; exit 124: timed out), so that one hung kernel or NCCL
    # init cannot eat the device call's 600 s, and its result goes into the log at once (RESULT
    # lines), so a call cut off before the table still says what passed.
    # A check that would start with less than 20 s of the call's budget left is not started
    # (SKIPPED, a failure: run that part again), and none runs past the budget, so the table
    # and the log's end come back from a call that would otherwise be cut off at 600 s.
    check() {
        local name=$1 rc=0 t0=$SECONDS lim
        shift
        lim=$(limit_for "${CHECK_LIMIT:-150}")
        if [ "$lim" -lt 20 ]; then
            names+=("$name")
            results+=("SKIPPED: the call's budget (GPU_CHECK_BUDGET=$BUDGET s) was spent")
            echo "RESULT $name: ${results[-1]}" | tee -a "$LOG"
            return
        fi
        echo "=== $name: $*" >>"$LOG"
        timeout -k 5 "$lim" bash -c '"$@"' check "$@" >>"$LOG" 2>&1 || rc=$?
        names+=("$name")
        results+=("$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc$([ $rc -eq 124 ] && echo ": timed out"))") in $((SECONDS - t0)) s")
        echo "RESULT $name: ${results[-1]}" | tee -a "$LOG"
    }
    # rel_close NAME A B [FROM TO]: two GPU runs' training losses (metrics files A and B) within
    # 1e-4 relative, at every step of A or at steps FROM..TO; two GPU runs are not bit-identical
    # (the wte gradient's atomic adds, cuBLASLt's split-K), though they sum in the same order
    rel_close() {
        check "$1" syspy - "$2" "$3" "${4:-0}" "${5:-0}" <<'EOP'
import json, sys
def losses(p):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
lo, hi = int(sys.argv[3]), int(sys.argv[4])
steps = sorted(s for s in a if lo == 0 or lo <= s <= hi)
d = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)  # a step b lacks: KeyError, a failure
print(f"steps {steps[0]}-{steps[-1]}: largest relative difference {d:.2e}")
sys.exit(0 if d <= 1e-4 else 1)
EOP
    }
    local W
    W=$(mktemp -d)
    cnn_part() {
        # issue 12: the Fashion-MNIST CNN (configs/fashion-cnn.yaml, 5 epochs, 2 ranks sharing the
        # GPU as bench/RESULTS.md's CPU run: 0.9196) on cuda, device-resident (ddptrain's default:
        # the statistics, gradients and optimizer on the GPU, cuda-ipc); test accuracy ≥ 0.91 in
        # each precision named: fp32, bf16 (16-bit operands into the linear layers and
        # cuDNN's convolutions) and fp16 (the same with ddptrain's GradScaler loop; its last loss
        # scale and skipped steps printed) in cnn. Each run is one check of its own, under
        # CHECK_LIMIT (~2,350 steps of a 0.4M-parameter CNN).
        local fm prec
        fm=$(find_fashion)
        for prec in "$@"; do
            if [ -z "$fm" ]; then
                names+=("ddptrain fashion-cnn on cuda $prec (>= 0.91)")
                results+=("FAILED (no Fashion-MNIST: 'scripts/gpu-check.sh data DIR' then 'pack' here, and carry gpu-pack)")
                continue
            fi
            check "ddptrain fashion-cnn on cuda $prec, 2 ranks" "$CARRY/bin/ddprun" --standalone \
                --nproc_per_node=2 "$CARRY/bin/ddptrain" --config configs/fashion-cnn.yaml \
                --device cuda --precision "$prec" --data.dir "$fm" --out_dir "$W/fcnn-$prec"
            check "fashion-cnn on cuda $prec: test accuracy >= 0.91" syspy - \
                "$W/fcnn-$prec/train.log" "$W/fcnn-$prec/metrics.jsonl" <<'EOP'
import json, re, sys
acc = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", open(sys.argv[1]).read())]
print("test accuracies:", acc)
try:
    last = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l][-1]
    print("last step:", last.get("step"), "loss", last.get("loss"), "loss_scale",
          last.get("loss_scale"), "skipped_steps", last.get("skipped_steps"))
except (OSError, IndexError, ValueError) as e:
    print("no metrics:", e)
sys.exit(0 if acc and acc[-1] >= 0.91 else 1)
EOP
        done
    }
    checks_part() {
        for t in test_cuda test_cuda_kernels test_cuda_gpt test_cuda_classifier test_device test_amp \
            test_model; do
            check "unit.$t" "$CARRY/bin/$t"
        done
        # the GELU epilogues' fallback (the product, then the GELU kernel), which a GPU whose
        # cuBLASLt offers them never takes otherwise
        check "unit.test_cuda_kernels, no GELU epilogue" env DDP_CUDA_GELU_EPILOGUE=0 \
            "$CARRY/bin/test_cuda_kernels"
        # issue 13: world 1 over NCCL (cuda-ipc without it), worlds 2 and 4 on the one GPU over
        # cuda-ipc (UNVERIFIED before this run) and over cuda-staged, every collective exact and
        # W × B ≡ 1 × W·B, a killed rank ending the job, over each (twice the work: 300 s)
        CHECK_LIMIT=300 check "integration.gpu (nccl, cuda-ipc, cuda-staged, kill)" \
            bash tests/integration/test_gpu.sh "$CARRY/bin" "$(cat "$CARRY/nccl" 2>/dev/null || echo OFF)"
        # issue 13: the reducer with its buckets in GPU memory (every mode: plain, sharded, bf16
        # compression, no_sync, grad_norm, gather_state), world 1 over NCCL, 2 over auto's cuda-ipc
        # and over cuda-staged named
        check "ddp.reducer on the GPU, 1 rank" "$CARRY/bin/ddprun" --standalone --nproc_per_node=1 \
            "$CARRY/bin/reducercheck" --device cuda
        check "ddp.reducer on the GPU, 2 ranks over cuda-ipc" env DDP_EXPECT_BACKEND=cuda-ipc \
            "$CARRY/bin/ddprun" --standalone --nproc_per_node=2 "$CARRY/bin/reducercheck" --device cuda
        check "ddp.reducer on the GPU, 2 ranks over cuda-staged" env DDP_BACKEND=cuda-staged \
            DDP_EXPECT_BACKEND=cuda-staged "$CARRY/bin/ddprun" --standalone --nproc_per_node=2 \
            "$CARRY/bin/reducercheck" --device cuda
        # uneven inputs (join) with the buckets on the GPU: 3 ranks, so that dividing by the
        # ranks still training (devops' reduce on the device) divides by 2
        check "ddp.reducer join on the GPU, 3 ranks" "$CARRY/bin/ddprun" --standalone \
            --nproc_per_node=3 "$CARRY/bin/joincheck" --device cuda
        check "fp16 found-inf flag over a GPU group, 2 ranks" "$CARRY/bin/ddprun" --standalone \
            --nproc_per_node=2 "$CARRY/bin/test_amp" --sync-gpu
        # the GPT on the GPU against PyTorch's twin (on the CPU, in float32 and float64)
        # (torch runs with the machine's libraries, gpt_dump with the carried ones)
        check "torch.gpt_parity on cuda" env DDP_GPT_DUMP_DEVICE=cuda \
            DDP_CARRY_LD_LIBRARY_PATH="$LD_LIBRARY_PATH" LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" \
            python3 tests/python/test_gpt_torch.py "$CARRY/bin"
        # ddptrain end to end: the same tiny GPT, 10 steps on the cpu and on cuda, losses compared
        awk 'BEGIN { srand(7); split("the a cat dog sat ran on under mat log and then", w, " ");
                     for (d = 0; d < 800; d++) { s = ""; for (i = 0; i < 20; i++) s = s w[1 + int(rand() * 12)] " ";
                     print s "\n%" } }' >"$W/text.txt"
        local args=(--model.type gpt --data.text "$W/text.txt" --data.doc_sep % --model.n_layer 2
                    --model.n_head 4 --model.n_embd 64 --model.block_size 64 --batch_size 8
                    --optimizer adamw --lr 1e-3 --total_steps 10 --log_every 1 --eval_windows 20
                    --max_new_tokens 20 --seed 5)
        export DDP_DATA_CACHE=$W/cache
        check "ddptrain gpt device cpu" "$CARRY/bin/ddptrain" "${args[@]}" --device cpu --out_dir "$W/cpu"
        check "ddptrain gpt device cuda" "$CARRY/bin/ddptrain" "${args[@]}" --device cuda --out_dir "$W/cuda"
        check "ddptrain cpu vs cuda losses (1e-4)" syspy - "$W/cpu/metrics.jsonl" "$W/cuda/metrics.jsonl" <<'EOP'
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("cpu ", a); print("cuda", b)
assert len(a) == len(b) == 10, (len(a), len(b))
d = max(abs(x - y) for x, y in zip(a, b))
finite = all(abs(x) < float("inf") for x in a + b)  # False for NaN too (max() may skip one)
print(f"largest difference {d:.2e}; finite: {finite}")
sys.exit(0 if finite and d <= 1e-4 else 1)
EOP
        # the fused (flash) attention, DDP_CUDA_ATTENTION=flash (docs/gpu.md; head size 32 here:
        # n_head 2, as flash takes 32, 64, 128 and the runs above have 16): fp32 on cuda against the
        # cpu within 1e-4, bf16 against the batched path's bf16 of the same shape within 2e-2 and not
        # equal to it bit for bit (flash really ran)
        local -a fargs=()
        local prev="" a
        for a in "${args[@]}"; do
            [ "$prev" = --model.n_head ] && a=2
            fargs+=("$a")
            prev=$a
        done
        check "ddptrain gpt n_head 2 device cpu" "$CARRY/bin/ddptrain" "${fargs[@]}" --device cpu \
            --out_dir "$W/cpu_h2"
        check "ddptrain gpt n_head 2 cuda flash" env DDP_CUDA_ATTENTION=flash "$CARRY/bin/ddptrain" \
            "${fargs[@]}" --device cuda --out_dir "$W/flash"
        check "ddptrain gpt n_head 2 cuda flash bf16" env DDP_CUDA_ATTENTION=flash \
            "$CARRY/bin/ddptrain" "${fargs[@]}" --device cuda --precision bf16 --out_dir "$W/flashbf16"
        check "ddptrain gpt n_head 2 cuda batched bf16" env DDP_CUDA_ATTENTION=batched \
            "$CARRY/bin/ddptrain" "${fargs[@]}" --device cuda --precision bf16 --out_dir "$W/batchbf16"
        # (python code at column 0: an indented -c program is an IndentationError)
        local cmp_losses='
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if "\"loss\"" in l]
a, b, tol, differ = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
print("a", a); print("b", b)
assert len(a) == len(b) == 10, (len(a), len(b))
d = max(abs(x - y) for x, y in zip(a, b))
finite = all(abs(x) < float("inf") for x in a + b)
print(f"largest difference {d:.2e} (tolerance {tol}); equal: {a == b}; finite: {finite}")
sys.exit(0 if finite and d <= tol and (a != b or not differ) else 1)
'
        check "ddptrain cpu vs cuda flash losses (1e-4)" syspy -c "$cmp_losses" \
            "$W/cpu_h2/metrics.jsonl" "$W/flash/metrics.jsonl" 1e-4 0
        check "ddptrain bf16 flash vs batched losses (2e-2, not equal)" syspy -c "$cmp_losses" \
            "$W/batchbf16/metrics.jsonl" "$W/flashbf16/metrics.jsonl" 2e-2 1
        # the same with dropout 0.1 (the attention's among the model's dropouts): flash draws the
        # cpu's and the batched path's masks inline (util/rng.h's hashes), so the same bounds hold
        local -a dargs=("${fargs[@]}" --model.dropout 0.1)
        check "ddptrain gpt n_head 2 dropout 0.1 device cpu" "$CARRY/bin/ddptrain" "${dargs[@]}" \
            --device cpu --out_dir "$W/cpu_h2d"
        check "ddptrain gpt n_head 2 dropout 0.1 cuda flash" env DDP_CUDA_ATTENTION=flash \
            "$CARRY/bin/ddptrain" "${dargs[@]}" --device cuda --out_dir "$W/flashd"
        check "ddptrain gpt n_head 2 dropout 0.1 cuda flash bf16" env DDP_CUDA_ATTENTION=flash \
            "$CARRY/bin/ddptrain" "${dargs[@]}" --device cuda --precision bf16 --out_dir "$W/flashbf16d"
        check "ddptrain gpt n_head 2 dropout 0.1 cuda batched bf16" env DDP_CUDA_ATTENTION=batched \
            "$CARRY/bin/ddptrain" "${dargs[@]}" --device cuda --precision bf16 \
            --out_dir "$W/batchbf16d"
        check "ddptrain cpu vs cuda flash losses, dropout 0.1 (1e-4)" syspy -c "$cmp_losses" \
            "$W/cpu_h2d/metrics.jsonl" "$W/flashd/metrics.jsonl" 1e-4 0
        check "ddptrain bf16 flash vs batched losses, dropout 0.1 (2e-2, not equal)" syspy \
            -c "$cmp_losses" "$W/batchbf16d/metrics.jsonl" "$W/flashbf16d/metrics.jsonl" 2e-2 1
        check "ddprun 2 ranks on cuda" "$CARRY/bin/ddprun" --standalone --nproc_per_node=2 \
            "$CARRY/bin/ddptrain" "${args[@]}" --device cuda --out_dir "$W/cuda2"
        # device-resident training: the gradients' GPU group is named (nccl at world 1, cuda-ipc
        # with 2 ranks on one GPU), and a checkpoint taken on the GPU resumes where it stopped
        check "ddptrain cuda: gradients over nccl" grep -q "gradients on the GPU over nccl" \
            "$W/cuda/train.log"
        check "ddptrain cuda 2 ranks: gradients over cuda-ipc" grep -q \
            "gradients on the GPU over cuda-ipc" "$W/cuda2/train.log"
        # the sharded optimizer step on the GPU (2 ranks on one GPU): the reducer's device
        # parameters bound into the CUDA GPT, each rank's AdamW on its shard, the allgather; the
        # same sums in the same order as unsharded, but two GPU runs are not bit-identical (the wte
        # gradient's atomic adds, cuBLASLt's split-K): 1e-4 relative
        check "ddprun 2 ranks on cuda, sharded optimizer step" "$CARRY/bin/ddprun" --standalone \
            --nproc_per_node=2 "$CARRY/bin/ddptrain" "${args[@]}" --device cuda \
            --shard_optimizer true --out_dir "$W/cuda2sh"
        rel_close "cuda 2 ranks: sharded = unsharded (1e-4)" "$W/cuda2/metrics.jsonl" \
            "$W/cuda2sh/metrics.jsonl"
        local cst=(--schedule constant --device cuda)
        check "ddptrain cuda 10 steps" "$CARRY/bin/ddptrain" "${args[@]}" "${cst[@]}" \
            --out_dir "$W/whole"
        check "ddptrain cuda 5 steps, checkpoint" "$CARRY/bin/ddptrain" "${args[@]}" "${cst[@]}" \
            --total_steps 5 --checkpoint.every 5 --out_dir "$W/half"
        check "ddptrain cuda resumed to 10" "$CARRY/bin/ddptrain" "${args[@]}" "${cst[@]}" \
            --resume_from latest --out_dir "$W/half"
        rel_close "resumed on cuda = uninterrupted (1e-4)" "$W/whole/metrics.jsonl" \
            "$W/half/metrics.jsonl" 6 10
        # ZeRO-1's memory split on the device (resident.cu's optim_keep, the state made at its
        # first use, the GPT's own parameter buffer freed while bound): 2 ranks sharded, each
        # keeping half the AdamW state on the GPU; a checkpoint from the shards at step 5, resumed
        # (each rank uploads its half) = the uninterrupted sharded run
        local sh2=("$CARRY/bin/ddprun" --standalone --nproc_per_node=2 "$CARRY/bin/ddptrain"
            "${args[@]}" "${cst[@]}" --shard_optimizer true)
        check "ddprun 2 ranks on cuda, sharded, 10 steps" "${sh2[@]}" --out_dir "$W/shwhole"
        check "ddptrain cuda sharded: each rank keeps half the state" grep -q \
            "each rank keeping 1/2 of its state" "$W/shwhole/train.log"
        check "ddprun 2 ranks on cuda, sharded, 5 steps, checkpoint" "${sh2[@]}" --total_steps 5 \
            --checkpoint.every 5 --out_dir "$W/shhalf"
        check "ddprun 2 ranks on cuda, sharded, resumed to 10" "${sh2[@]}" --resume_from latest \
            --out_dir "$W/shhalf"
        rel_close "sharded, resumed on cuda = uninterrupted (1e-4)" "$W/shwhole/metrics.jsonl" \
            "$W/shhalf/metrics.jsonl" 6 10
        # precision bf16: the same run on cuda against the CPU's bf16 (the closest reference: the
        # same products' operands rounded) where this CPU has bf16 units and oneDNN, else against the
        # CPU's fp32 with a wider bound (docs/gpu.md); and not fp32's losses bit for bit
        check "ddptrain gpt device cuda bf16" "$CARRY/bin/ddptrain" "${args[@]}" --device cuda \
            --precision bf16 --out_dir "$W/cudabf16"
        local ref=$W/cpu reftol=5e-2 refname="cpu fp32"
        echo "=== ddptrain gpt device cpu bf16 (the reference where it runs)" >>"$LOG"
        if "$CARRY/bin/ddptrain" "${args[@]}" --device cpu --precision bf16 --out_dir "$W/cpubf16" \
            >>"$LOG" 2>&1; then
            ref=$W/cpubf16 reftol=2e-2 refname="cpu bf16"
        else
            echo "(no bf16 on this CPU: the bf16 run is compared with cpu fp32, bound 5e-2)" |
                tee -a "$LOG"
        fi
        check "ddptrain bf16 cuda vs $refname losses ($reftol)" syspy - "$ref/metrics.jsonl" \
            "$W/cudabf16/metrics.jsonl" "$reftol" "$W/cuda/metrics.jsonl" <<'EOP'
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b, f = losses(sys.argv[1]), losses(sys.argv[2]), losses(sys.argv[4])
print("ref ", a); print("bf16", b); print("cuda fp32", f)
assert len(a) == len(b) == 10, (len(a), len(b))
d = max(abs(x - y) for x, y in zip(a, b))
finite = all(abs(x) < float("inf") for x in b)  # False for NaN too
print(f"largest difference {d:.2e} (tolerance {sys.argv[3]}); bf16 equal to cuda fp32: {b == f}; "
      f"finite: {finite}")
sys.exit(0 if finite and d <= float(sys.argv[3]) and b != f else 1)
EOP
        # issue 12: the bf16 GPT against PyTorch autocast on this GPU, losses within 0.05 (torch runs
        # with the machine's libraries, gpt_dump with the carried ones)
        check "torch autocast bf16 vs ddpc bf16 on cuda (0.05)" env \
            DDP_CARRY_LD_LIBRARY_PATH="$LD_LIBRARY_PATH" LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" \
            python3 tests/python/test_gpt_bf16_torch.py "$CARRY/bin"
        # precision fp16 (autocast float16 + ddptrain's GradScaler loop): the same run on cuda against
        # the cpu's fp32 (the CPU has no fp16), 1e-2 (test_cuda_gpt's bound); the metrics carry the
        # loss scale (65536 unless a step overflowed: then skipped_steps says so, printed here)
        check "ddptrain gpt device cuda fp16" "$CARRY/bin/ddptrain" "${args[@]}" --device cuda \
            --precision fp16 --out_dir "$W/cudafp16"
        check "ddptrain fp16 cuda vs cpu fp32 losses (1e-2)" syspy - "$W/cpu/metrics.jsonl" \
            "$W/cudafp16/metrics.jsonl" "$W/cuda/metrics.jsonl" <<'EOP'
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p) if '"loss"' in l]
a = [r["loss"] for r in rows(sys.argv[1])]
h = rows(sys.argv[2])
b = [r["loss"] for r in h]
f = [r["loss"] for r in rows(sys.argv[3])]
print("cpu fp32", a); print("fp16", b); print("cuda fp32", f)
print("loss_scale", [r.get("loss_scale") for r in h], "skipped_steps",
      [r.get("skipped_steps") for r in h])
assert len(a) == len(b) == 10, (len(a), len(b))
assert all("loss_scale" in r for r in h), "no loss_scale in the fp16 metrics"
d = max(abs(x - y) for x, y in zip(a, b))
finite = all(abs(x) < float("inf") for x in b)  # False for NaN too
print(f"largest difference {d:.2e} (tolerance 1e-2); fp16 equal to cuda fp32: {b == f}; "
      f"finite: {finite}")
sys.exit(0 if finite and d <= 1e-2 and b != f else 1)
EOP
        # issue 12: the fp16 GPT (GradScaler loop) against torch autocast float16 + GradScaler
        check "torch autocast fp16 + GradScaler vs ddpc fp16 on cuda (0.05)" env \
            DDP_CARRY_LD_LIBRARY_PATH="$LD_LIBRARY_PATH" LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" \
            python3 tests/python/test_gpt_bf16_torch.py "$CARRY/bin" fp16
        # a PyTorch 2.11 program under ddprun (CI has Debian's 1.13): rank 0's TCPStore on the
        # MASTER_PORT ddprun leaves free, gloo collectives and a DDP step
        check "torch 2.11 program under ddprun, 2 ranks" "$CARRY/bin/ddprun" --standalone \
            --nproc_per_node 2 env LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" python3 \
            tests/python/torch_ddprun_worker.py
        check "torch 2.11 program under ddprun, nccl, 1 rank" "$CARRY/bin/ddprun" --standalone \
            --nproc_per_node 1 env LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" python3 \
            tests/python/torch_ddprun_worker.py nccl
    }
    bench_part() {
        # benchmarks
        local peaks
        peaks=$("$CARRY/bin/gpu_bench" --peaks 2>>"$LOG")
        echo "=== gpu_bench" >>"$LOG"
        run_bounded 300 "$CARRY/bin/gpu_bench" $quick 2>&1 | tee "$W/bench.txt" >>"$LOG"
        # the GELU epilogues' A/B: the bf16 step again with them off
        echo "=== gpu_bench --gpt-bf16, DDP_CUDA_GELU_EPILOGUE=0" >>"$LOG"
        DDP_CUDA_GELU_EPILOGUE=0 run_bounded 120 "$CARRY/bin/gpu_bench" --gpt-bf16 $quick 2>&1 |
            sed 's/step tokens/step, no GELU epilogue, tokens/' | grep "gpt L" |
            tee -a "$W/bench.txt" >>"$LOG"
        echo "=== bench/gpu_gpt_torch.py" >>"$LOG"
        # shellcheck disable=SC2086
        set -- $peaks
        run_bounded 300 env LD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" python3 bench/gpu_gpt_torch.py \
            $quick --peak-fp32 "${1:-0}" --peak-tf32 "${2:-0}" \
            --peak-bf16 "${3:-0}" 2>&1 | tee "$W/torch.txt" >>"$LOG"
        # ZeRO-1's memory split on the device: 2 ranks sharing the GPU, unsharded and sharded
        echo "=== bench/gpu_zero_memory.sh gpu" >>"$LOG"
        run_bounded 400 bash bench/gpu_zero_memory.sh gpu "$CARRY" "1 2" 2>&1 |
            tee -a "$W/bench.txt" >>"$LOG"
    }
    case $part in
    checks) checks_part ;;
    cnn) cnn_part fp32 bf16 fp16 ;;
    bench) bench_part ;;
    esac
    # one table
    {
        echo
        echo "| check | result |"
        echo "|---|---|"
        for i in "${!names[@]}"; do echo "| ${names[$i]} | ${results[$i]} |"; done
        echo
        echo '```'
        cat "$W/bench.txt" "$W/torch.txt" 2>/dev/null
        echo '```'
    } | tee -a "$LOG"
    rm -rf "$W"
    local failed=0
    for r in "${results[@]}"; do [[ $r == passed* ]] || failed=1; done
    echo "log: $LOG"
    return $failed
}

# issue 13's speed: allreduce on GPU buffers, ddpc's nccl, cuda-ipc and cuda-staged beside torch's
# (bench/gpu_allreduce.sh over gpu-carry's ddprun and ddpbench); then ddptrain end to end on a
# GPT-2 124M shape (train_bench), and generation from its checkpoint with and without the
# key/value cache. A second call, after run.
allreduce() {
    setup_env
    local w
    w=$(mktemp -d)
    printf '#!/bin/sh\nLD_LIBRARY_PATH="$SYS_LD_LIBRARY_PATH" exec python3 "$@"\n' >"$w/py"
    chmod +x "$w/py"
    PY=$w/py bash bench/gpu_allreduce.sh "$CARRY" "$@" 2>&1 | tee -a "$LOG"
    rm -rf "$w"
    train_bench 2>&1 | tee -a "$LOG"
}

# ddptrain, device-resident, on the GPT-2 124M shape (12 layers, 768 wide, T 1024, vocabulary
# 50304, per-rank batch 8, AdamW, clipping) over random tokens: tokens/s and MFU (the median of
# the progress lines after the first 10 steps) in bf16 and tf32 with 1 rank, and in bf16 with 2
# ranks time-slicing the one GPU over cuda-ipc (auto) and over cuda-staged (issue 13: the
# overhead, not a speed-up).
train_bench() {
    local w
    w=$(mktemp -d)
    # GPT-2 124M; a rehearsal (on the emulated GPU) takes a tiny GPT through the same lines
    local shape=(--model.n_layer 12 --model.n_head 12 --model.n_embd 768 --model.block_size 1024
                 --model.vocab_size 50304 --batch_size 8) vocab=50257
    [ -n "${REHEARSAL:-}" ] && shape=(--model.n_layer 1 --model.n_head 2 --model.n_embd 32
        --model.block_size 32 --model.vocab_size 256 --batch_size 2) vocab=256
    syspy - "$w" "$vocab" <<'EOP'
import os, sys
import numpy as np
rng = np.random.default_rng(0)
v = int(sys.argv[2])
rng.integers(0, v, size=4_000_000, dtype=np.uint16).tofile(os.path.join(sys.argv[1], "train.bin"))
rng.integers(0, v, size=400_000, dtype=np.uint16).tofile(os.path.join(sys.argv[1], "val.bin"))
EOP
    local args=(--model.type gpt "${shape[@]}"
                --data.train "$w/train.bin" --data.val "$w/val.bin" --eval_windows 1
                --optimizer adamw --lr 6e-4 --betas 0.9,0.95 --weight_decay 0.1 --grad_clip 1.0
                --schedule constant --total_steps 40 --log_every 5 --eval_every 100000
                --checkpoint.every 0 --max_new_tokens 0 --device cuda)
    rate() { # rate OUTFILE: "tokens/s mfu%" medians over steps > 10
        sed -n 's/.*step \([0-9]*\)\/.* | \([0-9]*\) tokens\/s | mfu \([0-9.]*\)%.*/\1 \2 \3/p' "$1" |
            awk '$1 > 10 {print $2, $3}' | sort -n | awk '{a[NR] = $0} END {print a[int((NR + 1) / 2)]}'
    }
    echo "=== ddptrain ${REHEARSAL:+(rehearsal: a tiny GPT in place of) }GPT-2 124M shape (B 8 per rank, T 1024), device-resident"
    echo "| run | tokens/s (all ranks) | MFU per rank |"
    echo "|---|---:|---:|"
    local run
    for run in "1 bf16 auto" "1 tf32 auto" "2 bf16 auto" "2 bf16 cuda-staged"; do
        set -- $run
        local np=$1 prec=$2 be=$3 label="$1 rank(s), $2"
        [ "$np" -gt 1 ] && label="$label, $([ "$be" = auto ] && echo cuda-ipc || echo "$be")"
        local out="$w/r$np$prec$be.out"
        if "$CARRY/bin/ddprun" --standalone --nproc_per_node="$np" "$CARRY/bin/ddptrain" \
            "${args[@]}" --precision "$prec" --gpu_backend "$be" --out_dir "$w/r$np$prec$be" \
            >"$out" 2>&1; then
            set -- $(rate "$out")
            echo "| $label | ${1:-?} | ${2:-?}% |"
        else
            echo "| $label | failed: $(tail -1 "$out") | |"
        fi
    done
    # generation on the GPU from the 1-rank bf16 run's last checkpoint: 200 tokens after a
    # 16-token prompt, greedy, with the key/value cache (the device's c_attn buffers) and without
    # (every token its whole context, as nanoGPT's sample.py); the same ids either way
    echo "=== ddptrain --task predict on the GPU: 200 tokens after 16, greedy, batch of one"
    # same ids: informational, not a check (after 40 steps on random tokens the logits are nearly
    # flat, and the cache's one-row products may round differently from the whole window's)
    echo "| precision | tokens/s, key/value cache | tokens/s, without | speed-up | same ids (info) |"
    echo "|---|---:|---:|---:|---|"
    local prec kv
    for prec in bf16 fp32; do
        declare -A gr=() gi=()
        for kv in true false; do
            "$CARRY/bin/ddptrain" --task predict --device cuda --precision "$prec" \
                --out_dir "$w/r1bf16auto" --prompt_tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 \
                --max_new_tokens 200 --temperature 0 --kv_cache "$kv" >"$w/gen.txt" 2>"$w/gen.err" ||
                { echo "| $prec | failed: $(tail -1 "$w/gen.err") | | | |"; continue 2; }
            gr[$kv]=$(sed -n 's/^generated .* (\([0-9.]*\) tokens\/s.*/\1/p' "$w/gen.err")
            gi[$kv]=$(sha1sum <"$w/gen.txt" | cut -c1-12)
        done
        echo "| $prec | ${gr[true]} | ${gr[false]} | $(awk -v a="${gr[true]:-0}" -v b="${gr[false]:-0}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')x | $([ "${gi[true]}" = "${gi[false]}" ] && echo yes || echo NO) |"
        unset gr gi
    done
    rm -rf "$w"
}

# HERE: the Fashion-MNIST files for the CNN check, in gpu-data/ (git-ignored).
data() {
    set -e
    local src=${1:-/usr/share/datasets/fashion-mnist}
    mkdir -p "$ROOT/gpu-data/fashion-mnist"
    cp "$src"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$ROOT/gpu-data/fashion-mnist/"
    du -sh "$ROOT/gpu-data"
    echo "next: 'scripts/gpu-check.sh pack' (gpu-pack/ holds them beside the programs)"
}

# THERE: the carried gpu-data kept in /tmp for the run half's call (which carries gpu-carry).
stash_data() {
    set -e
    mkdir -p /tmp/ddp-gpu-data
    cp -r "$ROOT/gpu-data/fashion-mnist" /tmp/ddp-gpu-data/
    ls -la /tmp/ddp-gpu-data/fashion-mnist
}

# HERE: the run half on the emulated GPU module (above).
rehearse() {
    local emu=${EMU_MODULE:-$ROOT/build/gpu_emu/libddp_gpu_emu.so}
    [ -e "$emu" ] || { echo "no emulated GPU module at $emu: build the tests (make build) first, or set EMU_MODULE" >&2; exit 2; }
    export DDP_GPU_MODULE=$emu PATH=/usr/bin:$PATH CHECK_LIMIT=${CHECK_LIMIT:-60}
    BUDGET=${GPU_CHECK_BUDGET:-100000} # no device call here
    export OUT=${OUT:-/tmp/gpu-rehearse}
    echo "rehearsal on the emulated GPU module $emu; expected to fail here: unit.test_cuda_kernels" \
        "(both runs), the torch-on-cuda checks (autocast, nccl), the Fashion-MNIST CNN (timed out)"
    run checks
    PY=/usr/bin/python3 bash bench/gpu_allreduce.sh "$CARRY" 65536,1048576 2>&1 | tee -a "$LOG"
    REHEARSAL=1 train_bench 2>&1 | tee -a "$LOG"
}

case "${1:-}" in
build) build ;;
rehearse) rehearse ;;
pack) pack ;;
data)
    shift
    data "$@"
    ;;
stash-data) stash_data ;;
run)
    shift
    run checks "$@"
    ;;
cnn) run cnn ;;
bench)
    shift
    run bench "$@"
    ;;
allreduce)
    shift
    allreduce "$@"
    ;;
*)
    echo "usage: scripts/gpu-check.sh build | pack | data [DIR] | stash-data | run | cnn | bench [--quick] | allreduce [SIZES] | rehearse" >&2
    exit 2
    ;;
esac
