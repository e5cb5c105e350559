"""Checkpoint parity with PyTorch, both ways, without the safetensors package (not on Debian):
  1. ckpt_tool writes reference tensors; this script parses the file per the safetensors format
     (struct + json), loads every tensor with torch.frombuffer and checks dtype, shape, values,
     metadata and the layout (8-aligned data, packed offsets covering the buffer).
  2. This script writes files from torch tensors (an aligned one, and one with an unpadded header,
     shuffled offsets and odd names, as other writers produce) and ckpt_tool must read back
     exactly the same values.
  3. Broken files written here must be refused by ckpt_tool with a clear message.
Usage: test_ckpt_torch.py BINDIR  (runs BINDIR/ckpt_tool; needs Debian's python3-torch)"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import torch

TOOL = os.path.join(sys.argv[1], "ckpt_tool")
DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
          "F16": torch.float16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}
NAMES = {v: k for k, v in DTYPES.items()}
# ckpt_tool prints the library's dtype names (ddp_dtype_name), which are torch's.
BY_DDP_NAME = {str(t).removeprefix("torch."): t for t in DTYPES.values()}
passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}")


def reference():
    """The tensors ckpt_tool write saves (see ckpt_tool.c), built in torch."""
    k12, k6 = torch.arange(12, dtype=torch.float32), torch.arange(6, dtype=torch.float32)
    return {
        "fc1.weight": ((k12 - 5) * 0.375).reshape(3, 4),
        "fc1.bias": torch.tensor([1.0, 1 / 2, 1 / 3, 1 / 4], dtype=torch.float32),
        "emb": ((k6 - 2) * 1.5).to(torch.bfloat16).reshape(2, 3),
        "pos": torch.tensor([(1 << 40) * k - 7 for k in range(5)], dtype=torch.int64),
        "scale": torch.tensor(0.1, dtype=torch.float64),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        "ids": torch.tensor([-100000 * k for k in range(4)], dtype=torch.int32),
        "half": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16),
        "mask": torch.tensor([50 * k for k in range(5)], dtype=torch.uint8),
    }, {"step": "1234", "epoch": "3", "config": '{"lr": 0.001, "model": "mlp"}',
        "note": "ünïcode ✓"}


def load(path):
    """Parses a safetensors file by the format alone: (tensors, metadata, header length)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for b, e in spans:
        check(b == pos, f"{path}: tensor at {b} does not follow the previous one at {pos}")
        pos = e
    check(pos == len(data), f"{path}: tensors cover {pos} of {len(data)} data bytes")
    out = {}
    for name, v in header.items():
        b, e = v["data_offsets"]
        dt = DTYPES[v["dtype"]]
        if e > b:
            t = torch.frombuffer(bytearray(data[b:e]), dtype=dt).reshape(v["shape"])
        else:
            t = torch.empty(v["shape"], dtype=dt)
        out[name] = t
    return out, meta, n


def tensor_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def save(path, tensors, meta, pad=True, shuffle=False, meta_last=False):
    """Writes tensors (name → torch tensor) as safetensors, like other writers could."""
    items = list(tensors.items())
    order = list(reversed(items)) if shuffle else items  # data order differs from header order
    offs, pos, blobs = {}, 0, []
    for name, t in order:
        b = tensor_bytes(t)
        offs[name] = [pos, pos + len(b)]
        pos += len(b)
        blobs.append(b)
    header = {} if meta_last else {"__metadata__": meta}
    for name, t in items:
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": offs[name]}
    if meta_last:
        header["__metadata__"] = meta
    h = json.dumps(header, ensure_ascii=False).encode("utf-8")
    if pad:
        h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True)


def parse_dump(text):
    tensors, meta = {}, {}
    unhex = lambda s: "" if s == "-" else bytes.fromhex(s).decode("utf-8")
    for line in text.splitlines():
        f = line.split(" ")
        if f[0] == "M":
            meta[unhex(f[1])] = unhex(f[2])
            continue
        name, dt, nd = unhex(f[1]), BY_DDP_NAME[f[2]], int(f[3])
        shape = [int(x) for x in f[4:4 + nd]]
        vals = f[4 + nd:]
        if dt.is_floating_point:
            t = torch.tensor([float.fromhex(x) for x in vals], dtype=torch.float64)
        else:
            t = torch.tensor([int(x) for x in vals], dtype=torch.int64)
        tensors[name] = (dt, t.reshape(shape))
    return tensors, meta


def compare_dump(label, text, tensors, meta):
    got, gmeta = parse_dump(text)
    check(sorted(got) == sorted(tensors), f"{label}: names {sorted(got)} != {sorted(tensors)}")
    for name, want in tensors.items():
        if name not in got:
            continue
        dt, t = got[name]
        ref = want.to(torch.float64 if want.dtype.is_floating_point else torch.int64)
        check(dt == want.dtype and t.shape == want.shape and torch.equal(t, ref),
              f"{label}: tensor '{name}' differs: {dt} {tuple(t.shape)} vs {want.dtype} "
              f"{tuple(want.shape)}")
    check(gmeta == meta, f"{label}: metadata {gmeta} != {meta}")


with tempfile.TemporaryDirectory(prefix="ddp-ckpt-torch-") as d:
    # 1. C writes, torch reads.
    p = os.path.join(d, "from_c.safetensors")
    r = tool("write", p)
    check(r.returncode == 0, f"ckpt_tool write failed: {r.stderr}")
    ref, ref_meta = reference()
    got, meta, n = load(p)
    check((8 + n) % 8 == 0, f"data start {8 + n} is not 8-aligned")
    check(sorted(got) == sorted(ref), f"names {sorted(got)} != {sorted(ref)}")
    for name, want in ref.items():
        t = got.get(name)
        check(t is not None and t.dtype == want.dtype and t.shape == want.shape
              and torch.equal(t, want), f"C→torch tensor '{name}': got {t}, want {want}")
    # ddpc's own entry: the data section's CRC-32, checked here with Python's zlib.
    crc = meta.pop("ddp.data_crc32", None)
    with open(p, "rb") as f:
        raw = f.read()
    want_crc = f"{zlib.crc32(raw[8 + n:]):08x}"
    check(crc == want_crc, f"ddp.data_crc32 {crc} != zlib.crc32 of the data {want_crc}")
    check(meta == ref_meta, f"C→torch metadata {meta} != {ref_meta}")
    print(f"C → torch: {len(got)} tensors and {len(meta)} metadata entries identical, "
          f"data CRC-32 {crc} as zlib's")

    # 2. torch writes, C reads.
    g = torch.Generator().manual_seed(0)
    mine = {
        "layers.0.weight": torch.randn(16, 8, generator=g),
        "layers.0.bias": torch.randn(16, generator=g),
        "wte": torch.randn(10, 6, generator=g).to(torch.bfloat16),
        "h": torch.randn(3, 5, generator=g).to(torch.float16),
        "dbl": torch.randn(2, 2, 2, generator=g, dtype=torch.float64),
        "rng_state": torch.randint(-2**62, 2**62, (7,), generator=g, dtype=torch.int64),
        "counts": torch.randint(-2**31, 2**31 - 1, (5,), generator=g, dtype=torch.int32),
        "bytes": torch.randint(0, 256, (13,), generator=g, dtype=torch.uint8),
        "scalar": torch.tensor(2.5),
        "none": torch.zeros(4, 0, dtype=torch.int64),
        "naïve/名前": torch.arange(3, dtype=torch.float32),
    }
    mmeta = {"step": "77", "sampler": json.dumps({"epoch": 2, "pos": 480}), "empty": ""}
    for label, kw in [("aligned", {}), ("unaligned+shuffled",
                                        {"pad": False, "shuffle": True, "meta_last": True})]:
        p = os.path.join(d, f"from_torch_{label}.safetensors")
        save(p, mine, mmeta, **kw)
        r = tool("dump", p)
        check(r.returncode == 0, f"torch→C ({label}): ckpt_tool dump failed: {r.stderr}")
        if r.returncode == 0:
            compare_dump(f"torch→C ({label})", r.stdout, mine, mmeta)
    # The file C wrote, dumped by C, must also match the reference (the round trip in C).
    r = tool("dump", os.path.join(d, "from_c.safetensors"))
    check(r.returncode == 0, f"ckpt_tool dump of its own file failed: {r.stderr}")
    compare_dump("C→C", r.stdout, ref, ref_meta)
    print(f"torch → C: {len(mine)} tensors of every dtype identical, aligned and unaligned")

    # 3. Broken files are refused with a message naming the file and the problem.
    good = os.path.join(d, "from_torch_aligned.safetensors")
    raw = open(good, "rb").read()
    cases = {
        "truncated": raw[:-3],
        "trailing garbage": raw + b"\0" * 4,
        "unsupported dtype": raw.replace(b'"F16"', b'"F8_"', 1),
        "invalid JSON": raw[:8] + b"!" + raw[9:],
        "absurd": struct.pack("<Q", 1 << 40) + raw[8:],
    }
    for want, content in cases.items():
        p = os.path.join(d, "broken.safetensors")
        open(p, "wb").write(content)
        r = tool("dump", p)
        check(r.returncode == 1 and want in r.stderr and p in r.stderr,
              f"broken file ({want}): exit {r.returncode}, stderr {r.stderr.strip()!r}")
    print(f"broken files: {len(cases)} refused with a clear message")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
