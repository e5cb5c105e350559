#!/usr/bin/env bash
# ddpc programs started by PyTorch's own torchrun (Debian's python3-torch 1.13), in its default
# static rendezvous: torchrun's agent serves PyTorch's TCPStore on MASTER_PORT itself
# (TORCHELASTIC_USE_AGENT_STORE=True), so rank 0 hosts ddpc's store on the next port. Before
# 2026-11-24 rank 0 found MASTER_PORT taken and every ddpc program failed under plain torchrun.
# Also torchrun's c10d rendezvous (MASTER_PORT free for the workers). Skipped (77) without
# torchrun or torch, and in the sanitizer builds (torchrun's python is not instrumented).
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
[ -z "$SANITIZE" ] || { echo "skip: sanitizer build"; exit 77; }
command -v torchrun >/dev/null || { echo "skip: no torchrun"; exit 77; }
/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || { echo "skip: no torch"; exit 77; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"
# --redirects 1 --tee 1: Debian's torchrun 1.13 on Python 3.11 fails at start without them.
# --monitor_interval 0.5: how often torchrun's agent looks at its workers (1.13's default, 5 s,
# kept each run waiting up to 5 s after its workers had exited).
TR=(torchrun --redirects 1 --tee 1 --monitor_interval 0.5 --nproc_per_node 2 --no_python)
# A free port whose next port is free too (torchrun's store on it, ddpc's on the next).
free_pair() {
    python3 -c '
import socket
for _ in range(50):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError:
        pass
    finally:
        a.close(); b.close()'
}

port=$(free_pair)
timeout 120 "${TR[@]}" --master_port "$port" "$WORKER" rendezvous >rdzv 2>&1 ||
    { cat rdzv; fail "two ddpc ranks under torchrun (static) did not meet"; }
[ "$(grep -c "rendezvous ok: rank . of 2" rdzv)" -eq 2 ] || { cat rdzv; fail "not both ranks met"; }
assert_contains rdzv "the store on '127.0.0.1:$((port + 1))'"
ok "torchrun --master_port $port: ddpc's store on $((port + 1)) beside torchrun's own, the ranks meet"

port=$(free_pair)
timeout 180 "${TR[@]}" --master_port "$port" "$TRAIN" --total_steps 10 --log_every 5 \
    --eval_every 0 --out_dir run >train.out 2>&1 || { cat train.out; fail "ddptrain under torchrun"; }
assert_contains train.out "DDP: 2 processes (shm: every rank on one host, started by torchrun)"
[ -f run/checkpoints/step10.safetensors ] || fail "no checkpoint after ddptrain under torchrun"
ok "torchrun --nproc_per_node 2 ddptrain: one world of 2, checkpoint written"

# torch.distributed.launch (1.13: torchrun's agent, static rendezvous; --no_python needs --use_env).
port=$(free_pair)
timeout 120 /usr/bin/python3 -m torch.distributed.launch --use_env --redirects 1 --tee 1 \
    --monitor_interval 0.5 --nproc_per_node 2 --master_port "$port" --no_python "$WORKER" rendezvous >launch 2>&1 ||
    { cat launch; fail "two ddpc ranks under torch.distributed.launch did not meet"; }
[ "$(grep -c "rendezvous ok: rank . of 2" launch)" -eq 2 ] || { cat launch; fail "not both met"; }
ok "python -m torch.distributed.launch --use_env: the ranks meet beside its store"

port=$(free_port)
timeout 120 "${TR[@]}" --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" "$WORKER" \
    rendezvous >c10d 2>&1 || { cat c10d; fail "two ddpc ranks under torchrun (c10d) did not meet"; }
[ "$(grep -c "rendezvous ok: rank . of 2" c10d)" -eq 2 ] || { cat c10d; fail "not both ranks met"; }
ok "torchrun --rdzv_backend c10d: the ranks meet on the workers' MASTER_PORT"
