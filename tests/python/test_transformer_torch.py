"""Transformer-layer parity: ddpc's GPT-2 layers of ddp/nn.h (run through transformer_dump) against
torch 1.13's CPU modules and autograd on inputs torch generates from a fixed seed. Outputs are
float32 on both sides; the reference is torch in float32, written as nanoGPT's model.py writes it
(the manual attention path: torch 1.13 has no scaled_dot_product_attention).

Tolerances, as the largest error relative to the tensor's scale, max|ddpc - torch| / max|torch|
(elementwise relative error is meaningless where a gradient passes through zero):
  TOL_VALUE  2e-6  forward values, and gradients with no long sum behind them (GELU, embedding):
                   a few float ulps;
  TOL_GRAD   2e-5  products and gradients that sum over a row or a batch (layernorm, attention,
                   LM head, cross-entropy: torch float32's own softmax at V = 50257 is 5e-6 from
                   float64) and differ from torch's by summation order;
  TOL_LOSS   1e-5  losses, relative: |ddpc - torch| / |torch|.
For information, the same error of torch float32 itself against torch float64 is printed for the
attention and cross-entropy cases: ddpc should be as close to float64 as torch is.
Last, a whole GPT (tests/python/tiny_gpt.c: nanoGPT's model composed from these layers, tied
lm_head, with and without biases) against the same model in torch: the loss within TOL_LOSS and
the gradient of every parameter within TOL_GRAD.
Parameter gradients start from nonzero values, so accumulation (+=) is checked as well.
Usage: test_transformer_torch.py BINDIR  (runs BINDIR/transformer_dump; skips, exit 77, without
torch)"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: torch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)

TOL_VALUE, TOL_GRAD, TOL_LOSS = 2e-6, 2e-5, 1e-5
torch.manual_seed(1234)
BIN = os.path.join(sys.argv[1], "transformer_dump")
# One OpenBLAS thread: the layers are single-threaded, and OpenBLAS's worker threads synchronise in
# ways ThreadSanitizer cannot see (its reports on them are false, and they stop the TSan build).
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")
passed = failed = 0
worst_all = {}


def run(d, op, inputs, args, outputs):
    """Writes inputs (name -> tensor/ndarray) to d, runs the tool, returns name -> ndarray."""
    for name, t in inputs.items():
        a = t.detach().numpy() if isinstance(t, torch.Tensor) else t
        a = np.ascontiguousarray(a)
        if a.dtype not in (np.float32, np.int32):
            a = a.astype(np.float32)
        a.tofile(os.path.join(d, name + ".bin"))
    subprocess.run([BIN, d, op] + [repr(x) if isinstance(x, float) else str(x) for x in args],
                   check=True, env=ENV)
    return {name: np.fromfile(os.path.join(d, "out_" + name + ".bin"), dtype=dtype)
            for name, dtype in outputs.items()}


def as64(t):
    return t.detach().double().numpy().ravel() if isinstance(t, torch.Tensor) else \
        np.asarray(t, dtype=np.float64).ravel()


def scaled_err(got, want):
    got, want = as64(got), as64(want)
    if got.shape != want.shape:
        return None
    scale = max(float(np.abs(want).max()) if want.size else 0.0, 1e-30)
    return float(np.abs(got - want).max()) / scale if want.size else 0.0


def record(kind, case, name, err, tol, ok, extra=""):
    global passed, failed
    if case.startswith("gpt"):
        kind = "gpt " + kind
    if err > worst_all.get(kind, (0.0, ""))[0]:
        worst_all[kind] = (err, f"{case} {name}")
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {case} {name}: error {err:.3g} > {tol:g} {extra}")


def check(case, name, got, want, tol, ref64=None):
    """max|got - want| / max|want| <= tol, all finite. ref64: float64 result, for information."""
    err = scaled_err(got, want)
    if err is None:
        record("shape", case, name, 1.0, tol, False,
               f"(shape {as64(got).shape} vs torch {as64(want).shape})")
        return
    ok = err <= tol and bool(np.all(np.isfinite(as64(got))))
    record("grad" if tol == TOL_GRAD else "value", case, name, err, tol, ok)
    if ref64 is not None:
        print(f"  {case} {name}: ddpc-torch {err:.2e}; vs float64: ddpc {scaled_err(got, ref64):.2e},"
              f" torch {scaled_err(want, ref64):.2e}")


def check_loss(case, name, got, want):
    got, want = float(as64(got)[0]), float(as64(want)[0])
    err = abs(got - want) / max(abs(want), 1e-30)
    record("loss", case, name, err, TOL_LOSS, err <= TOL_LOSS, f"(ddpc {got!r}, torch {want!r})")


# ---- the layers ------------------------------------------------------------------------------

def embedding(d, B, T, C, V, npos):
    idx = torch.randint(0, V, (B, T), dtype=torch.int32)
    idx[0, :3] = 5  # the same token three times: its gradient rows add
    wte, wpe = torch.randn(V, C, requires_grad=True), torch.randn(npos, C, requires_grad=True)
    x = F.embedding(idx.long(), wte) + F.embedding(torch.arange(T), wpe)
    dx, dwte0, dwpe0 = torch.randn(B, T, C), torch.randn(V, C), torch.randn(npos, C)
    x.backward(dx)
    r = run(d, "embedding", dict(idx=idx.numpy(), wte=wte, wpe=wpe, dx=dx, dwte=dwte0,
                                 dwpe=dwpe0), [B, T, C, V, npos],
            dict(x=np.float32, dwte=np.float32, dwpe=np.float32))
    case = f"embedding B={B} T={T} C={C} V={V}"
    check(case, "x", r["x"], x, TOL_VALUE)
    check(case, "dwte", r["dwte"], dwte0 + wte.grad, TOL_VALUE)
    check(case, "dwpe", r["dwpe"], dwpe0 + wpe.grad, TOL_VALUE)


def embedding_bad_id(d):
    """An id out of range is an error with a message, not a crash."""
    idx = np.array([[1, 2, 3], [4, 99, 5]], dtype=np.int32)
    inputs = dict(idx=idx, wte=np.zeros((10, 4), np.float32), wpe=np.zeros((8, 4), np.float32),
                  dx=np.zeros((2, 3, 4), np.float32), dwte=np.zeros((10, 4), np.float32),
                  dwpe=np.zeros((8, 4), np.float32))
    for name, a in inputs.items():
        a.tofile(os.path.join(d, name + ".bin"))
    p = subprocess.run([BIN, d, "embedding", "2", "3", "4", "10", "8"], capture_output=True,
                       text=True, env=ENV)
    msg = p.stderr.strip()
    ok = p.returncode == 1 and "99" in msg and "position 1" in msg and "vocab_size 10" in msg
    record("value", "embedding", "bad id message", 0.0 if ok else 1.0, 0, ok, f"({msg!r})")


def layernorm(d, N, C, bias, shift=0.0):
    x = (torch.randn(N, C) * 2 + shift).requires_grad_(True)
    ln = torch.nn.LayerNorm(C, eps=1e-5, elementwise_affine=True)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(C))
        ln.bias.copy_(torch.randn(C) if bias else torch.zeros(C))
    y = F.layer_norm(x, (C,), ln.weight, ln.bias if bias else None, 1e-5)
    dy, dw0, db0 = torch.randn(N, C), torch.randn(C), torch.randn(C)
    y.backward(dy)
    ins = dict(x=x, w=ln.weight, dy=dy, dw=dw0)
    outs = dict(y=np.float32, mean=np.float32, rstd=np.float32, dx=np.float32, dw=np.float32)
    if bias:
        ins.update(b=ln.bias, db=db0)
        outs.update(db=np.float32)
    r = run(d, "layernorm", ins, [N, C, int(bias)], outs)
    case = f"layernorm N={N} C={C} bias={bias} shift={shift}"
    xd = x.detach().double()
    check(case, "y", r["y"], y, TOL_VALUE)
    check(case, "mean", r["mean"], xd.mean(1), TOL_VALUE)
    check(case, "rstd", r["rstd"], 1 / torch.sqrt(xd.var(1, unbiased=False) + 1e-5), TOL_VALUE)
    check(case, "dx", r["dx"], x.grad, TOL_GRAD)
    check(case, "dweight", r["dw"], dw0 + ln.weight.grad, TOL_GRAD)
    if bias:
        check(case, "dbias", r["db"], db0 + ln.bias.grad, TOL_GRAD)


def gelu_tanh(d, n):
    x = torch.randn(n) * 3
    x[:6] = torch.tensor([0.0, -10.0, 10.0, -30.0, 30.0, -5.5])
    x.requires_grad_(True)
    y = F.gelu(x, approximate="tanh")
    dy = torch.randn(n)
    y.backward(dy)
    r = run(d, "gelu_tanh", dict(x=x, dy=dy), [n], dict(y=np.float32, dx=np.float32))
    check(f"gelu_tanh n={n}", "y", r["y"], y, TOL_VALUE)
    check(f"gelu_tanh n={n}", "dx", r["dx"], x.grad, TOL_VALUE)


def torch_attention(qkv, B, T, C, nh, mask=None):
    """nanoGPT's CausalSelfAttention between c_attn and c_proj (its slow path)."""
    hs = C // nh
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, nh, hs).transpose(1, 2)
    k = k.view(B, T, nh, hs).transpose(1, 2)
    v = v.view(B, T, nh, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    att = att.masked_fill(torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T) == 0,
                          float("-inf"))
    lse = torch.logsumexp(att, dim=-1)
    att = F.softmax(att, dim=-1)
    if mask is not None:
        att = att * mask  # torch's dropout: input * (bernoulli(1 - p) / (1 - p))
    y = att @ v
    return y.transpose(1, 2).contiguous().view(B, T, C), lse


def attention(d, B, T, C, nh, p=0.0, train=True, seed=11, step=3, offset=0, verbose=False):
    qkv = (torch.randn(B, T, 3 * C) * 1.5).requires_grad_(True)
    dout = torch.randn(B, T, C)
    r = run(d, "attention", dict(qkv=qkv, dout=dout), [B, T, C, nh, p, seed, step, offset,
                                                        int(train)],
            dict(out=np.float32, lse=np.float32, dqkv=np.float32,
                 **({"mask": np.float32} if train and p > 0 else {})))
    mask = torch.from_numpy(r["mask"]).view(B, nh, T, T) if train and p > 0 else None
    out, lse = torch_attention(qkv, B, T, C, nh, mask)
    out.backward(dout)
    case = f"attention B={B} T={T} C={C} nh={nh} p={p} train={train}"
    ref = {}
    if verbose:
        q64 = qkv.detach().double().requires_grad_(True)
        o64, l64 = torch_attention(q64, B, T, C, nh, None if mask is None else mask.double())
        o64.backward(dout.double())
        ref = dict(out=o64, lse=l64, dqkv=q64.grad)
    if mask is not None:
        kept = float((mask > 0).float().mean())
        tri = (T + 1) / (2 * T)  # the kept fraction counts masked-out (future) entries too
        print(f"  {case}: kept fraction {kept:.4f} (expected {1 - p:.4f})")
        ok = abs(kept - (1 - p)) < 0.02
        record("value", case, "mask rate", 0.0 if ok else 1.0, 0, ok, f"kept {kept}, tri {tri}")
    check(case, "out", r["out"], out, TOL_VALUE * 2, ref.get("out"))
    check(case, "lse", r["lse"], lse, TOL_VALUE, ref.get("lse"))
    check(case, "dqkv", r["dqkv"], qkv.grad, TOL_GRAD, ref.get("dqkv"))


def lm_head(d, N, C, V):
    x = torch.randn(N, C, requires_grad=True)
    wte = torch.randn(V, C, requires_grad=True)
    logits = x @ wte.t()
    dl, dwte0 = torch.randn(N, V), torch.randn(V, C)
    logits.backward(dl)
    r = run(d, "lm_head", dict(x=x, wte=wte, dlogits=dl, dwte=dwte0), [N, C, V],
            dict(logits=np.float32, dx=np.float32, dwte=np.float32))
    case = f"lm_head N={N} C={C} V={V}"
    check(case, "logits", r["logits"], logits, TOL_GRAD)
    check(case, "dx", r["dx"], x.grad, TOL_GRAD)
    check(case, "dwte", r["dwte"], dwte0 + wte.grad, TOL_GRAD)


def xent(d, N, V, scale, inplace, n_ignored=0, spread=3.0, shift=0.0, verbose=False):
    logits = (torch.randn(N, V) * spread + shift).requires_grad_(True)
    targets = torch.randint(0, V, (N,), dtype=torch.int32)
    targets[torch.randperm(N)[:n_ignored]] = -1
    # ddpc ignores -1 (nanoGPT's ignore_index); here it is mapped to torch's default -100.
    tmapped = targets.long().masked_fill(targets == -1, -100)
    loss = F.cross_entropy(logits, tmapped)
    (loss * scale).backward()
    rows = F.cross_entropy(logits.detach(), tmapped, reduction="none")
    r = run(d, "xent", dict(logits=logits, targets=targets.numpy()), [N, V, scale, int(inplace)],
            dict(loss=np.float64, dlogits=np.float32, loss_sum=np.float64, count=np.int32,
                 row_loss=np.float32))
    case = f"xent N={N} V={V} scale={scale} inplace={inplace} ignored={n_ignored}"
    if n_ignored == N:  # torch's mean over nothing is NaN, and so is ddpc's
        ok = bool(np.isnan(r["loss"][0]) and torch.isnan(loss))
        record("loss", case, "loss NaN", 0.0 if ok else 1.0, 0, ok, f"{r['loss'][0]}")
    else:
        check_loss(case, "loss", r["loss"], loss)
        check_loss(case, "loss_sum", r["loss_sum"], rows.double().sum())
    ok = int(r["count"][0]) == N - n_ignored
    record("value", case, "count", 0.0 if ok else 1.0, 0, ok, f"{r['count'][0]}")
    check(case, "row_loss", r["row_loss"], rows, TOL_VALUE)
    if verbose:
        l64 = logits.detach().double().requires_grad_(True)
        (F.cross_entropy(l64, tmapped) * scale).backward()
        print(f"  {case}: loss ddpc {r['loss'][0]!r}, torch {float(loss)!r}, float64 "
              f"{float(F.cross_entropy(l64.detach(), tmapped))!r}")
        check(case, "dlogits", r["dlogits"], logits.grad, TOL_GRAD, l64.grad)
    else:
        check(case, "dlogits", r["dlogits"], logits.grad, TOL_GRAD)


def gpt_params(L, C, P, V, bias):
    """nanoGPT-shaped parameters in tiny_gpt.h's flat order: (name, tensor) pairs."""
    std = 0.2  # larger than GPT-2's 0.02, so that every layer matters to the loss
    ps = [("wte", torch.randn(V, C) * std), ("wpe", torch.randn(P, C) * std)]
    for l in range(L):
        for name, shape, kind in (("ln_1.weight", (C,), "ln"), ("ln_1.bias", (C,), "b"),
                                  ("attn.c_attn.weight", (3 * C, C), "w"),
                                  ("attn.c_attn.bias", (3 * C,), "b"),
                                  ("attn.c_proj.weight", (C, C), "w"),
                                  ("attn.c_proj.bias", (C,), "b"),
                                  ("ln_2.weight", (C,), "ln"), ("ln_2.bias", (C,), "b"),
                                  ("mlp.c_fc.weight", (4 * C, C), "w"),
                                  ("mlp.c_fc.bias", (4 * C,), "b"),
                                  ("mlp.c_proj.weight", (C, 4 * C), "w"),
                                  ("mlp.c_proj.bias", (C,), "b")):
            if kind == "b" and not bias:
                continue
            t = 1 + 0.1 * torch.randn(shape) if kind == "ln" else torch.randn(shape) * std
            ps.append((f"h.{l}.{name}", t))
    ps.append(("ln_f.weight", 1 + 0.1 * torch.randn(C)))
    if bias:
        ps.append(("ln_f.bias", 0.1 * torch.randn(C)))
    return [(n, t.requires_grad_(True)) for n, t in ps]


def torch_gpt_loss(p, idx, targets, L, C, nh, bias):
    """nanoGPT's GPT.forward with targets, from the named parameters p."""
    B, T = idx.shape
    x = F.embedding(idx, p["wte"]) + p["wpe"][:T]
    for l in range(L):
        w = {k[len(f"h.{l}."):]: v for k, v in p.items() if k.startswith(f"h.{l}.")}
        ln1 = F.layer_norm(x, (C,), w["ln_1.weight"], w.get("ln_1.bias"), 1e-5)
        qkv = F.linear(ln1, w["attn.c_attn.weight"], w.get("attn.c_attn.bias"))
        y, _ = torch_attention(qkv, B, T, C, nh)
        x = x + F.linear(y, w["attn.c_proj.weight"], w.get("attn.c_proj.bias"))
        ln2 = F.layer_norm(x, (C,), w["ln_2.weight"], w.get("ln_2.bias"), 1e-5)
        h = F.gelu(F.linear(ln2, w["mlp.c_fc.weight"], w.get("mlp.c_fc.bias")),
                   approximate="tanh")
        x = x + F.linear(h, w["mlp.c_proj.weight"], w.get("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p.get("ln_f.bias"), 1e-5)
    logits = F.linear(x, p["wte"])
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def gpt(d, L, C, nh, P, V, bias, B, T):
    """The whole model composed from the layers (tiny_gpt.c) against the same model in torch."""
    named = gpt_params(L, C, P, V, bias)
    idx = torch.randint(0, V, (B, T), dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), dtype=torch.int32)
    targets[0, :2] = -1
    p = dict(named)
    loss = torch_gpt_loss(p, idx.long(), targets.long(), L, C, nh, bias)
    loss.backward()
    flat = torch.cat([t.detach().reshape(-1) for _, t in named])
    r = run(d, "gpt", dict(params=flat, idx=idx.numpy(), targets=targets.numpy()),
            [L, C, nh, P, V, int(bias), B, T], dict(loss=np.float64, grads=np.float32))
    case = f"gpt L={L} C={C} nh={nh} block={P} V={V} bias={bias} B={B} T={T}"
    check_loss(case, "loss", r["loss"], loss)
    off = 0
    for name, t in named:
        n = t.numel()
        check(case, "d" + name, r["grads"][off:off + n], t.grad, TOL_GRAD)
        off += n


with tempfile.TemporaryDirectory(prefix="ddp-gpt-") as d:
    embedding(d, 3, 7, 16, 50, 10)
    embedding_bad_id(d)
    layernorm(d, 37, 64, True)
    layernorm(d, 16, 768, False, shift=5.0)  # nanoGPT's bias=False, a large mean
    layernorm(d, 5, 13, True)                # C not a multiple of 8
    gelu_tanh(d, 4099)
    attention(d, 2, 5, 16, 2)
    attention(d, 2, 67, 24, 3, verbose=True)  # two row blocks, the second of 3 rows
    attention(d, 1, 130, 32, 2)                # three blocks
    attention(d, 2, 64, 128, 4, verbose=True)  # the GPT bench shape's head size 32
    attention(d, 2, 67, 24, 3, p=0.2, seed=5, step=9, offset=12345)
    attention(d, 2, 67, 24, 3, p=0.2, train=False)
    lm_head(d, 13, 16, 37)
    lm_head(d, 64, 128, 65)
    xent(d, 20, 50, 1.0, False, n_ignored=3, verbose=True)
    xent(d, 20, 50, 0.5, True, n_ignored=0)
    xent(d, 6, 50257, 1.0, True, n_ignored=1, spread=5.0, shift=30.0, verbose=True)  # GPT-2 V
    xent(d, 4, 11, 1.0, False, n_ignored=4)  # everything ignored
    gpt(d, 2, 32, 4, 16, 50, True, 3, 16)
    gpt(d, 2, 48, 3, 80, 70, False, 2, 70)   # no biases; T < block_size, two attention blocks

for kind, (err, where) in sorted(worst_all.items()):
    print(f"largest {kind} error {err:.3g} ({where})")
print(f"tolerances: value {TOL_VALUE}, grad {TOL_GRAD}, loss {TOL_LOSS}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
