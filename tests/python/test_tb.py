"""TensorBoard event files written by ddp/tb.h, read back by the `tensorboard` package itself.

tb_write writes two event files and prints every scalar it logged (tag, step, float32 bits,
wall time). This script checks, with tensorboard's own code:
  1. the file names (events.out.tfevents.<10-digit time>.<host>.<pid>.<n><suffix>);
  2. every record through tensorboard's TFRecord reader, which verifies both masked CRC-32Cs, and
     its Event parser: the version record first, then exactly the tags, steps, float32 values
     (bit for bit, NaN and infinities included) and wall times logged, in order;
  3. each record's bytes equal tensorboard's own serialisation of the same Event;
  4. what TensorBoard's scalar dashboard reads (EventFileLoader's migrated events, and
     EventAccumulator's Scalars) holds the same values;
  5. a resumed run (purge_step): TensorBoard drops the dead run's steps after the checkpoint.
tensorboard is not a Debian package: scripts/tb-venv.sh installs it from PyPI into a venv. When
that cannot be done (offline), the test is skipped (exit 77).
Usage: test_tb.py BINDIR VENV TB_VENV_SH"""
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile

SKIP = 77
BINDIR, VENV, SETUP = sys.argv[1:4]
vpy = os.path.join(VENV, "bin", "python")

if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    # Outside the venv: make it (once), then run this script again inside it.
    r = subprocess.run([SETUP, VENV])
    if r.returncode != 0:
        print(f"SKIP: no tensorboard package (scripts/tb-venv.sh {VENV} failed)")
        sys.exit(SKIP)
    os.execv(vpy, [vpy, os.path.abspath(__file__)] + sys.argv[1:])

from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.util import tensor_util

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}")


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def raw_records(path):
    """The data of each TFRecord, parsed here independently of tensorboard."""
    data = open(path, "rb").read()
    off, out = 0, []
    while off < len(data):
        (n,) = struct.unpack_from("<Q", data, off)
        (hcrc,) = struct.unpack_from("<I", data, off + 8)
        check(hcrc == pywrap_tensorflow.masked_crc32c(data[off:off + 8]), f"{path}: header crc")
        body = data[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, off + 12 + n)
        check(dcrc == pywrap_tensorflow.masked_crc32c(body), f"{path}: data crc")
        out.append(body)
        off += 16 + n
    check(off == len(data), f"{path}: ends exactly after its last record")
    return out


with tempfile.TemporaryDirectory(prefix="ddp-test-tb-py-") as d:
    out = subprocess.run([os.path.join(BINDIR, "tb_write"), d], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr)
        sys.exit(1)
    want = {}  # path -> [(tag, step, bits, wall)]
    for line in out.stdout.splitlines():
        path, tag, step, bits, wall = line.split("\t")
        want.setdefault(path, []).append((tag, int(step), int(bits, 16), float.fromhex(wall)))
    check(len(want) == 2, f"two event files written, got {len(want)}")
    check(sorted(os.listdir(d)) == sorted(os.path.basename(p) for p in want),
          f"the directory holds exactly the files written: {os.listdir(d)}")

    host, pid = socket.gethostname(), None
    for path, rows in want.items():
        name = os.path.basename(path)
        m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)(\.extra)?", name)
        check(m is not None and m.group(2) == host, f"file name {name}")
        if m:
            check(pid in (None, m.group(3)), f"{name}: one process wrote both files")
            pid = m.group(3)

        # 2. tensorboard's reader (CRCs checked) and Event parser.
        events = list(event_file_loader.LegacyEventFileLoader(path).Load())
        check(len(events) == len(rows) + 1, f"{name}: {len(events)} events, want {len(rows) + 1}")
        if not events:
            continue
        first = events[0]
        check(first.file_version == "brain.Event:2", f"{name}: file_version {first.file_version!r}")
        check(not first.HasField("summary") and first.step == 0, f"{name}: version record only")
        check(abs(first.wall_time - int(m.group(1)) if m else 0) < 2, f"{name}: version wall time")
        for ev, (tag, step, bits, wall) in zip(events[1:], rows):
            what = f"{name}: {tag[:40]!r} step {step}"
            check(ev.step == step, f"{what}: step {ev.step}")
            check(ev.wall_time == wall, f"{what}: wall_time {ev.wall_time!r} != {wall!r}")
            check(len(ev.summary.value) == 1, f"{what}: {len(ev.summary.value)} values")
            v = ev.summary.value[0]
            check(v.tag == tag, f"{what}: tag {v.tag[:40]!r}")
            check(v.WhichOneof("value") == "simple_value", f"{what}: {v.WhichOneof('value')}")
            check(f32_bits(v.simple_value) == bits,
                  f"{what}: value bits {f32_bits(v.simple_value):08x} != {bits:08x}")

        # 3. Byte for byte what tensorboard's own protobuf serialiser makes of the same Events.
        recs = raw_records(path)
        check(recs[:1] == [event_pb2.Event(wall_time=first.wall_time,
                                           file_version="brain.Event:2").SerializeToString()],
              f"{name}: version record bytes")
        for rec, (tag, step, bits, wall) in zip(recs[1:], rows):
            val = struct.unpack("<f", struct.pack("<I", bits))[0]
            ref = event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=val)]))
            check(rec == ref.SerializeToString(), f"{name}: {tag[:40]!r} step {step}: bytes "
                  f"{rec.hex()} != {ref.SerializeToString().hex()}")

        # 4. The scalar dashboard's view: simple_value migrated to a scalar tensor.
        migrated = [e for e in event_file_loader.EventFileLoader(path).Load()
                    if e.HasField("summary")]
        check(len(migrated) == len(rows), f"{name}: {len(migrated)} migrated summaries")
        for ev, (tag, step, bits, wall) in zip(migrated, rows):
            v = ev.summary.value[0]
            check(v.metadata.plugin_data.plugin_name == "scalars", f"{name}: {tag[:40]} plugin")
            got = f32_bits(float(tensor_util.make_ndarray(v.tensor)))
            check(got == bits, f"{name}: {tag[:40]} step {step}: dashboard {got:08x} != {bits:08x}")

    # EventAccumulator over the whole directory, as `tensorboard --logdir` loads a run.
    acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0},
                                             purge_orphaned_data=False)
    acc.Reload()
    rows = [r for rs in want.values() for r in rs]
    tags = sorted({r[0] for r in rows})
    check(sorted(acc.Tags()["scalars"]) == tags, f"scalar tags {sorted(acc.Tags()['scalars'])}")
    for tag in tags:
        exp = [(s, b, w) for t, s, b, w in rows if t == tag]
        got = [(e.step, f32_bits(e.value), e.wall_time) for e in acc.Scalars(tag)]
        check(got == exp, f"EventAccumulator {tag[:40]!r}: {got[:3]}… != {exp[:3]}…")

# A resumed run: its second file starts with a SessionLog START at step 6, and TensorBoard keeps
# the first file's steps 1..5 and the second's 6..8 (the first's 6..10 are purged).
with tempfile.TemporaryDirectory(prefix="ddp-test-tb-py-") as d:
    out = subprocess.run([os.path.join(BINDIR, "tb_write"), d, "resumed"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        print(out.stderr)
        sys.exit(1)
    files = sorted({line.split("\t")[0] for line in out.stdout.splitlines()})
    check(len(files) == 2, f"a run and its resumption: {len(files)} files")
    second = list(event_file_loader.LegacyEventFileLoader(files[-1]).Load())
    check(len(second) == 5, f"resumed file: {len(second)} events")
    start = second[1]
    check(start.HasField("session_log") and start.session_log.status == event_pb2.SessionLog.START
          and start.step == 6, f"resumed file: a SessionLog START at step 6: {start}")
    ref = event_pb2.Event(wall_time=start.wall_time, step=6,
                          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
    check(raw_records(files[-1])[1] == ref.SerializeToString(), "SessionLog record bytes")
    acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("p/x")]
    want_p = [(s, float(s)) for s in range(1, 6)] + [(s, 100.0 + s) for s in range(6, 9)]
    check(got == want_p, f"TensorBoard's view of a resumed run: {got}")

print(f"test_tb: {passed} checks passed, {failed} failed")
sys.exit(1 if failed else 0)
