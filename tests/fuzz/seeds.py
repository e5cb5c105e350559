"""Writes the seed corpus of each fuzz target into tests/fuzz/corpus/<target>/seed-*: small valid
and nearly valid inputs in each harness's input layout (see the comment atop fuzz_<target>.c).
Files named crash-* beside them are inputs that once crashed the library: they are kept, never
regenerated. Run it again after changing a harness's input layout.
Usage: python3 tests/fuzz/seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- config: YAML, then NUL-separated command-line arguments ---------------------------------
write("config", "flat", "lr: 0.05\nepochs: 3\nshuffle: no\nout_dir: runs/x\nschedule: linear\n")
write("config", "nested", "model:\n  type: cnn\n  hidden: [512, 256, 10]\n  dropout: 0.1\n"
      "data:\n  path: /tmp/d.bin\n  threads: 2\ncheckpoint: {every: 100}\na: {b: {c: {d: x}}}\n")
write("config", "flow", "{lr: 1e-3, model: {hidden: [1,2,3]}, shuffle: on}\n")
write("config", "quoted", "out_dir: \"runs/with space\"\ndata.path: 'it''s'\nlr: .5\n")
write("config", "anchors", "model: &m {type: gpt, hidden: [8]}\n# a comment\nepochs: 0x10\n")
write("config", "args", "lr: 0.1\n\0--lr\0" "0.2\0--model.hidden=4,5\0--shuffle\0--out-dir\0x")
write("config", "empty", "")
write("config", "errors", "lr: [1, 2]\nmodel:\n  hiden: 3\n")
write("config", "multiline", "out_dir: |\n  two\n  lines\n")

# ---- idx: u16 image-file length, image file, label file --------------------------------------


def idx(n, rows, cols, labels, nl=None, magic=0x803):
    img = struct.pack(">IIII", magic, n, rows, cols) + bytes((i * 37) % 256
                                                            for i in range(n * rows * cols))
    lab = struct.pack(">II", 0x801, len(labels) if nl is None else nl) + bytes(labels)
    return struct.pack("<H", len(img)) + img + lab


write("idx", "3x2x2", idx(3, 2, 2, [0, 1, 2]))
write("idx", "1x28x28", idx(1, 28, 28, [9]))
write("idx", "empty", idx(0, 4, 4, []))
write("idx", "mismatch", idx(2, 2, 2, [1]))
write("idx", "badmagic", idx(1, 1, 1, [0], magic=0x801))
write("idx", "labelcount", idx(2, 1, 3, [3, 4], nl=7))

# ---- tokens: one byte for the sequence length, then the file ---------------------------------
write("tokens", "nanogpt", bytes([7]) + struct.pack("<20H", *range(100, 120)))
write("tokens", "odd", bytes([0]) + b"\x01\x00\x02")
write("tokens", "short", bytes([9]) + struct.pack("<4H", 1, 2, 3, 4))
hdr = [0] * 256
hdr[0:3] = [20240520, 1, 12]
write("tokens", "llmc", bytes([3]) + struct.pack("<256i", *hdr)
      + struct.pack("<12H", *[(i * 5003) % 65536 for i in range(12)]))
hdr[1] = 2
write("tokens", "llmc-v2", bytes([3]) + struct.pack("<256i", *hdr) + bytes(24))

# ---- ckpt: a safetensors file -----------------------------------------------------------------


def safetensors(tensors, meta=None, pad=True, extra=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta is not None:
        header["__metadata__"] = meta
    if extra:
        header.update(extra)
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


write("ckpt", "two", safetensors(
    {"w": ("F32", [2, 3], struct.pack("<6f", *range(6))), "b": ("I64", [2], struct.pack("<2q", 1, 2))},
    meta={"step": "7", "config": "lr: 0.1\n"}))
write("ckpt", "dtypes", safetensors(
    {"a": ("F64", [1], bytes(8)), "h": ("BF16", [2], bytes(4)), "f": ("F16", [1, 1], bytes(2)),
     "i": ("I32", [], bytes(4)), "u": ("U8", [3], b"xyz"), "e": ("F32", [0, 5], b"")}, pad=False))
write("ckpt", "meta-only", safetensors({}, meta={"format": "ddptrain-1"}))
write("ckpt", "overlap", safetensors({"x": ("U8", [4], b"abcd")},
                                     extra={"y": {"dtype": "U8", "shape": [2],
                                                  "data_offsets": [1, 3]}}))
write("ckpt", "truncated", safetensors({"w": ("F32", [4], bytes(16))})[:-5])

# ---- store: a flags byte (bit i: connection i says HELLO first), then connections' bytes
# separated by "\n--\n". Frames: u32 length, u8 op, fields (src/store/store_int.h). -----------
SEP = b"\n--\n"
HELLO, SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUM_KEYS = range(1, 10)


def blob(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<I", len(b)) + b


def frame(op, *fields):
    body = bytes([op]) + b"".join(fields)
    return struct.pack("<I", len(body)) + body


def keys(*ks):
    return struct.pack("<I", len(ks)) + b"".join(blob(k) for k in ks)


write("store", "ops", bytes([1]) + frame(SET, blob("a"), blob("1")) + frame(GET, blob("a"))
      + frame(ADD, blob("n"), struct.pack("<q", 5)) + frame(CAS, blob("a"), blob("1"), blob("2"))
      + frame(CHECK, keys("a", "n", "z")) + frame(WAIT, keys("a")) + frame(DELETE, blob("a"))
      + frame(NUM_KEYS))
write("store", "park", bytes([3]) + frame(GET, blob("k")) + frame(WAIT, keys("k", "j")) + SEP
      + frame(SET, blob("k"), blob("v")) + frame(SET, blob("j"), blob("w")))
write("store", "hello", bytes([0]) + frame(HELLO, struct.pack("<II", 0x53504444, 1),
                                           blob("fuzz-token")) + frame(NUM_KEYS))
write("store", "wrong-token", bytes([0]) + frame(HELLO, struct.pack("<II", 0x53504444, 1),
                                                 blob("guess")))
write("store", "http", bytes([0]) + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
write("store", "huge", bytes([1]) + b"\xf0\xff\xff\xff")
write("store", "add-text", bytes([1]) + frame(SET, blob("c"), blob("x"))
      + frame(ADD, blob("c"), struct.pack("<q", 1))
      + frame(ADD, blob("d"), struct.pack("<q", 2**63 - 1)) + frame(ADD, blob("d"), struct.pack("<q", 1)))
write("store", "full", bytes([1]) + b"".join(frame(SET, blob(f"k{i}"), blob("v" * 1000))
                                             for i in range(9)) + frame(SET, blob("x"), blob("v" * 1100)))
write("store", "half", bytes([1]) + frame(SET, blob("a"), blob("1"))[:7])
