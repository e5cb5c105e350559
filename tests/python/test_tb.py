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
  5. a resumed run (purge_step): TensorBoard drops the dead run's steps after the checkpoint;
  6. ddptrain itself, 2 ranks under ddprun (an MLP and a tiny GPT): out_dir/tb/ holds exactly
     the tags it documents, at the steps and with the values (float32 of the same double) that
     metrics.jsonl logged; a run killed by SIGKILL after a checkpoint at step s and resumed from
     it opens its file with purge_step = s + 1 (the first step it logs), and TensorBoard shows each step once, the
     killed run's up to the checkpoint and the resumed run's after it.
tensorboard is not a Debian package: scripts/tb-venv.sh installs it from PyPI into a venv. When
that cannot be done (offline), the test is skipped (exit 77).
Usage: test_tb.py BINDIR VENV TB_VENV_SH"""
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

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


# 6. ddptrain's own event files against its metrics.jsonl.
TB_TAGS = {"loss": "train/loss", "lr": "train/lr", "samples_per_s": "train/samples_per_s",
           "tokens_per_s": "train/tokens_per_s", "mfu": "train/mfu", "grad_norm": "train/grad_norm",
           "test_loss": "val/loss", "val_loss": "val/loss", "test_accuracy": "val/accuracy"}
MEM_TAGS = {"rank_peak_rss_mib": "memory/peak_rss_mib", "rank_gpu_mem_mib": "memory/gpu_mem_mib"}


def logged(run):
    """{tag: {step: float32 bits}} from run/metrics.jsonl, as TensorBoard should show it: a
    "start" line at step s (a resumed run) drops what earlier lines logged after s."""
    out = {}
    for line in open(os.path.join(run, "metrics.jsonl")):
        rec = json.loads(line)
        if rec.get("start"):
            for steps in out.values():
                for k in [k for k in steps if k > rec["step"]]:
                    del steps[k]
            continue
        for key, tag in TB_TAGS.items():
            if key in rec:
                out.setdefault(tag, {})[rec["step"]] = f32_bits(rec[key])
        for key, tag in MEM_TAGS.items():  # per rank in metrics.jsonl, the largest in TensorBoard
            known = [v for v in rec.get(key, []) if v is not None]  # null: a rank's unknown
            if known:
                out.setdefault(tag, {})[rec["step"]] = f32_bits(max(known))
    return out


def shown(run):
    """{tag: [(step, float32 bits)]}: what TensorBoard loads from run/tb."""
    acc = event_accumulator.EventAccumulator(os.path.join(run, "tb"),
                                             size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, f32_bits(e.value)) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def same(run, tags, what):
    want, got = logged(run), shown(run)
    check(sorted(got) == sorted(tags), f"{what}: tags {sorted(got)} != {sorted(tags)}")
    check(sorted(want) == sorted(tags), f"{what}: metrics.jsonl keys {sorted(want)}")
    for tag in tags:
        exp = sorted(want.get(tag, {}).items())
        check(got.get(tag) == exp, f"{what}: {tag}: TensorBoard {got.get(tag, [])[:4]}… != "
              f"metrics.jsonl {exp[:4]}…")
    return want, got


def ddptrain(args, out_dir, log):
    cmd = [os.path.join(BINDIR, "ddprun"), "--standalone", "--nproc_per_node=2",
           os.path.join(BINDIR, "ddptrain")] + args + ["--out_dir", out_dir]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=ENV)


def finished(p, log, what):
    if p.wait(timeout=240) != 0:
        print(open(log).read())
        check(False, f"{what}: ddptrain exited {p.returncode}")
        return False
    return True


ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
CLASSIFIER = ["train/loss", "train/lr", "train/samples_per_s", "train/mfu", "train/grad_norm",
              "memory/peak_rss_mib", "val/loss", "val/accuracy"]
with tempfile.TemporaryDirectory(prefix="ddp-test-tb-train-") as d:
    ENV["DDP_DATA_CACHE"] = os.path.join(d, "cache")
    mlp = ["--model.hidden", "64", "--batch_size", "32", "--log_every", "3"]
    run = os.path.join(d, "mlp")
    p = ddptrain(mlp + ["--total_steps", "12", "--eval_every", "6"], run, run + ".log")
    if finished(p, run + ".log", "mlp"):
        want, _ = same(run, CLASSIFIER, "mlp, 2 ranks")
        check(sorted(want["train/loss"]) == [3, 6, 9, 12], f"mlp: log steps {sorted(want['train/loss'])}")
        check(sorted(want["val/accuracy"]) == [6, 12], f"mlp: eval steps {sorted(want['val/accuracy'])}")
        check(len(os.listdir(os.path.join(run, "tb"))) == 1, "mlp: one event file")

    # A tiny GPT on a synthetic text: tokens/s, validation loss from step 0, no accuracy.
    text = os.path.join(d, "text.txt")
    words = "the a cat dog sat ran on under mat log and then it was red blue".split()
    with open(text, "w") as f:
        for doc in range(300):
            f.write(" ".join(words[(doc * 7 + i * 3) % 16] for i in range(12 + doc % 9)) + "\n%\n")
    run = os.path.join(d, "gpt")
    gpt = ["--model.type", "gpt", "--data.text", text, "--data.doc_sep", "%", "--model.n_layer",
           "1", "--model.n_head", "2", "--model.n_embd", "32", "--model.block_size", "16",
           "--batch_size", "4", "--optimizer", "adamw", "--lr", "3e-3", "--eval_windows", "8",
           "--max_new_tokens", "0", "--total_steps", "6", "--log_every", "2", "--eval_every", "3"]
    p = ddptrain(gpt, run, run + ".log")
    if finished(p, run + ".log", "gpt"):
        want, _ = same(run, ["train/loss", "train/lr", "train/tokens_per_s", "train/mfu",
                             "train/grad_norm", "memory/peak_rss_mib", "val/loss"], "gpt, 2 ranks")
        check(sorted(want["val/loss"]) == [0, 3, 6], f"gpt: eval steps {sorted(want['val/loss'])}")

    # tensorboard false: no tb directory.
    run = os.path.join(d, "off")
    p = ddptrain(mlp + ["--total_steps", "3", "--tensorboard", "false"], run, run + ".log")
    if finished(p, run + ".log", "tensorboard false"):
        check(not os.path.exists(os.path.join(run, "tb")), "tensorboard false: no out_dir/tb")

    # Killed (SIGKILL to ddprun, which takes its workers down) some steps after a checkpoint,
    # then resumed from it at step s: the resumed file starts with a SessionLog START at s + 1,
    # the first step it logs (the killed run's s, logged before its checkpoint, stays).
    run = os.path.join(d, "cut")
    args = mlp[:4] + ["--log_every", "1", "--checkpoint.every", "10", "--checkpoint.keep", "50"]
    p = ddptrain(args + ["--total_steps", "100000"], run, run + ".log")
    jsonl, last = os.path.join(run, "metrics.jsonl"), 0
    for _ in range(6000):
        if os.path.exists(jsonl):
            steps = [json.loads(l).get("step", 0) for l in open(jsonl) if l.endswith("\n")]
            last = max(steps or [0])
        if last >= 25 or p.poll() is not None:
            break
        time.sleep(0.01)
    p.kill()
    p.wait()
    ckpts = sorted(int(n[4:-12]) for n in os.listdir(os.path.join(run, "checkpoints"))
                   if re.fullmatch(r"step\d+\.safetensors", n))
    check(last >= 25 and ckpts and ckpts[-1] >= 10, f"killed after a checkpoint: {ckpts}, last {last}")
    dead = logged(run)
    # The kill lands anywhere in a step: when it came right after a checkpoint (the worker's
    # TensorBoard file then ends at that step), the resume must start from an earlier one, or
    # there is nothing to purge. Checkpoints at or past the dead run's last logged step go, as
    # if the run had died before writing them.
    dead_last = max(dead.get("train/loss", {}) or [0])
    for c in [c for c in ckpts if c >= dead_last]:
        os.remove(os.path.join(run, "checkpoints", f"step{c}.safetensors"))
    ckpts = [c for c in ckpts if c < dead_last]
    check(bool(ckpts), f"a checkpoint before the dead run's last step {dead_last}")
    at = ckpts[-1] if ckpts else 10
    p = ddptrain(args + ["--total_steps", str(at + 10), "--resume_from", "latest"], run,
                 run + ".resume.log")
    if finished(p, run + ".resume.log", "resumed run"):
        files = sorted(os.listdir(os.path.join(run, "tb")))
        check(len(files) == 2, f"killed + resumed: two event files {files}")
        newest = max(files, key=lambda n: int(n.rsplit(".", 1)[1]) + 10 * os.path.getmtime(os.path.join(run, "tb", n)))
        evs = list(event_file_loader.LegacyEventFileLoader(os.path.join(run, "tb", newest)).Load())
        check(len(evs) > 1 and evs[1].HasField("session_log") and evs[1].step == at + 1
              and evs[1].session_log.status == event_pb2.SessionLog.START,
              f"resumed file: a SessionLog START at step {at + 1}: {evs[1] if len(evs) > 1 else None}")
        want, got = same(run, ["train/loss", "train/lr", "train/samples_per_s", "train/mfu",
                               "train/grad_norm", "memory/peak_rss_mib", "val/loss",
                               "val/accuracy"], "killed + resumed")
        steps = [s for s, _ in got.get("train/loss", [])]
        check(steps == list(range(1, at + 11)), f"resumed: each step once, 1..{at + 10}: {steps}")
        check(all(dict(got["train/loss"])[s] == dead["train/loss"][s] for s in range(1, at + 1)),
              "resumed: steps up to the checkpoint are the killed run's")
        check(any(s > at for s in dead.get("train/loss", {})),
              f"the killed run had logged past its checkpoint at {at} (something to purge)")

print(f"test_tb: {passed} checks passed, {failed} failed")
sys.exit(1 if failed else 0)
