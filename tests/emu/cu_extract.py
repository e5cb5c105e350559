#!/usr/bin/env python3
"""tests/emu/cu_extract.py — the device code of a .cu/.cuh file, for cuda_emu.h: every top-level
item (function, struct, template, variable) that mentions __global__/__device__/__host__, every
struct/enum/typedef/using/constexpr/const that names no CUDA-library type, #define lines, namespaces kept around
them, and the host functions named by --keep; everything else (includes, host launchers, cuBLAS)
dropped. Shared memory rewritten for the emulated block: `extern __shared__ T a[];` becomes
`T *a = (T *)emu.smem;`, a static `__shared__ T a[N]…;` a reference into the block's own static
area (emu_static_shared). The source is not modified. usage: cu_extract.py FILE [--keep a,b]"""
import re
import sys

HOST_TYPES = re.compile(r"\b(cuda[A-Z]\w*|cublas\w*|cudnn\w*|CUBLAS_\w+|CUDA_R_\w+|nccl\w*)\b")
DEVICE = re.compile(r"\b(__global__|__device__|__host__)\b")
TYPEISH = re.compile(r"^\s*(template\s*<[^{;]*>\s*)?(struct|class|enum|union|typedef|using|constexpr|"
                     r"static\s+constexpr)\b|^\s*(static\s+)?const\s[^(]*=")
STRUCTISH = re.compile(r"^\s*(template\s*<[^{;]*>\s*)?(struct|class|enum|union)\b")
sid = [0]


def strip_comments(s):
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", s, flags=re.S)


def rewrite_shared(s):
    s = re.sub(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:<>\s]+?)\s*(\w+)\s*\[\s*\]\s*;",
               r"\1 *\2 = (\1 *)emu.smem;", s)

    def stat(m):
        t, name, dims = m.group(1).strip(), m.group(2), m.group(3) or ""
        sid[0] += 1
        ty = f"{t}{dims}"
        return (f"{t} (&{name}){dims} = *reinterpret_cast<{t} (*){dims}>("
                f"emu_static_shared(sizeof({ty}), {sid[0]}));")
    return re.sub(r"(?<!extern )__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:<>]+(?:\s*\*)?)\s+(\w+)\s*((?:\[[^\]]+\])*)\s*;",
                  stat, s)


def items(src):
    """Yields (kind, text): kind 'pp' (a preprocessor line), 'open' (namespace/extern "C" {),
    'close' (its }), 'item'."""
    i, n, depth, start = 0, len(src), 0, 0
    stack = []  # per open brace at top: True if transparent (namespace/extern C)
    at_line_start = True
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            i = j + 1
            continue
        if c == "#" and depth == 0 and strip_comments(src[start:i]).strip() == "":
            j = i
            while True:
                e = src.find("\n", j)
                e = n if e < 0 else e
                if src[e - 1] == "\\":
                    j = e + 1
                    continue
                break
            yield "pp", src[i:e]
            i = start = e
            continue
        if c == "{":
            if depth == 0:
                head = strip_comments(src[start:i])
                if re.fullmatch(r"\s*(namespace(\s+\w+)?|extern\s+\"C\")\s*", head):
                    yield "open", head.strip() + " {"
                    stack.append(True)
                    i += 1
                    start = i
                    continue
            depth += 1
        elif c == "}":
            if depth == 0:
                if stack:
                    stack.pop()
                    yield "close", "}"
                    i += 1
                    start = i
                    continue
            depth -= 1
            if depth == 0:
                j = i + 1
                while j < n and src[j] in " \t\n":
                    j += 1
                head = strip_comments(src[start:i])
                if j < n and src[j] == ";" or STRUCTISH.match(head):
                    while src[j] != ";":
                        j += 1
                    i = j
                yield "item", src[start:i + 1]
                i += 1
                start = i
                continue
        elif c == ";" and depth == 0:
            yield "item", src[start:i + 1]
            i += 1
            start = i
            continue
        i += 1


def main():
    path = sys.argv[1]
    keep = set()
    if len(sys.argv) > 3 and sys.argv[2] == "--keep":
        keep = set(sys.argv[3].split(","))
    src = open(path).read()
    out = [f"/* extracted from {path} by tests/emu/cu_extract.py */"]
    for kind, text in items(src):
        if kind == "pp":
            if re.match(r"#\s*define\b", text) and not re.match(r"#\s*define\s+\w+_(CUH|H)\s*$", text):
                out.append(text)
            continue
        if kind in ("open", "close"):
            out.append(text)
            continue
        code = strip_comments(text)
        if not code.strip():
            continue
        m = re.search(r"(\w+)\s*\(", code.split("{")[0])
        name = m.group(1) if m else None
        if DEVICE.search(code) or (TYPEISH.match(code) and not HOST_TYPES.search(code)) or name in keep:
            out.append(rewrite_shared(text.strip("\n")))
    print("\n".join(out))


if __name__ == "__main__":
    main()
