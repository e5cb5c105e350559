#!/usr/bin/env bash
# unit.flash_emu: src/kernels/cuda/flash.cu's kernels, unchanged, run on the CPU (cuda_emu.h)
# against a double-precision attention — their indexing, causal masks, partial tiles, online
# softmax and barrier order, on a machine without a GPU. Needs a C++20 compiler (std::barrier);
# skips (77) without one. usage: test_flash_emu.sh SRC_DIR WORK_DIR [--full]
set -euo pipefail
src=$1 work=$2
shift 2
cxx=${CXX:-c++}
mkdir -p "$work"
# the kernels without the CUDA headers, the extern shared array as the emulated block's buffer,
# and without the host launchers (from "The launches" on)
sed -e '/^#include/d' \
    -e 's/extern __shared__ __align__(128) unsigned char smem\[\];/unsigned char *smem = emu.smem;/' \
    -e '/^\/\* The launches of one (E, HS). \*\//,$d' \
    "$src/src/kernels/cuda/flash.cu" >"$work/flash_kernels.inc"
echo "} // namespace" >>"$work/flash_kernels.inc"
grep -q 'unsigned char \*smem = emu.smem;' "$work/flash_kernels.inc" ||
    { echo "flash.cu's shared-memory declaration changed: update test_flash_emu.sh"; exit 1; }
if ! echo '#include <barrier>' | "$cxx" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
    echo "no C++20 compiler with <barrier> ($cxx): skipped"
    exit 77
fi
"$cxx" -std=c++20 -O2 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas -I"$src/src" -I"$src/tests/emu" \
    -I"$work" -o "$work/flash_emu" "$src/tests/emu/flash_emu.cpp"
"$work/flash_emu" "$@"
