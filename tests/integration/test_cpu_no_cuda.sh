#!/usr/bin/env bash
# A CPU-only program loads no CUDA library (docs/gpu.md, the GPU module), and a float32 one no
# oneDNN (docs/nn.md, bf16 on the CPU): the programs are not
# linked against libcudart, libcublas, libcublasLt, libcudnn or libnccl (ldd), and a CPU run — ddptrain
# --help, a short ddptrain run on the CPU, two ranks of it under ddprun — maps none of them nor
# the GPU module (LD_DEBUG=files lists every library a process loads, dlopen included). The
# control: device auto, in a build with the module, does load it (so the check can see a load),
# and from where the search says (docs/gpu.md): beside the program, in its ../lib, or
# DDP_GPU_MODULE.
. "$(dirname "$0")/lib.sh"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_DATA_CACHE=$T/cache
CUDA_RE='lib(cudart|cublas|cublasLt|nccl|cudnn|cuda)\.so|libddp_gpu\.so'
cd "$T"

for b in ddptrain ddprun ddpbench ddpprep hello_world test_world test_gpu_module; do
    [ -x "$BIN/$b" ] || fail "no $BIN/$b"
    if ldd "$BIN/$b" | grep -E "$CUDA_RE"; then fail "$b is linked against a CUDA library"; fi
done
ok "no program is linked against a CUDA library (ldd)"

# loaded LOG: the CUDA libraries (or the module) a LD_DEBUG=files log shows loaded
loaded() { grep -E 'file=.*\[0\];' "$1" | grep -oE "$CUDA_RE" | sort -u | tr '\n' ' ' || true; }

LD_DEBUG=files LD_DEBUG_OUTPUT=$T/help "$BIN/ddptrain" --help >/dev/null 2>&1
ls "$T"/help.* >/dev/null || fail "LD_DEBUG wrote no log"
[ -z "$(loaded "$T"/help.*)" ] || fail "ddptrain --help loaded: $(loaded "$T"/help.*)"
grep -q 'file=libopenblas' "$T"/help.* || fail "the LD_DEBUG log does not list libopenblas"
ok "ddptrain --help loads no CUDA library"

awk 'BEGIN { for (d = 0; d < 300; d++) print "the cat sat on the mat " d "\n%" }' >text.txt
TINY=(--model.type gpt --data.text "$T/text.txt" --data.doc_sep % --model.n_layer 1
      --model.n_head 2 --model.n_embd 16 --model.block_size 16 --batch_size 2 --optimizer adamw
      --lr 1e-3 --eval_windows 4 --max_new_tokens 0 --log_every 2 --total_steps 4)
LD_DEBUG=files LD_DEBUG_OUTPUT=$T/one "$BIN/ddptrain" "${TINY[@]}" --device cpu --out_dir one \
    >out 2>&1 || { cat out; fail "a CPU ddptrain run"; }
assert_contains out "trained 4 steps"
[ -z "$(loaded "$T"/one.*)" ] || fail "a CPU ddptrain run loaded: $(loaded "$T"/one.*)"
ok "a CPU ddptrain run loads no CUDA library"

# oneDNN (bf16 products on the CPU) likewise: a float32 run does not map it, a bf16 run does.
# Sanitizer builds link it at start (CMakeLists.txt says why): nothing to see there.
if [ -z "$(ldd "$BIN/ddptrain" | grep libdnnl)" ]; then
    ! grep -qE 'file=.*libdnnl\.so.*\[0\];' "$T"/one.* || fail "a float32 run loaded oneDNN"
    if have_cpu_bf16; then
        LD_DEBUG=files LD_DEBUG_OUTPUT=$T/bf "$BIN/ddptrain" "${TINY[@]}" --precision bf16 \
            --out_dir bf >out 2>&1 || { cat out; fail "a bf16 ddptrain run"; }
        grep -qE 'file=.*libdnnl\.so.*\[0\];' "$T"/bf.* || fail "a bf16 run did not load oneDNN"
    fi
    ok "a float32 run loads no oneDNN (a bf16 run does)"
fi

LD_DEBUG=files LD_DEBUG_OUTPUT=$T/two "$DDPRUN" --standalone --nproc_per_node=2 \
    "$BIN/ddptrain" "${TINY[@]}" --device cpu --out_dir two >out 2>&1 ||
    { cat out; fail "two CPU ranks under ddprun"; }
assert_contains out "trained 4 steps"
[ "$(ls "$T"/two.* | wc -l)" -ge 3 ] || fail "expected LD_DEBUG logs of ddprun and two workers"
[ -z "$(loaded "$T"/two.*)" ] || fail "ddprun and its CPU workers loaded: $(loaded "$T"/two.*)"
ok "ddprun and two CPU workers load no CUDA library"

# The control: device auto asks for the GPU, so a build with the module loads it.
LD_DEBUG=files LD_DEBUG_OUTPUT=$T/auto "$BIN/ddptrain" "${TINY[@]}" --device auto --out_dir auto \
    >out 2>&1 || { cat out; fail "device auto"; }
if grep -q 'built without CUDA' out; then
    [ -z "$(loaded "$T"/auto.*)" ] || fail "a build without CUDA loaded: $(loaded "$T"/auto.*)"
    ok "device auto in a build without CUDA loads nothing and says so"
else
    case "$(loaded "$T"/auto.*)" in
    *libcudnn*) cat out; fail "device auto mapped cuDNN: only a CNN on cuda loads it" ;;
    *libddp_gpu.so*) ok "device auto loads the GPU module ($(loaded "$T"/auto.*))" ;;
    *) cat out; fail "device auto did not load the GPU module" ;;
    esac
fi

# cuDNN is loaded by the module when a model needs it (docs/gpu.md), never linked: the module
# loads on a machine without cuDNN.
if [ -e "$BIN/../lib/libddp_gpu.so" ]; then
    if ldd "$BIN/../lib/libddp_gpu.so" | grep -E 'libcudnn'; then
        fail "the GPU module is linked against cuDNN: a machine without it could not load it"
    fi
    ok "the GPU module is not linked against cuDNN (it loads it for a CNN)"
fi

# Where the module is found: copies of ddptrain laid out as installed (bin/ and lib/), flat
# (the module beside the program), and an override; LD_DEBUG names the file loaded.
MOD=$BIN/../lib/libddp_gpu.so
if [ -e "$MOD" ]; then
    mkdir -p inst/bin inst/lib flat
    cp "$BIN/ddptrain" inst/bin/ && cp "$MOD" inst/lib/
    cp "$BIN/ddptrain" flat/ && cp "$MOD" flat/
    # from_where DIR PROGRAM: the path the module was loaded from
    from_where() {
        rm -f "$T"/w.*
        LD_DEBUG=files LD_DEBUG_OUTPUT=$T/w "$2" "${TINY[@]}" --device auto --total_steps 1 \
            --out_dir "$1" >out 2>&1 || { cat out; fail "device auto from $2"; }
        grep -hoE 'file=[^ ]*libddp_gpu\.so' "$T"/w.* | head -1 | cut -d= -f2
    }
    [ "$(from_where i "$T/inst/bin/ddptrain")" = "$T/inst/bin/../lib/libddp_gpu.so" ] ||
        fail "installed layout: loaded $(from_where i "$T/inst/bin/ddptrain")"
    [ "$(from_where f "$T/flat/ddptrain")" = "$T/flat/libddp_gpu.so" ] ||
        fail "flat layout: loaded $(from_where f "$T/flat/ddptrain")"
    [ "$(DDP_GPU_MODULE=$T/flat/libddp_gpu.so from_where o "$T/inst/bin/ddptrain")" = \
        "$T/flat/libddp_gpu.so" ] || fail "DDP_GPU_MODULE was not the file loaded"
    rm inst/lib/libddp_gpu.so
    [ "$(from_where b "$T/inst/bin/ddptrain")" = "$(cd "$BIN/../lib" && pwd)/libddp_gpu.so" ] ||
        fail "without one beside it, the build tree's module: loaded $(from_where b "$T/inst/bin/ddptrain")"
    ok "the module is found beside the program, in its ../lib, in the build tree, or DDP_GPU_MODULE"
    rc=0; DDP_GPU_MODULE=$T/none.so "$T/inst/bin/ddptrain" "${TINY[@]}" --device cuda \
        --out_dir n >out 2>err || rc=$?
    [ $rc -eq 1 ] || fail "device cuda with a missing module: exit code $rc, expected 1"
    assert_contains err "cannot load the GPU module $T/none.so: cannot open shared object file"
    ok "device cuda with a missing module: one line naming the file"
fi
