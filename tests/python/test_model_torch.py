"""Model-level parity with PyTorch, through ddptrain's own checkpoints: for the MLP and the CNN, with ReLU and with GELU,
(1) the checkpoint's weights, loaded by name into the equivalent torch model, give the same test
loss and accuracy as `ddptrain --task test`; (2) one more training step of ddptrain (same batch,
SGD with momentum, constant lr) gives the weights torch computes from the same checkpoint and
batch — forward, backward and optimizer checked at once. The checkpoints are parsed here as the
safetensors format says (Debian has no Python safetensors package).
Usage: test_model_torch.py BINDIR"""
import atexit
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

BIN = sys.argv[1]
DATA = "/usr/share/datasets/fashion-mnist"
torch.set_num_threads(1)
passed = failed = 0


def check(ok, what):
    global passed, failed
    passed += ok
    failed += not ok
    print(("ok: " if ok else "FAIL: ") + what, flush=True)


def load_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out, meta


def idx(split):
    with gzip.open(f"{DATA}/{split}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32)
    with gzip.open(f"{DATA}/{split}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(x * np.float32(1.0 / 255.0)), torch.from_numpy(y)


class Net(nn.Module):
    """The torch twin of ddptrain's models, with the same parameter names."""

    def __init__(self, kind, hidden, channels, act):
        super().__init__()
        self.kind, self.stages, self.nfc = kind, len(channels), len(hidden) + 1
        self.act = torch.relu if act == "relu" else nn.functional.gelu
        c, side = 1, 28
        if kind == "cnn":
            for s, oc in enumerate(channels, 1):
                setattr(self, f"conv{s}", nn.Conv2d(c, oc, 3, padding=1))
                setattr(self, f"bn{s}", nn.BatchNorm2d(oc))
                c, side = oc, side // 2
        n = c * side * side
        for k, h in enumerate(hidden + [10], 1):
            setattr(self, f"fc{k}", nn.Linear(n, h))
            n = h

    def forward(self, x):
        if self.kind == "cnn":
            for s in range(1, self.stages + 1):
                x = nn.functional.max_pool2d(
                    self.act(getattr(self, f"bn{s}")(getattr(self, f"conv{s}")(x))), 2)
        x = x.flatten(1)
        for k in range(1, self.nfc + 1):
            x = getattr(self, f"fc{k}")(x)
            if k < self.nfc:
                x = self.act(x)
        return x


def run(args, out):
    r = subprocess.run([f"{BIN}/ddptrain"] + args + ["--out_dir", out], capture_output=True,
                       text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if r.returncode != 0:
        print(r.stdout, r.stderr)
    return r


xt, yt = idx("t10k")
xtr, ytr = idx("train")
# The training runs evaluate at their last step, which nothing here reads: they get the training
# set and only the first 100 test images (a data.dir of links and a slice), so that the 10000
# test images are evaluated once per model, by --task test given the whole data.dir (else it takes
# the checkpoint's); under TSan each evaluation took ~15 s.
ROOT = tempfile.mkdtemp(prefix="ddp-parity-")  # everything this test writes; removed at exit
atexit.register(shutil.rmtree, ROOT, True)
TRAIN_DIR = tempfile.mkdtemp(prefix="data-", dir=ROOT)
for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
    os.symlink(f"{DATA}/{f}", f"{TRAIN_DIR}/{f}")
with gzip.open(f"{DATA}/t10k-images-idx3-ubyte.gz") as f:
    raw = f.read()
open(f"{TRAIN_DIR}/t10k-images-idx3-ubyte", "wb").write(
    struct.pack(">IIII", 0x803, 100, 28, 28) + raw[16:16 + 100 * 784])
with gzip.open(f"{DATA}/t10k-labels-idx1-ubyte.gz") as f:
    raw = f.read()
open(f"{TRAIN_DIR}/t10k-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, 100) + raw[8:108])
for kind, hidden, channels, act in [("mlp", [64, 32], [], "relu"), ("cnn", [32], [8, 16], "relu"),
                                    ("mlp", [48], [], "gelu"), ("cnn", [16], [4, 8], "gelu")]:
    out = tempfile.mkdtemp(prefix=f"{kind}-", dir=ROOT)
    kind_ = kind
    kind = f"{kind_} ({act})"
    common = ["--model.type", kind_, "--model.activation", act,
              "--model.hidden", ",".join(map(str, hidden)),
              "--schedule", "constant", "--lr", "0.05", "--momentum", "0.9", "--log_every", "0",
              "--eval_every", "100000", "--checkpoint.keep", "10"]
    if channels:
        common += ["--model.channels", ",".join(map(str, channels))]
    assert run(common + ["--total_steps", "25", "--data.dir", TRAIN_DIR], out).returncode == 0
    ck, meta = load_st(f"{out}/checkpoints/step25.safetensors")
    net = Net(kind_, hidden, channels, act)
    sd = {k: v for k, v in ck.items() if not k.startswith("optim.")}
    missing = net.load_state_dict(sd, strict=False)
    check(not missing.missing_keys or all("num_batches" in k for k in missing.missing_keys),
          f"{kind}: every checkpoint weight loads into the torch model by name")
    # (1) evaluation
    r = run(common + ["--task", "test", "--total_steps", "25", "--data.dir", DATA], out)
    line = [l for l in r.stdout.splitlines() if "test accuracy" in l][-1]
    c_loss = float(line.split("test loss ")[1].split(",")[0])
    c_acc = float(line.split("test accuracy ")[1].split(" ")[0])
    net.eval()
    with torch.no_grad():
        logits = net(xt)
        t_loss = nn.functional.cross_entropy(logits, yt).item()
        t_acc = (logits.argmax(1) == yt).float().mean().item()
    check(abs(c_loss - t_loss) <= 1e-4 * max(1, abs(t_loss)) and abs(c_acc - t_acc) <= 2e-4,
          f"{kind}: test loss {c_loss:.4f} / accuracy {c_acc:.4f} vs torch {t_loss:.4f} / {t_acc:.4f}")
    # (2) one more step from the checkpoint, the same batch in torch
    assert run(common + ["--total_steps", "26", "--resume_from", "latest", "--data.dir", TRAIN_DIR],
               out).returncode == 0
    ck26, _ = load_st(f"{out}/checkpoints/step26.safetensors")
    epoch, nb = int(meta["epoch"]), int(meta["next_batch"])
    s = DistributedSampler(range(len(xtr)), num_replicas=1, rank=0, seed=42)
    s.set_epoch(epoch)
    ids = list(s)[nb * 64:(nb + 1) * 64]
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for name, p in net.named_parameters():
        opt.state[p]["momentum_buffer"] = ck[f"optim.{name}.momentum_buffer"].clone().reshape(p.shape)
    opt.zero_grad()
    nn.functional.cross_entropy(net(xtr[ids]), ytr[ids]).backward()
    opt.step()
    worst = max(((p.detach() - ck26[n]).abs().max() / ck26[n].abs().max().clamp(min=1e-6)).item()
                for n, p in net.named_parameters())
    check(worst <= 1e-4, f"{kind}: one training step matches torch (max relative difference {worst:.2e})")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
