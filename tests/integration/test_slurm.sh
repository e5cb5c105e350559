#!/usr/bin/env bash
# A real Slurm on this machine: munged, slurmctld and slurmd started by the test (as root, in
# its temporary directory, on free ports, in the foreground so that it holds their pids), then
# `srun -n 2` of the test worker and of ddptrain: the world comes from SLURM_* alone, the store
# from SLURM_STEP_NODELIST and the port derived from the job id. Also checks the host-list parser
# against `scontrol show hostnames`. Skipped (exit 77) without root or Debian's slurmd,
# slurmctld, slurm-client and munge packages.
. "$(dirname "$0")/lib.sh"
get() { sed -n "s/^$2=//p" "$1"; }
for c in munged slurmctld slurmd srun sinfo scontrol; do
    command -v $c >/dev/null || { echo "skip: '$c' is not installed (scripts/install-deps.sh)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "skip: starting slurmd needs root"; exit 77; }
TRAIN=$BIN/ddptrain
S=$T/slurm
mkdir -p "$S/state" "$S/spool"
chmod 700 "$S"
DAEMONS=()
stop_slurm() {
    local p i
    for p in "${DAEMONS[@]}"; do kill "$p" 2>/dev/null || true; done
    for ((i = 0; i < 100; i++)); do
        local any=0
        for p in "${DAEMONS[@]}"; do alive "$p" && any=1; done
        [ $any = 0 ] && break
        sleep 0.05
    done
    for p in "${DAEMONS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for p in "${DAEMONS[@]}"; do wait "$p" 2>/dev/null || true; done
    DAEMONS=()
}
trap 'rc=$?; stop_slurm; (exit $rc); cleanup' EXIT

t0=$(now_ms)
dd if=/dev/urandom of="$S/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$S/munge.key"
munged -F -f -S "$S/munge.sock" --key-file="$S/munge.key" --log-file="$S/munged.log" \
    --pid-file="$S/munged.pid" --seed-file="$S/munge.seed" >"$S/munged.out" 2>&1 &
DAEMONS+=($!)
host=$(hostname -s)
ctld_port=$(free_port)
slurmd_port=$(free_port)
cat >"$S/slurm.conf" <<CONF
ClusterName=ddptest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$S/munge.sock
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
PlugStackConfig=$S/plugstack.conf
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=ddp Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
: >"$S/plugstack.conf"
export SLURM_CONF=$S/slurm.conf
for ((i = 0; i < 100; i++)); do [ -S "$S/munge.sock" ] && break; sleep 0.05; done
slurmctld -D -c -f "$SLURM_CONF" >"$S/ctld.out" 2>&1 &
DAEMONS+=($!)
slurmd -D -f "$SLURM_CONF" >"$S/slurmd.out" 2>&1 &
DAEMONS+=($!)
up=0
for ((i = 0; i < 600; i++)); do
    sinfo -h -o %T 2>/dev/null | grep -q idle && { up=1; break; }
    sleep 0.1
done
[ $up = 1 ] || { tail -5 "$S"/*.log "$S"/*.out >&2; fail "Slurm did not come up within 60 s"; }
ok "munged + slurmctld + slurmd up in $(($(now_ms) - t0)) ms (node $host idle)"

# The world from SLURM_* alone, and the store's address derived from the step.
d=$T/world; mkdir -p "$d"
timeout 120 srun -n 2 "$WORKER" world "$d" >"$d/out" 2>&1 || { cat "$d/out"; fail "srun -n 2 world"; }
for r in 0 1; do
    f=$d/world.$r
    [ "$(get "$f" launcher)" = srun ] && [ "$(get "$f" rank)" = $r ] &&
        [ "$(get "$f" world_size)" = 2 ] && [ "$(get "$f" local_rank)" = $r ] &&
        [ "$(get "$f" local_world_size)" = 2 ] && [ "$(get "$f" node_rank)" = 0 ] ||
        fail "srun's world in $f: $(cat "$f")"
    [ "$(get "$f" master_addr)" = "$host" ] && [ "$(get "$f" master_known)" = 1 ] ||
        fail "store address in $f: $(cat "$f")"
    port=$(get "$f" master_port)
    [ "$port" -ge 20000 ] && [ "$port" -le 28999 ] || fail "derived port $port out of range"
done
[ "$(get "$d/world.0" master_port)" = "$(get "$d/world.1" master_port)" ] || fail "ranks disagree on the port"
ok "srun -n 2: rank r of 2 from SLURM_*, store at $host:$(get "$d/world.0" master_port) (from the node list and job id)"

timeout 120 srun -n 2 "$WORKER" rendezvous >rdzv 2>&1 || { cat rdzv; fail "srun -n 2 rendezvous"; }
[ "$(grep -c "rendezvous ok: rank . of 2" rdzv)" -eq 2 ] || fail "not both ranks met"
ok "srun -n 2: the ranks meet in rank 0's store without MASTER_ADDR/MASTER_PORT"

# ddptrain under srun: one world of 2 (not two 1-rank jobs), checkpoints written once.
(cd "$T" && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout 300 srun -n 2 "$TRAIN" \
    --total_steps 20 --eval_every 0 --out_dir srun_run >train_out 2>&1) ||
    { cat "$T/train_out"; fail "srun -n 2 ddptrain"; }
assert_contains "$T/train_out" "DDP: 2 processes (shm: every rank on one host, started by srun)"
[ -f "$T/srun_run/checkpoints/step20.safetensors" ] || fail "no checkpoint after srun -n 2 ddptrain"
ok "srun -n 2 ddptrain: one world of 2 ranks over shm, checkpoint written"

# The host-list parser agrees with Slurm's own.
"$BIN/test_world" >tw 2>&1 || { cat tw; fail "test_world with scontrol"; }
grep -q "OK \] hostlist_matches_scontrol" tw || { cat tw; fail "the scontrol comparison did not run"; }
ok "host lists: the parser agrees with 'scontrol show hostnames'"
