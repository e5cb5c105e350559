#!/usr/bin/env bash
# unit.<name>_emu: the kernels of src/kernels/cuda, unchanged, run on the CPU (cuda_emu.h; their
# device code kept by cu_extract.py) against the product's CPU layers in libddp.
# usage: test_kernels_emu.sh SRC_DIR WORK_DIR NAME LIBDDP "LINK FLAGS" SANITIZE C_COMPILER_ID [ARGS]
#   NAME: attention (tests/emu/attention_emu.cpp), flash, …; LIBDDP '' builds the test without
#   libddp (-DEMU_NO_LIBDDP: flash's under TSan); SANITIZE: '', address or thread (the
#   build's DDP_SANITIZE: the test is built with the same sanitizer as libddp); C_COMPILER_ID
#   Clang picks clang++ (the same sanitizer runtime as libddp's) unless CXX is set; ARGS go to the
#   test program (flash: --full runs every shape).
# Needs a C++20 compiler (std::atomic_ref) and python3; skips (77) without them.
set -euo pipefail
src=$1 work=$2 name=$3 lib=$4 link=$5 san=${6:-} ccid=${7:-}
shift $(($# < 7 ? $# : 7))
cxx=${CXX:-c++}
[ -z "${CXX:-}" ] && [ "$ccid" = Clang ] && command -v clang++ >/dev/null && cxx=clang++
mkdir -p "$work"
if ! command -v python3 >/dev/null ||
    ! echo '#include <atomic>
int main(){int x=0;std::atomic_ref<int>(x).fetch_add(1);}' | "$cxx" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
    echo "no python3 or no C++20 compiler with std::atomic_ref ($cxx): skipped"
    exit 77
fi
k=$src/src/kernels/cuda
ex() { python3 "$src/tests/emu/cu_extract.py" "$@"; }
ex "$k/common.cuh" --keep ddp__cuda_blocks >"$work/common_cuh.inc"
ex "$k/dropout.cuh" --keep ddp__drop_args >"$work/dropout_cuh.inc"
for f in attention dropout layers gemm optim ipcreduce classifier flash; do
    ex "$k/$f.cu" >"$work/${f}_kernels.inc"
done
grep -q 'unsigned char \*smem = (unsigned char \*)emu.smem;' "$work/flash_kernels.inc" ||
    { echo "flash.cu's shared-memory declaration changed: update cu_extract.py"; exit 1; }
ex "$k/devmath.cu" --keep reduce_blocks >"$work/devmath_kernels.inc"
# LIBDDP '': the test program is built without libddp (flash's under TSan, unsanitized there:
# its own reference only, EMU_NO_LIBDDP)
flags=()
[ -z "$lib" ] && flags=(-DEMU_NO_LIBDDP) link=""
# ASan+UBSan at -O0: the compile (4 s) is most of such a test — at -O2 it takes 18 s for a
# program that then runs in under a second (flash's 35 s run excepted: 40 s either way)
# Debug information only where a report uses it (the sanitizers' file:line): without it the plain
# build's compile is a quarter shorter (flash: 12 → 9 s, for a 1.3 s run). Under TSan -g1 (line
# tables: file:line and inlined frames in its reports, no variables): a fifth off its -O2
# compile (layers: 11–13 → 9–10.5 s of CPU), about half of such a test (at ASan's -O0, -g costs
# nothing).
opt=-O2 dbg=
case $san in
address) flags+=(-fsanitize=address,undefined -fno-omit-frame-pointer) opt=-O0 dbg=-g ;;
thread) flags+=(-fsanitize=thread) dbg=-g1 ;;
esac
# shellcheck disable=SC2086
"$cxx" -std=c++20 $opt $dbg -pthread "${flags[@]}" -Wall -Wno-unused-function -Wno-unknown-pragmas \
    -I"$src/include" -I"$src/src" -I"$src/tests/emu" -I"$work" -o "$work/${name}_emu" \
    "$src/tests/emu/${name}_emu.cpp" ${lib:+"$lib"} $link -lm -ldl
"$work/${name}_emu" "$@"
