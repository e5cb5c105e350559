"""Layer and optimizer parity: ddpc's ddp/nn.h kernels (run through nn_dump) against torch's CPU
modules and autograd, on inputs torch generates from a fixed seed. Every output must satisfy
|ddpc - torch| <= 1e-4 * max(1, |torch|) elementwise (absolute for values up to 1, relative above).
Parameter gradients start from nonzero values, so accumulation (+=) is checked as well.
Usage: test_nn_torch.py BINDIR  (runs BINDIR/nn_dump; needs Debian's python3-torch)"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

TOL = 1e-4
torch.manual_seed(1234)
BIN = os.path.join(sys.argv[1], "nn_dump")
passed = failed = 0
worst_all = (0.0, "")


def run(d, op, inputs, args, outputs):
    """Writes inputs (name -> tensor/ndarray) to d, runs nn_dump, returns name -> ndarray."""
    for name, t in inputs.items():
        a = t.detach().numpy() if isinstance(t, torch.Tensor) else t
        a = np.ascontiguousarray(a)
        if a.dtype not in (np.float32, np.int32):
            a = a.astype(np.float32)
        a.tofile(os.path.join(d, name + ".bin"))
    subprocess.run([BIN, d, op] + [repr(x) if isinstance(x, float) else str(x) for x in args],
                   check=True)
    out = {}
    for name, dtype in outputs.items():
        out[name] = np.fromfile(os.path.join(d, "out_" + name + ".bin"), dtype=dtype)
    return out


def check(case, name, got, want):
    global passed, failed, worst_all
    want = want.detach().double().numpy().ravel() if isinstance(want, torch.Tensor) else \
        np.asarray(want, dtype=np.float64).ravel()
    got = np.asarray(got, dtype=np.float64).ravel()
    if got.shape != want.shape:
        failed += 1
        print(f"FAIL {case} {name}: shape {got.shape}, torch {want.shape}")
        return
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    worst = float(err.max()) if err.size else 0.0
    if worst > worst_all[0]:
        worst_all = (worst, f"{case} {name}")
    if worst <= TOL and np.all(np.isfinite(got)):
        passed += 1
    else:
        failed += 1
        i = int(np.argmax(err))
        print(f"FAIL {case} {name}: max scaled error {worst:.3g} at {i}: "
              f"ddpc {got[i]:.8g}, torch {want[i]:.8g}")


def linear(d, B, i, o):
    x = torch.randn(B, i, requires_grad=True)
    lin = torch.nn.Linear(i, o)
    dy, dW0, db0 = torch.randn(B, o), torch.randn(o, i), torch.randn(o)
    y = lin(x)
    y.backward(dy)
    r = run(d, "linear", dict(x=x, W=lin.weight, b=lin.bias, dy=dy, dW=dW0, db=db0), [B, i, o],
            dict(y=np.float32, dx=np.float32, dW=np.float32, db=np.float32))
    case = f"linear B={B} in={i} out={o}"
    check(case, "y", r["y"], y)
    check(case, "dx", r["dx"], x.grad)
    check(case, "dW", r["dW"], dW0 + lin.weight.grad)
    check(case, "db", r["db"], db0 + lin.bias.grad)


def conv2d(d, B, cin, h, w, cout, kh, kw, s, p):
    x = torch.randn(B, cin, h, w, requires_grad=True)
    conv = torch.nn.Conv2d(cin, cout, (kh, kw), stride=s, padding=p)
    y = conv(x)
    dy, dW0, db0 = torch.randn(y.shape), torch.randn(conv.weight.shape), torch.randn(cout)
    y.backward(dy)
    r = run(d, "conv2d", dict(x=x, W=conv.weight, b=conv.bias, dy=dy, dW=dW0, db=db0),
            [B, cin, h, w, cout, kh, kw, s, p],
            dict(y=np.float32, dx=np.float32, dW=np.float32, db=np.float32))
    case = f"conv2d {B}x{cin}x{h}x{w} -> {cout} k={kh}x{kw} stride={s} pad={p}"
    check(case, "y", r["y"], y)
    check(case, "dx", r["dx"], x.grad)
    check(case, "dW", r["dW"], dW0 + conv.weight.grad)
    check(case, "db", r["db"], db0 + conv.bias.grad)


def maxpool(d, B, C, h, w, k, s):
    x = torch.randn(B, C, h, w, requires_grad=True)
    y = F.max_pool2d(x, k, s)
    dy = torch.randn(y.shape)
    y.backward(dy)
    r = run(d, "maxpool", dict(x=x, dy=dy), [B, C, h, w, k, s], dict(y=np.float32, dx=np.float32))
    case = f"maxpool {B}x{C}x{h}x{w} k={k} stride={s}"
    check(case, "y", r["y"], y)
    check(case, "dx", r["dx"], x.grad)


def batchnorm(d, shape, train):
    B, C = shape[0], shape[1]
    hw = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    bn = (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d)(C, momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(C) + 0.5)
        bn.bias.copy_(torch.randn(C))
        bn.running_mean.copy_(torch.randn(C) * 0.5)
        bn.running_var.copy_(torch.rand(C) + 0.5)
    rm0, rv0 = bn.running_mean.clone(), bn.running_var.clone()
    bn.train(train)
    x = (torch.randn(*shape) * 2 + 1).requires_grad_(True)
    dy, dg0, db0 = torch.randn(*shape), torch.randn(C), torch.randn(C)
    y = bn(x)
    y.backward(dy)
    r = run(d, "batchnorm", dict(x=x, gamma=bn.weight, beta=bn.bias, rm=rm0, rv=rv0, dy=dy,
                                 dgamma=dg0, dbeta=db0), [B, C, hw, int(train), 0.1],
            dict(y=np.float32, dx=np.float32, dgamma=np.float32, dbeta=np.float32, rm=np.float32,
                 rv=np.float32))
    case = f"batchnorm {'x'.join(map(str, shape))} {'train' if train else 'eval'}"
    check(case, "y", r["y"], y)
    check(case, "dx", r["dx"], x.grad)
    check(case, "dgamma", r["dgamma"], dg0 + bn.weight.grad)
    check(case, "dbeta", r["dbeta"], db0 + bn.bias.grad)
    check(case, "running_mean", r["rm"], bn.running_mean)
    check(case, "running_var", r["rv"], bn.running_var)


def gelu(d, n):
    x = (torch.randn(n) * 3).requires_grad_(True)
    y = torch.nn.GELU()(x)
    dy = torch.randn(n)
    y.backward(dy)
    r = run(d, "gelu", dict(x=x, dy=dy), [n], dict(y=np.float32, dx=np.float32))
    check(f"gelu n={n}", "y", r["y"], y)
    check(f"gelu n={n}", "dx", r["dx"], x.grad)


def xent(d, B, C, scale):
    logits = (torch.randn(B, C) * 3).requires_grad_(True)
    labels = torch.randint(0, C, (B,), dtype=torch.int32)
    loss = F.cross_entropy(logits, labels.long())
    (loss * scale).backward()
    r = run(d, "xent", dict(logits=logits, labels=labels.numpy()), [B, C, scale],
            dict(loss=np.float64, dlogits=np.float32, correct=np.int32))
    case = f"softmax-CE B={B} C={C} scale={scale}"
    check(case, "loss", r["loss"], loss)
    check(case, "dlogits", r["dlogits"], logits.grad)
    check(case, "correct", r["correct"], [int((logits.argmax(1) == labels.long()).sum())])


def optimizer(d, kind, n, steps, **kw):
    p0 = torch.randn(n)
    grads = torch.randn(steps, n)
    p = torch.nn.Parameter(p0.clone())
    if kind == "sgd":
        opt = torch.optim.SGD([p], lr=kw["lr"], momentum=kw["momentum"],
                              weight_decay=kw["wd"])
        args = [n, steps, kw["lr"], kw["momentum"], kw["wd"]]
        outs = dict(p=np.float32, buf=np.float32)
    else:
        opt = torch.optim.AdamW([p], lr=kw["lr"], betas=(kw["b1"], kw["b2"]), eps=kw["eps"],
                                weight_decay=kw["wd"])
        args = [n, steps, kw["lr"], kw["b1"], kw["b2"], kw["eps"], kw["wd"]]
        outs = dict(p=np.float32, m=np.float32, v=np.float32)
    for s in range(steps):
        p.grad = grads[s].clone()
        opt.step()
    r = run(d, kind, dict(p=p0, g=grads), args, outs)
    st = opt.state[p]
    case = f"{kind} n={n} steps={steps} " + " ".join(f"{k}={v}" for k, v in kw.items())
    check(case, "p", r["p"], p)
    if kind == "sgd":
        if kw["momentum"]:  # torch keeps no buffer without momentum
            check(case, "momentum_buffer", r["buf"], st["momentum_buffer"])
    else:
        check(case, "exp_avg", r["m"], st["exp_avg"])
        check(case, "exp_avg_sq", r["v"], st["exp_avg_sq"])


with tempfile.TemporaryDirectory(prefix="ddp-nn-") as d:
    linear(d, 8, 33, 17)
    linear(d, 64, 256, 128)
    conv2d(d, 2, 3, 9, 8, 4, 3, 3, 2, 1)   # stride 2, padding 1
    conv2d(d, 4, 8, 16, 16, 16, 3, 3, 2, 1)
    conv2d(d, 3, 2, 7, 6, 5, 5, 3, 1, 0)   # no padding, non-square kernel
    maxpool(d, 2, 3, 8, 9, 2, 2)
    maxpool(d, 2, 4, 9, 9, 3, 2)           # overlapping windows
    batchnorm(d, (16, 5), True)
    batchnorm(d, (16, 5), False)
    batchnorm(d, (4, 3, 5, 6), True)
    batchnorm(d, (4, 3, 5, 6), False)
    gelu(d, 4096)
    xent(d, 32, 10, 1.0)
    xent(d, 7, 3, 0.25)                    # gradient-accumulation scale
    optimizer(d, "sgd", 1000, 6, lr=0.1, momentum=0.9, wd=0.01)
    optimizer(d, "sgd", 1000, 3, lr=0.05, momentum=0.0, wd=0.0)
    optimizer(d, "adamw", 1000, 10, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=0.1)
    optimizer(d, "adamw", 1000, 5, lr=3e-4, b1=0.8, b2=0.95, eps=1e-6, wd=0.0)

print(f"largest scaled error {worst_all[0]:.3g} ({worst_all[1]}); tolerance {TOL}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
