#!/usr/bin/env bash
# One worker and a terminal: what is typed reaches the worker (input(), read, pdb's breakpoint()),
# as under torchrun, while ddprun is the terminal's foreground job; a prompt shows before its
# newline, also when the output goes through ddprun (--log_dir); Ctrl-D is the worker's end of
# input; a ddprun in the background reads nothing (and is not stopped for trying). ddprun runs on
# a pseudo-terminal that a Python driver (the standard pty module) types into.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }

cat >"$T/drive.py" <<'EOP'
import os, pty, select, signal, sys, time

def run(argv, script, background=False, timeout=20):
    """Runs argv on a new pty; script: ("expect", text) / ("send", bytes) steps. Returns
    (exit status, everything read)."""
    pid, fd = pty.fork()
    if pid == 0:
        if background:  # another process group of the session: not the foreground job
            if os.fork() == 0:
                os.setpgid(0, 0)
                os.execv(argv[0], argv)
            _, st = os.wait()
            os._exit(os.waitstatus_to_exitcode(st) & 0xFF)
        os.execv(argv[0], argv)
    seen = b""
    deadline = time.time() + timeout
    def read_some(t):
        nonlocal seen
        r, _, _ = select.select([fd], [], [], t)
        if r:
            try:
                data = os.read(fd, 4096)
            except OSError:
                return False
            if not data:
                return False
            seen += data
        return True
    for kind, arg in script:
        if kind == "send":
            os.write(fd, arg)
            continue
        want = arg.encode()
        while want not in seen:
            if time.time() > deadline or not read_some(0.1):
                if want in seen:
                    break
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                sys.exit("%r never showed; the terminal showed:\n%s"
                         % (arg, seen.decode(errors="replace")))
        # what follows is matched after this point only
        seen_at = seen.index(want) + len(want)
        seen = seen[seen_at:]
    while time.time() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            while read_some(0.05):
                pass
            return os.waitstatus_to_exitcode(st), seen
        read_some(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit("ddprun did not end; the terminal showed:\n" + seen.decode(errors="replace"))

case, ddprun, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
ask = ["/bin/bash", "-c", 'printf "name? "; read x; echo "got:$x"']
if case == "direct":
    rc, rest = run([ddprun, "--standalone"] + ask,
                   [("expect", "name? "), ("send", b"ddpc\n"), ("expect", "got:ddpc")])
elif case == "piped":  # --log_dir: the output goes through ddprun, the prompt must still show
    rc, rest = run([ddprun, "--standalone", "--log_dir", tmp + "/logs", "--run_id", "ask",
                    "--tee", "3"] + ask,
                   [("expect", "name? "), ("send", b"ddpc\n"), ("expect", "got:ddpc")])
elif case == "pdb":
    rc, rest = run([ddprun, "--standalone", sys.executable, "-c",
                    "a = 41 + 1\nbreakpoint()\nprint('after', a)"],
                   [("expect", "(Pdb) "), ("send", b"p a\n"), ("expect", "42"),
                    ("expect", "(Pdb) "), ("send", b"c\n"), ("expect", "after 42")])
elif case == "eof":  # Ctrl-D: the worker's end of input
    rc, rest = run([ddprun, "--standalone", "/bin/cat"],
                   [("send", b"abc\n"), ("expect", "abc"), ("send", b"\x04")])
elif case == "background":  # nothing read, ddprun not stopped: the worker's read times out
    rc, rest = run([ddprun, "--standalone", "/bin/bash", "-c",
                    'echo ready; if read -t 2 x; then echo "got:$x"; else echo "no input"; fi'],
                   [("expect", "ready"), ("send", b"stolen\n"), ("expect", "no input")],
                   background=True)
else:
    sys.exit("unknown case " + case)
if rc != 0:
    sys.exit("%s: ddprun exited %d; after the last step the terminal showed:\n%s"
             % (case, rc, rest.decode(errors="replace")))
print("ok", case)
EOP

for c in direct piped pdb eof background; do
    python3 "$T/drive.py" $c "$DDPRUN" "$T" >"$T/$c.out" 2>&1 || { cat "$T/$c.out"; fail "case $c"; }
done
assert_contains "$T/logs/ask/attempt_0/0/stdout.log" "name? got:ddpc"
ok "one worker reads the terminal through ddprun: read, pdb's breakpoint(), a prompt before its newline (direct and through --log_dir), Ctrl-D as end of input, nothing read in the background"
