#!/usr/bin/env bash
# unit.flash_emu: src/kernels/cuda/flash.cu's kernels, unchanged, run on the CPU (cuda_emu.h)
# against a double-precision attention — their indexing, causal masks, partial tiles, online
# softmax and barrier order, on a machine without a GPU. Needs a C++20 compiler (std::atomic_ref)
# and python3 (cu_extract.py keeps the device code); skips (77) without them.
# usage: test_flash_emu.sh SRC_DIR WORK_DIR [--full]
set -euo pipefail
src=$1 work=$2
shift 2
cxx=${CXX:-c++}
mkdir -p "$work"
if ! command -v python3 >/dev/null ||
    ! echo '#include <atomic>
int main(){int x=0;std::atomic_ref<int>(x).fetch_add(1);}' | "$cxx" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
    echo "no python3 or no C++20 compiler with std::atomic_ref ($cxx): skipped"
    exit 77
fi
k=$src/src/kernels/cuda
python3 "$src/tests/emu/cu_extract.py" "$k/common.cuh" >"$work/common_cuh.inc"
python3 "$src/tests/emu/cu_extract.py" "$k/flash.cu" >"$work/flash_kernels.inc"
grep -q 'unsigned char \*smem = (unsigned char \*)emu.smem;' "$work/flash_kernels.inc" ||
    { echo "flash.cu's shared-memory declaration changed: update cu_extract.py"; exit 1; }
"$cxx" -std=c++20 -O2 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas -I"$src/src" -I"$src/tests/emu" \
    -I"$work" -o "$work/flash_emu" "$src/tests/emu/flash_emu.cpp"
"$work/flash_emu" "$@"
