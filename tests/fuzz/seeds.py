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

# ---- store_client: 8 call bytes (low 4 bits: set, get, add, compare_set, check, wait, delete,
# num_keys, barrier; 0xff ends), then what the server answers on each connection, separated by
# "\n--\n". Replies: u32 length, u8 code, fields (src/store/store_int.h). -----------------------


def reply(code, *fields):
    body = bytes([code]) + b"".join(fields)
    return struct.pack("<I", len(body)) + body


OK_HELLO = reply(0, struct.pack("<q", 1 << 20))
write("store_client", "all-ops", bytes([0, 1, 2, 3, 4, 5, 6, 7]) + OK_HELLO + reply(0)
      + reply(0, blob("value")) + reply(0, struct.pack("<q", 3))
      + reply(0, blob("value"), b"\x01") + reply(0, b"\x01") + reply(0) + reply(0, b"\x00")
      + reply(0, struct.pack("<q", 2)))
write("store_client", "barrier", bytes([8, 0xff, 0, 0, 0, 0, 0, 0]) + OK_HELLO
      + reply(0, struct.pack("<q", 2)) + reply(0) + reply(0))
write("store_client", "refused", bytes([0] * 8) + reply(1, blob("wrong token")))
write("store_client", "errors", bytes([1, 2, 0, 7, 0xff, 0, 0, 0]) + OK_HELLO
      + reply(2, blob("bad key")) + reply(3, blob("too large")) + reply(9) + SEP + OK_HELLO
      + reply(4, blob("malformed")))
write("store_client", "reconnect", bytes([1, 1, 1, 0xff, 0, 0, 0, 0]) + OK_HELLO
      + reply(0, blob("v"))[:6] + SEP + OK_HELLO + reply(0, b"\x05\x00\x00") + SEP + OK_HELLO
      + reply(0, blob("w")))
write("store_client", "http", bytes([1] * 8) + b"HTTP/1.1 400 Bad Request\r\n\r\n")
# crash-huge-reply (kept, not written here): a 2 GiB reply length instead of the handshake's
# reply made the client allocate 2 GiB before a byte of it arrived.
write("store_client", "huge-after-hello", bytes([1] * 8) + OK_HELLO + b"\x00\x00\x00\x40\x00")
write("store_client", "huge-max-value", bytes([1] * 8) + reply(0, struct.pack("<q", 1 << 40))
      + b"\xff\xff\xff\x7f\x00")
write("store_client", "small-max", bytes([0] * 8) + reply(0, struct.pack("<q", 1)) + reply(0))

# ---- tcp: a flags byte (bits 0-3: stranger i first sends a hello with the token, without the
# prefix; bit 4: it names member 0, bit 5: the control channel, bit 6: a world of 3, bit 7:
# channel 2), then each
# stranger's bytes, separated by "\n--\n". The hello: u32 "DDPH", version, member, n, channel,
# token length, prefix length, token, prefix (src/group/tcp/tcp_int.h). ------------------------
write("tcp", "nothing", bytes([0]))
write("tcp", "http", bytes([0]) + b"GET / HTTP/1.1\r\n\r\n" + SEP + b"\x16\x03\x01\x00")


def tcp_hello(member=1, n=2, ch=0, token=b"guess", prefix=b"fz", tlen=None, plen=None):
    return struct.pack("<7I", 0x48504444, 1, member, n, ch,
                       len(token) if tlen is None else tlen,
                       len(prefix) if plen is None else plen) + token + prefix


write("tcp", "wrong-token", bytes([0]) + tcp_hello() + SEP + tcp_hello(ch=1, token=b""))
write("tcp", "long-claims", bytes([0]) + tcp_hello(tlen=1024, plen=1024) + SEP
      + tcp_hello(tlen=0xffffffff))
write("tcp", "token-other-group", bytes([1]) + b"xy" + SEP + b"f")
write("tcp", "token-other-member", bytes([1 | 2 | 16]) + b"fz" + SEP + b"fz")
write("tcp", "token-other-size", bytes([1 | 32 | 64]) + b"fz")
write("tcp", "token-bad-channel", bytes([1 | 128]) + b"fz")

# ---- trainstate: a trainer-state file: parameters w (2x3), b (3), optimizer states exp_avg and
# exp_avg_sq, buffer bn.mean (2), and the position metadata. ----------------------------------


def trainstate(**meta):
    t = {}
    for name, n in (("w", 6), ("b", 3)):
        t[name] = ("F32", [n], struct.pack(f"<{n}f", *range(n)))
        for s in ("exp_avg", "exp_avg_sq"):
            t[f"optim.{name}.{s}"] = ("F32", [n], bytes(4 * n))
    t["bn.mean"] = ("F32", [2], bytes(8))
    m = {"format": "ddptrain-1", "step": "10", "epoch": "1", "next_batch": "4",
         "world_size": "2", "loss": "1.5", "config": "lr: 0.1\n"}
    m.update(meta)
    return safetensors(t, meta={k: v for k, v in m.items() if v is not None})


write("trainstate", "plain", trainstate())
write("trainstate", "amp", trainstate(optim_step="9", loss_scale="65536", loss_scale_growth="3"))
write("trainstate", "no-format", trainstate(format=None))
write("trainstate", "bad-step", trainstate(step="1x"))
write("trainstate", "other-format", trainstate(format="ddptrain-0"))

# ---- text: a byte for val_every (% 5), the separator line, then up to three text files
# separated by "\n--\n". ---------------------------------------------------------------------
write("text", "fortune", bytes([3]) + b"%\nA saying.\n%\nAnother one,\r\non two lines.\r\n%\r\n"
      b"The last\n%\n")
write("text", "files", bytes([2]) + b"\none\n--\ntwo\n--\nthree")
write("text", "no-val", bytes([0]) + b"\n\xff\x00binary")
write("text", "empty", bytes([1]) + b"%\n")

# ---- hostlist: a byte for the node, then a Slurm host list / tasks-per-node string. ----------
write("hostlist", "ranges", bytes([2]) + b"node[01-03,07],gpu-a[1-2]-x plain")
write("hostlist", "tasks", bytes([3]) + b"2(x3),1")
write("hostlist", "nested", bytes([0]) + b"a[1-2]b[3-4],c[[1]]")
write("hostlist", "bad", bytes([0]) + b"n[5-2],m[,]x[1-")
