#!/usr/bin/env python3
"""Chaos driver for ddprun + ddptrain: faults at random (seeded) moments, checked after each trial.

    python3 bench/chaos.py --bin build/bin --fault kill9_worker --trials 30 --seed 1 [--backend shm]

Each trial starts `ddprun --standalone --run_id chaos<seed>x<trial> … ddptrain` (a small MLP on
Fashion-MNIST), injects one fault at a random moment, and checks: the job ends within a bound,
ddprun's exit code and summary name the right rank and cause, no process of the job remains (found
by the CHAOS_TAG variable every process of the job inherits), no /dev/shm/ddp-<run_id>-* segment
remains, and every checkpoint on disk loads (ckpt_tool dump); for the checkpoint faults, a resume
with --resume_from latest works. A trial that breaks a promise prints BAD and its reproduction
(seed and trial); `--keep` keeps its folder. Not a CTest test: it runs minutes.
Faults: kill9_worker term_worker stop_cont stop_never (SIGKILL / SIGTERM / SIGSTOP then SIGCONT
or never, of one worker), kill9_ddprun, kill9_ddprun_early (in the first 0.4 s: set-up), sigint2
(SIGINT twice to ddprun), kill_in_save (checkpoint every step, rank 0 killed mostly), full_disk
(out_dir on a tmpfs of 200 KiB to 1.5 MiB; needs root), kill_setup and stop_setup (a worker
killed or stopped in the first 0.3 s, tcp or shm), restarts (--max_restarts 2, a worker killed
in each attempt), and mn_kill9_worker mn_kill9_ddprun mn_sigint2 (two ddprun nodes on this
machine, DDP_HOST_ID h0 / h1, shm+tcp). --gpt trains a tiny GPT instead of the MLP.
ddpbench under faults: bench/chaos_bench.sh. Results of the first runs: the 2026-11-25 commits
that cite bench/chaos.py.
"""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time


def procs_with_tag(tag):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
        except OSError:
            continue
        if f"CHAOS_TAG={tag}".encode() in env.split(b"\0"):
            state = st.rsplit(")", 1)[1].split()[0]
            if state != "Z":
                out.append((int(p), st.split(" (")[1].split(")")[0], state))
    return out


def workers_of(ddprun_pid, tag):
    """{rank: pid} of the job's workers (processes whose parent is ddprun and which have RANK)."""
    res = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            ppid = int(st.rsplit(")", 1)[1].split()[1])
            if ppid != ddprun_pid:
                continue
            with open(f"/proc/{p}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError):
            continue
        if env.get(b"CHAOS_TAG") == tag.encode() and b"RANK" in env:
            res[int(env[b"RANK"])] = int(p)
    return res


def shm_left(tag):
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"ddp-{tag}")]


class Trial:
    def __init__(self, a, fault, i):
        self.a, self.fault, self.i = a, fault, i
        self.rng = random.Random(a.seed * 100003 + i * 7 + sum(map(ord, fault)))
        self.tag = f"chaos{a.seed}x{fault[:4]}{i}"
        self.dir = os.path.join(a.work, self.tag)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.out_dir = os.path.join(self.dir, "out")
        self.bad = []
        self.notes = []

    def start(self, extra_run=(), extra_train=(), steps=None, world=None, backend=None):
        a = self.a
        self.world = world or a.world
        backend = backend or a.backend
        steps = steps or a.steps
        cmd = [os.path.join(a.bin, "ddprun"), "--standalone", "--nproc_per_node", str(self.world),
               "--run_id", self.tag, "--grace_period", str(a.grace), *extra_run,
               os.path.join(a.bin, "ddptrain"), *a.model_args,
               "--total_steps", str(steps), "--log_every", "20", "--eval_every", "0",
               "--tensorboard", "false", "--checkpoint.every", str(a.ckpt_every),
               "--out_dir", self.out_dir, "--backend", backend, *extra_train]
        env = dict(os.environ, CHAOS_TAG=self.tag, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   DDP_TIMEOUT=str(a.ddp_timeout))
        self.cmd = cmd
        self.t0 = time.monotonic()
        self.fo = open(os.path.join(self.dir, "out.log"), "w")
        self.fe = open(os.path.join(self.dir, "err.log"), "w")
        self.p = subprocess.Popen(cmd, stdout=self.fo, stderr=self.fe, env=env,
                                  start_new_session=True, stdin=subprocess.DEVNULL)

    def wait_workers(self, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            w = workers_of(self.p.pid, self.tag)
            if len(w) == self.world:
                return w
            if self.p.poll() is not None:
                return w
            time.sleep(0.005)
        return workers_of(self.p.pid, self.tag)

    def finish(self, bound):
        """Waits up to bound s for ddprun; checks leftovers. Returns ddprun's exit code."""
        try:
            rc = self.p.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.bad.append(f"HANG: ddprun still running {bound:.0f} s after the fault")
            for pid, _, _ in procs_with_tag(self.tag):
                try:
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            rc = self.p.wait()
        self.elapsed = time.monotonic() - self.t0
        self.fo.close()
        self.fe.close()
        check_leftovers(self.tag, self.bad, "ddprun")
        self.rc = rc
        return rc

    def err(self):
        with open(os.path.join(self.dir, "err.log"), errors="replace") as f:
            return f.read()

    def check_ckpts(self, resume=False):
        d = os.path.join(self.out_dir, "checkpoints")
        if not os.path.isdir(d):
            return
        names = sorted(os.listdir(d))
        for n in names:
            if not n.endswith(".safetensors"):
                self.notes.append(f"other file in checkpoints/: {n}")
                continue
            r = subprocess.run([os.path.join(self.a.bin, "ckpt_tool"), "dump", os.path.join(d, n)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                self.bad.append(f"CORRUPT checkpoint {n}: {r.stderr.strip()[:300]}")
        if resume and any(n.endswith(".safetensors") for n in names):
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
            env.pop("CHAOS_TAG", None)
            r = subprocess.run([os.path.join(self.a.bin, "ddptrain"), *self.a.model_args,
                                "--total_steps", str(self.a.steps + 3),
                                "--log_every", "0", "--eval_every", "0", "--tensorboard", "false",
                                "--out_dir", self.out_dir, "--resume_from", "latest"],
                               env=env, capture_output=True, text=True, timeout=120)
            if r.returncode != 0 or "resumed from" not in r.stdout + r.stderr:
                self.bad.append(f"RESUME latest failed rc={r.returncode}: {(r.stdout + r.stderr)[-400:]}")

    def expect(self, cond, what):
        if not cond:
            self.bad.append(what)



def check_leftovers(tag, bad, who):
    """Processes and /dev/shm segments of the job still there 3 s after `who` ended: each is a
    defect, recorded in bad, then killed or removed."""
    left = []
    end = time.monotonic() + 3
    while time.monotonic() < end:
        left = procs_with_tag(tag)
        if not left:
            break
        time.sleep(0.05)
    if left:
        bad.append(f"LEFTOVER processes 3 s after {who} ended: {left}")
        for pid, _, _ in left:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    segs = shm_left(tag)
    if segs:
        bad.append(f"LEFTOVER /dev/shm segments: {segs}")
        for s in segs:
            try:
                os.unlink("/dev/shm/" + s)
            except OSError:
                pass

def summary_rank(err):
    """The rank and line of the last 'worker failed' summary (with restarts: the last attempt's)."""
    found = (None, None)
    for line in err.splitlines():
        if "worker failed: rank " in line:
            found = int(line.split("worker failed: rank ")[1].split()[0]), line
    return found


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def run_two_nodes(a, t, fault):
    """Two ddprun 'nodes' on this machine (DDP_HOST_ID differs), 2 workers each, shm+tcp."""
    rng, g = t.rng, a.grace
    port = free_port()
    ps, files = [], []
    t.world = 2
    t.t0 = time.monotonic()
    for r in (1, 0):
        cmd = [os.path.join(a.bin, "ddprun"), "--nnodes", "2", "--node_rank", str(r),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "--nproc_per_node", "2",
               "--run_id", t.tag, "--grace_period", str(g), "--agent_timeout", "5",
               "--rdzv_timeout", "20",
               os.path.join(a.bin, "ddptrain"), *a.model_args,
               "--total_steps", str(a.steps), "--log_every", "20", "--eval_every", "0",
               "--tensorboard", "false", "--checkpoint.every", str(a.ckpt_every),
               "--out_dir", t.out_dir, "--backend", "shm+tcp"]
        env = dict(os.environ, CHAOS_TAG=t.tag, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   DDP_TIMEOUT=str(a.ddp_timeout), DDP_HOST_ID=f"h{r}")
        fo = open(os.path.join(t.dir, f"out{r}.log"), "w")
        fe = open(os.path.join(t.dir, f"err{r}.log"), "w")
        files += [fo, fe]
        ps.insert(0, subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, start_new_session=True,
                                      stdin=subprocess.DEVNULL))
    ws = [{}, {}]
    end = time.monotonic() + 15
    while time.monotonic() < end and (len(ws[0]) < 2 or len(ws[1]) < 2):
        ws = [workers_of(p.pid, t.tag) for p in ps]
        time.sleep(0.005)
    delay = rng.uniform(0.0, a.window)
    time.sleep(delay)
    alive = all(p.poll() is None for p in ps)
    node = rng.randrange(2)
    rank = rng.choice(sorted(ws[node])) if ws[node] else None
    if fault == "mn_kill9_worker" and rank is not None:
        try:
            os.kill(ws[node][rank], signal.SIGKILL)
        except OSError:
            alive = False
        bound = g + 10
    elif fault == "mn_kill9_ddprun":
        ps[node].kill()
        bound = 5 + g + 10
    elif fault == "mn_sigint2":
        for _ in range(2):
            if ps[node].poll() is None:
                ps[node].send_signal(signal.SIGINT)
            time.sleep(rng.uniform(0, 0.05))
        bound = g + 10
    rcs = []
    for p in ps:
        try:
            rcs.append(p.wait(timeout=max(1, bound - (time.monotonic() - t.t0 - delay))))
        except subprocess.TimeoutExpired:
            t.bad.append(f"HANG: ddprun node {ps.index(p)} still running {bound} s after the fault")
            p.kill()
            rcs.append(p.wait())
    t.elapsed = time.monotonic() - t.t0
    for f in files:
        f.close()
    t.p = ps[0]
    t.rc = rcs
    check_leftovers(t.tag, t.bad, "both ddpruns")
    errs = [open(os.path.join(t.dir, f"err{r}.log"), errors="replace").read() for r in (0, 1)]
    t.notes.append(f"delay {delay:.3f} node {node} rank {rank} alive {alive} rcs {rcs}")
    if alive and rcs != [0, 0]:
        if fault == "mn_kill9_worker":
            t.expect(rcs == [1, 1], f"rcs {rcs}, want [1, 1]")
            for r in (0, 1):
                t.expect(f"rank {rank} " in errs[r], f"node {r}'s ddprun does not name rank {rank}")
        elif fault == "mn_kill9_ddprun":
            other = 1 - node
            t.expect(rcs[other] == 1, f"surviving node {other} exited {rcs[other]}, want 1")
        elif fault == "mn_sigint2":
            t.expect(rcs[node] == 130, f"node {node} exited {rcs[node]}, want 130")
            t.expect(rcs[1 - node] == 1, f"node {1 - node} exited {rcs[1 - node]}, want 1")
    t.check_ckpts()


def run_fault(a, fault, i):
    t = Trial(a, fault, i)
    if fault.startswith("mn_"):
        run_two_nodes(a, t, fault)
        fault = "done"
    rng = t.rng
    g = a.grace
    if fault == "done":
        pass
    elif fault in ("kill9_worker", "term_worker", "stop_cont", "stop_never", "kill_in_save"):
        extra = ("--checkpoint.every", "1") if fault == "kill_in_save" else ()
        t.start(extra_train=extra)
        w = t.wait_workers()
        delay = rng.uniform(0.0, a.window)
        time.sleep(delay)
        rank = 0 if fault == "kill_in_save" and rng.random() < 0.7 else rng.randrange(t.world)
        sig = {"kill9_worker": signal.SIGKILL, "term_worker": signal.SIGTERM,
               "stop_cont": signal.SIGSTOP, "stop_never": signal.SIGSTOP,
               "kill_in_save": signal.SIGKILL}[fault]
        alive = t.p.poll() is None
        try:
            os.kill(w[rank], sig)
        except (OSError, KeyError):
            alive = False
        t.notes.append(f"delay {delay:.3f} s rank {rank} alive {alive}")
        if fault == "stop_cont":
            time.sleep(rng.uniform(0, 2.0))
            try:
                os.kill(w[rank], signal.SIGCONT)
            except OSError:
                pass
        bound = {"stop_never": a.ddp_timeout + g + 8, "stop_cont": a.ddp_timeout + 20}.get(fault, g + 8)
        rc = t.finish(bound + a.steps / 100)
        err = t.err()
        sr, line = summary_rank(err)
        if not alive:
            t.notes.append(f"job ended before the fault (rc {rc})")
        elif fault == "stop_cont":
            t.expect(rc == 0, f"rc {rc} after SIGSTOP+SIGCONT, want 0")
        elif fault == "stop_never":
            t.expect(rc == 1, f"rc {rc}, want 1")
            t.expect("SIGCONT" in err, "no report of the stopped worker")
            t.expect(line is not None and (sr == rank or f"rank {rank}" in err.split("worker failed")[1]),
                     f"summary does not point at stopped rank {rank}: {line}")
        elif rc == 0:
            t.notes.append("job finished normally (fault after the last step?)")
        else:
            t.expect(rc == 1, f"rc {rc}, want 1")
            t.expect(sr == rank, f"summary blames rank {sr}, want {rank}: {line}")
            want = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
            t.expect(line is not None and (want in line or f"signal {int(sig)}" in line),
                     f"summary cause is not {want}: {line}")
        t.check_ckpts(resume=(fault == "kill_in_save"))
    elif fault == "kill9_ddprun":
        t.start()
        t.wait_workers()
        delay = rng.uniform(0.0, a.window)
        time.sleep(delay)
        t.notes.append(f"delay {delay:.3f}")
        os.kill(t.p.pid, signal.SIGKILL)
        t.finish(5)
        t.check_ckpts()
    elif fault == "kill9_ddprun_early":
        t.start()
        delay = rng.uniform(0.0, 0.4)
        time.sleep(delay)
        t.notes.append(f"delay {delay:.3f}")
        os.kill(t.p.pid, signal.SIGKILL)
        t.finish(5)
    elif fault == "sigint2":
        t.start()
        t.wait_workers()
        delay = rng.uniform(0.0, a.window)
        time.sleep(delay)
        alive = t.p.poll() is None
        if alive:
            os.kill(t.p.pid, signal.SIGINT)
        time.sleep(rng.uniform(0, 0.05))
        if alive and t.p.poll() is None:
            os.kill(t.p.pid, signal.SIGINT)
        t0 = time.monotonic()
        rc = t.finish(3)
        t.notes.append(f"delay {delay:.3f} ended in {time.monotonic() - t0:.2f} s rc {rc}")
        if alive:
            t.expect(rc in (130, 0), f"rc {rc}, want 130")
        t.check_ckpts(resume=True)
    elif fault == "full_disk":
        mnt = os.path.join(t.dir, "out")
        os.makedirs(mnt)
        size = rng.randrange(200, 1500)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", mnt], check=True)
        try:
            t.start(extra_train=("--checkpoint.every", "5", "--checkpoint.keep", "2"))
            rc = t.finish(30)
            err = t.err()
            sr, line = summary_rank(err)
            t.notes.append(f"size {size}k rc {rc} summary: {line}")
            if rc != 0:
                t.expect(rc == 1, f"rc {rc}, want 1")
                t.expect(sr == 0, f"summary blames rank {sr}, want 0: {line}")
                t.expect("No space left" in err or "no space" in err.lower(), "no ENOSPC message")
            t.check_ckpts()
            tmp = [n for n in os.listdir(mnt) if "tmp" in n] + \
                  [n for n in os.listdir(os.path.join(mnt, "checkpoints"))
                   if not n.endswith(".safetensors")] if os.path.isdir(os.path.join(mnt, "checkpoints")) else []
            if tmp:
                t.notes.append(f"temporary files left: {tmp}")
        finally:
            subprocess.run(["umount", "-l", mnt])
    elif fault in ("kill_setup", "stop_setup"):
        backend = rng.choice(["tcp", "shm"])
        t.start(backend=backend)
        w = t.wait_workers()
        delay = rng.uniform(0.0, 0.3)
        time.sleep(delay)
        rank = rng.randrange(t.world)
        alive = t.p.poll() is None
        sig = signal.SIGKILL if fault == "kill_setup" else signal.SIGSTOP
        try:
            os.kill(w[rank], sig)
        except (OSError, KeyError):
            alive = False
        rc = t.finish(g + 10 + (a.ddp_timeout if sig == signal.SIGSTOP else 0))
        err = t.err()
        sr, line = summary_rank(err)
        t.notes.append(f"{backend} delay {delay:.3f} rank {rank} rc {rc} el {t.elapsed:.1f}")
        if alive and rc != 0 and sig == signal.SIGKILL:
            t.expect(rc == 1, f"rc {rc}, want 1")
            t.expect(sr == rank, f"summary blames rank {sr}, want {rank}: {line}")
        elif alive and sig == signal.SIGSTOP:
            t.expect(rc == 1, f"rc {rc}, want 1")
            t.expect(line is not None and f"rank {rank}" in err.split("worker failed")[1],
                     f"summary does not name stopped rank {rank}: {line}")
        t.check_ckpts()
    elif fault == "restarts":
        t.start(extra_run=("--max_restarts", "2"), extra_train=("--resume_from", "auto"))
        killed = []
        for att in range(3):
            w = t.wait_workers(timeout=15)
            if t.p.poll() is not None or len(w) < t.world:
                break
            time.sleep(rng.uniform(0.05, a.window / 2))
            rank = rng.randrange(t.world)
            try:
                os.kill(w[rank], signal.SIGKILL)
                killed.append(rank)
            except OSError:
                pass
            # wait for the old workers to go
            end = time.monotonic() + g + 8
            while time.monotonic() < end and any(os.path.exists(f"/proc/{p}") and
                                                 open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
                                                 for p in w.values()):
                time.sleep(0.01)
        rc = t.finish(g + 15)
        err = t.err()
        t.notes.append(f"killed {killed} rc {rc}")
        if len(killed) == 3:
            t.expect(rc == 1, f"rc {rc} after 3 failures, want 1")
            sr, line = summary_rank(err)
            t.expect(sr == killed[-1], f"summary blames {sr}, want {killed[-1]}: {line}")
            t.expect("attempt : 3 of 3" in err, "summary does not say attempt 3 of 3")
        t.check_ckpts(resume=True)
    else:
        sys.exit(f"unknown fault {fault}")
    status = "BAD " if t.bad else "ok  "
    print(f"{status}{t.fault} trial {i} seed {a.seed} rc {t.rc} {t.elapsed:.2f}s {'; '.join(t.notes)}",
          flush=True)
    for b in t.bad:
        print(f"     {b}", flush=True)
    if not t.bad and not a.keep:
        shutil.rmtree(t.dir, ignore_errors=True)
    return not t.bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--fault", required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", default="shm")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--ckpt_every", type=int, default=20)
    ap.add_argument("--window", type=float, default=2.5)
    ap.add_argument("--grace", type=float, default=2)
    ap.add_argument("--ddp_timeout", type=int, default=5)
    ap.add_argument("--work", default="/tmp/chaos")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--gpt", action="store_true", help="a tiny GPT on generated text, not the MLP")
    a = ap.parse_args()
    a.model_args = ["--model.hidden", "64", "--batch_size", "32"]
    if a.gpt:
        os.makedirs(a.work, exist_ok=True)
        text = os.path.join(a.work, "text.txt")
        rw = random.Random(3)
        words = "the a cat dog sat ran on under mat log".split()
        with open(text, "w") as f:
            for _ in range(300):
                f.write(" ".join(rw.choice(words) for _ in range(12)) + "\n%\n")
        a.model_args = ["--model.type", "gpt", "--data.text", text, "--data.doc_sep", "%",
                        "--model.n_layer", "2", "--model.n_head", "2", "--model.n_embd", "64",
                        "--model.block_size", "32", "--batch_size", "4", "--optimizer", "adamw",
                        "--lr", "3e-3", "--schedule", "constant", "--max_new_tokens", "0"]
    a.bin = os.path.abspath(a.bin)
    os.makedirs(a.work, exist_ok=True)
    bad = 0
    for i in range(a.first, a.first + a.trials):
        if not run_fault(a, a.fault, i):
            bad += 1
    print(f"{a.fault}: {a.trials} trials, {bad} bad (seed {a.seed}, backend {a.backend}, world {a.world})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
