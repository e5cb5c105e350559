#!/usr/bin/env python3
"""tests/emu/cu_module.py — a whole .cu/.cuh file of src/kernels/cuda, host code included, as C++
for the emulated GPU module (tests/emu/CMakeLists.txt): shared memory rewritten as cu_extract.py does
(the emulated block's), and every launch `k<T><<<grid, block[, smem[, stream]]>>>(args)` rewritten
to `emu_rt_launch("k<T>", [=] { k<T>(args); }, grid, block[, smem[, stream]])`
(include/cuda_runtime_api.h: validated as the hardware does, then queued on its stream and run on
the CPU in the stream's turn: [=], so the arguments are the values at the launch), and a
kernel's __launch_bounds__(N) checked at its entry (emu_launch_bounds). Nothing else changes: the source is not modified. usage: cu_module.py FILE > OUT"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cu_extract import rewrite_shared  # noqa: E402


def match_close(s, i, open_c, close_c):
    """Index of the close_c matching s[i] == open_c (forward)."""
    depth = 0
    while i < len(s):
        if s[i] == open_c:
            depth += 1
        elif s[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise SystemExit(f"cu_module.py: unbalanced {open_c} in a launch")


def kernel_start(s, i):
    """Start of the kernel expression ending just before s[i] (`name<T, U>`, `ns::name`)."""
    j = i
    while j > 0 and s[j - 1].isspace():
        j -= 1
    if s[j - 1] == ">":
        depth = 0
        while j > 0:
            j -= 1
            if s[j] == ">":
                depth += 1
            elif s[j] == "<":
                depth -= 1
                if depth == 0:
                    break
    while j > 0 and (s[j - 1].isalnum() or s[j - 1] in "_:"):
        j -= 1
    return j


def rewrite_launches(s):
    out, pos, n = [], 0, 0
    while True:
        i = s.find("<<<", pos)
        if i < 0:
            break
        k0 = kernel_start(s, i)
        kern = s[k0:i].strip()
        e = s.find(">>>", i)
        cfg = s[i + 3:e]
        j = e + 3
        while s[j].isspace():
            j += 1
        if s[j] != "(":
            raise SystemExit(f"cu_module.py: a launch of {kern} without arguments")
        a1 = match_close(s, j, "(", ")")
        args = s[j:a1 + 1]
        out.append(s[pos:k0])
        out.append(f'emu_rt_launch("{" ".join(kern.split())}", [=] {{ {kern}{args}; }}, {cfg})')
        pos = a1 + 1
        n += 1
    out.append(s[pos:])
    return "".join(out), n


def rewrite_bounds(s):
    """`__launch_bounds__(N) k(…) {` gets `emu_launch_bounds(N, "k");` first in its body: a
    launch of more threads than N is one the hardware refuses (too many resources)."""
    out, pos = [], 0
    for m in re.finditer(r"__launch_bounds__\s*\(", s):
        if m.start() < pos:
            continue
        a1 = match_close(s, m.end() - 1, "(", ")")
        bound = s[m.end():a1].split(",")[0].strip()
        name = re.search(r"(\w+)\s*\(", s[a1 + 1:])
        j = a1 + 1 + name.end() - 1
        j = match_close(s, j, "(", ")")
        b = s.find("{", j)
        out.append(s[pos:b + 1])
        out.append(f' emu_launch_bounds({bound}, "{name.group(1)}");')
        pos = b + 1
    out.append(s[pos:])
    return "".join(out)


def main():
    src = open(sys.argv[1]).read()
    body, n = rewrite_launches(src)
    body = rewrite_shared(rewrite_bounds(body))
    print(f"/* {sys.argv[1]} for the emulated GPU module (tests/emu/cu_module.py: {n} launches) */")
    print(f'#line 1 "{sys.argv[1]}"')
    print(body, end="")


if __name__ == "__main__":
    main()
