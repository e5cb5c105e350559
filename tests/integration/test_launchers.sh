#!/usr/bin/env bash
# Launch styles other than plain ddprun: mpirun without the MPI backend (the world it sets, a
# clear error rather than two silent worlds, a store given by MASTER_ADDR/MASTER_PORT, a
# conflicting RANK), torch.distributed.launch's --use_env and --local_rank, ddprun taking
# MASTER_ADDR/MASTER_PORT from its environment, and ddp_spawn's example. Slurm's variables are
# covered by unit.test_world and a real srun by integration.slurm.
. "$(dirname "$0")/lib.sh"
get() { sed -n "s/^$2=//p" "$1"; }
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

# ---- mpirun ---------------------------------------------------------------------------------
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    MPIRUN=(mpirun --oversubscribe -np 2)
    d=$T/mpi; mkdir -p "$d"
    "${MPIRUN[@]}" "$WORKER" world "$d" >"$d/out" 2>&1 || { cat "$d/out"; fail "mpirun world"; }
    for r in 0 1; do
        f=$d/world.$r
        [ "$(get "$f" launcher)" = mpirun ] || fail "launcher in $f: $(cat "$f")"
        [ "$(get "$f" rank)" = $r ] && [ "$(get "$f" world_size)" = 2 ] &&
            [ "$(get "$f" local_rank)" = $r ] && [ "$(get "$f" local_world_size)" = 2 ] ||
            fail "mpirun's world in $f: $(cat "$f")"
        [ "$(get "$f" master_known)" = 0 ] || fail "a store address out of nowhere in $f"
    done
    ok "mpirun -np 2: each process is rank r of 2 (OMPI_COMM_WORLD_*), launcher mpirun"

    # A backend that needs a store (tcp: shm and mpi can also set up through MPI, where the MPI
    # backend is built), and no store address: every rank says what to do, no training starts,
    # nothing is written.
    rc=0
    DDP_BACKEND=tcp "${MPIRUN[@]}" -x DDP_BACKEND "$TRAIN" --total_steps 2 --out_dir mpitrain \
        >mpi_out 2>mpi_err || rc=$?
    [ $rc -ne 0 ] || fail "mpirun -np 2 ddptrain without a store ran"
    assert_contains mpi_err "rank 0 of 2 started by mpirun, but no rendezvous store address is known"
    assert_contains mpi_err "rank 1 of 2 started by mpirun"
    assert_contains mpi_err "MASTER_ADDR"
    [ ! -e mpitrain/checkpoints ] || fail "ddptrain under mpirun wrote checkpoints"
    ok "mpirun -np 2 ddptrain with no store and no MPI backend: a clear error on each rank, not two 1-rank jobs"

    # With a store address the ranks meet in rank 0's store.
    port=$(free_port)
    "${MPIRUN[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$WORKER" rendezvous \
        >rdzv 2>&1 || { cat rdzv; fail "mpirun with MASTER_ADDR/MASTER_PORT did not meet"; }
    [ "$(grep -c "rendezvous ok: rank . of 2" rdzv)" -eq 2 ] || fail "not both ranks met"
    ok "mpirun -x MASTER_ADDR -x MASTER_PORT: the ranks meet in rank 0's store"

    # A stale RANK exported beside mpirun's variables: an error naming both.
    d=$T/mpiconflict; mkdir -p "$d"
    if RANK=0 "${MPIRUN[@]}" -x RANK "$WORKER" world "$d" >"$d/out" 2>&1; then
        fail "RANK=0 under mpirun -np 2 was accepted"
    fi
    assert_contains "$d/out" "RANK=0 but OMPI_COMM_WORLD_RANK=1"
    ok "RANK=0 beside OMPI_COMM_WORLD_RANK=1: an error naming both"

    # mpirun -np 1: a world of one with a private store (no port 29500 needed).
    mpirun -np 1 "$HELLO" >hello1 2>&1 || { cat hello1; fail "mpirun -np 1 hello_world"; }
    assert_contains hello1 "hello from 1 rank (run"
    ok "mpirun -np 1: a world of one"

    # One ddprun per mpirun task with --nnodes 1 (the default): two separate jobs that never
    # meet. Each ddprun says so (before 2026-11-24 nothing did, and both trained into one
    # out_dir); with --nnodes 2 they are one job, and nothing is said.
    d=$T/mpiddprun; mkdir -p "$d"
    "${MPIRUN[@]}" --bind-to none "$DDPRUN" --standalone --nproc_per_node 1 "$WORKER" env "$d" \
        >"$d/out" 2>"$d/err" || { cat "$d/out" "$d/err"; fail "mpirun -np 2 ddprun --standalone"; }
    [ "$(grep -c "warning: this ddprun is one of 2 tasks started by mpirun (OMPI_COMM_WORLD_SIZE=2) but runs a job of one node (--nnodes 1)" "$d/err")" = 2 ] ||
        { cat "$d/err"; fail "mpirun -np 2 ddprun --nnodes 1: not one warning per task"; }
    port=$(free_port)
    "${MPIRUN[@]}" --bind-to none "$DDPRUN" --nnodes 2 --rdzv_backend c10d \
        --rdzv_endpoint 127.0.0.1:$port --nproc_per_node 1 "$WORKER" env "$d" >"$d/out" \
        2>"$d/err" || { cat "$d/out" "$d/err"; fail "mpirun -np 2 ddprun --nnodes 2"; }
    assert_not_contains "$d/err" "tasks started by"
    [ "$(get "$d/env.1" WORLD_SIZE)" = 2 ] || fail "mpirun -np 2 ddprun --nnodes 2: not one job of 2"
    ok "mpirun -np 2 ddprun: --nnodes 1 warned on each task (two jobs), --nnodes 2 one job"
else
    echo "skip: mpirun is not installed (openmpi-bin)"
fi

# ---- torch.distributed.launch's styles --------------------------------------------------------
d=$T/use_env; mkdir -p "$d"
"$DDPRUN" --standalone --nproc_per_node=2 --use_env "$WORKER" env "$d" a >/dev/null 2>&1 ||
    fail "--use_env"
for r in 0 1; do
    [ "$(get "$d/env.$r" LOCAL_RANK)" = $r ] && [ "$(get "$d/env.$r" ARG0)" = a ] &&
        [ "$(get "$d/env.$r" LOCAL_RANK_ARG)" = "<none>" ] || fail "--use_env changed something"
done
ok "--use_env: accepted, the environment contract unchanged, no argument added"

for style in underscore dash; do
    d=$T/lr_$style; mkdir -p "$d"
    "$DDPRUN" --standalone --nproc_per_node=2 --pass_local_rank $style "$WORKER" env "$d" a b \
        >/dev/null 2>&1 || fail "--pass_local_rank $style"
    sep=_; [ $style = dash ] && sep=-
    for r in 0 1; do
        [ "$(get "$d/env.$r" LOCAL_RANK_ARG)" = "--local${sep}rank=$r" ] ||
            fail "--pass_local_rank $style: rank $r got '$(get "$d/env.$r" LOCAL_RANK_ARG)'"
        [ "$(get "$d/env.$r" ARG0)" = a ] && [ "$(get "$d/env.$r" ARG1)" = b ] ||
            fail "--pass_local_rank $style: the program's own arguments moved"
        [ "$(get "$d/env.$r" LOCAL_RANK)" = $r ] || fail "LOCAL_RANK lost with --pass_local_rank"
    done
done
ok "--pass_local_rank underscore|dash: --local_rank=N / --local-rank=N first, then the arguments"

rc=0; "$DDPRUN" --use_env --pass_local_rank dash "$WORKER" env "$T" >/dev/null 2>err || rc=$?
[ $rc -eq 2 ] || fail "--use_env with --pass_local_rank: exit $rc"
assert_contains err "choose one"
rc=0; "$DDPRUN" --pass_local_rank=sideways "$WORKER" env "$T" >/dev/null 2>err || rc=$?
[ $rc -eq 2 ] && assert_contains err "--pass_local_rank 'sideways'"
ok "--use_env with --pass_local_rank, and an unknown style, are usage errors"

# ddptrain takes --local_rank as torch.distributed.launch passes it, checked against LOCAL_RANK.
"$DDPRUN" --standalone --nproc_per_node=2 --pass_local_rank underscore "$TRAIN" --total_steps 2 \
    --eval_every 0 --out_dir lr_train >lr_out 2>&1 || { cat lr_out; fail "ddptrain --local_rank=N under ddprun"; }
assert_contains lr_out "DDP: 2 processes"
rc=0
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 DDP_RUN_ID=x "$TRAIN" --local_rank 0 \
    >lr_bad 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "ddptrain --local_rank 0 with LOCAL_RANK=1: exit $rc"
assert_contains lr_bad "--local_rank 0 but the launcher (ddprun) says local rank 1"
ok "ddptrain --local_rank: accepted when it agrees with LOCAL_RANK, an error when not"

# ---- ddprun and MASTER_ADDR / MASTER_PORT in its environment ------------------------------------
d=$T/menv; mkdir -p "$d"
port=$(free_port)
MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$DDPRUN" --nproc_per_node=2 "$WORKER" env "$d" \
    >/dev/null 2>&1 || fail "ddprun with MASTER_ADDR/MASTER_PORT in its environment"
[ "$(get "$d/env.1" DDP_STORE_PORT)" = $port ] || fail "MASTER_PORT from the environment ignored"
d=$T/mflag; mkdir -p "$d"
port2=$(free_port)
MASTER_PORT=$port "$DDPRUN" --nproc_per_node=2 --master_port $port2 "$WORKER" env "$d" \
    >/dev/null 2>&1 || fail "ddprun --master_port with MASTER_PORT set"
[ "$(get "$d/env.0" DDP_STORE_PORT)" = $port2 ] || fail "the flag did not win over MASTER_PORT"
d=$T/mstand; mkdir -p "$d"
MASTER_ADDR=10.255.255.1 MASTER_PORT=$port "$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" \
    env "$d" >/dev/null 2>&1 || fail "--standalone with MASTER_ADDR/MASTER_PORT set"
[ "$(get "$d/env.0" MASTER_ADDR)" = 127.0.0.1 ] && [ "$(get "$d/env.0" DDP_STORE_PORT)" != $port ] ||
    fail "--standalone took MASTER_ADDR/MASTER_PORT from the environment"
rc=0; MASTER_PORT=99999 "$DDPRUN" "$WORKER" env "$T" >/dev/null 2>err || rc=$?
[ $rc -eq 2 ] || fail "MASTER_PORT=99999: exit $rc"
assert_contains err "MASTER_PORT='99999' in the environment is not a port number"
ok "ddprun: --master_* flags > MASTER_ADDR/MASTER_PORT in its environment > defaults; --standalone ignores them"

# srun's step (faked): the same warning; outside a step (a batch script) none.
rc=0; SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=4 "$DDPRUN" --standalone "$WORKER" env \
    "$T" >/dev/null 2>err || rc=$?
[ $rc = 0 ] || { cat err; fail "ddprun in a faked srun step exited $rc"; }
assert_contains err "one of 2 tasks started by srun (SLURM_STEP_NUM_TASKS=2)"
SLURM_NTASKS=4 "$DDPRUN" --standalone "$WORKER" env "$T" >/dev/null 2>err || fail "ddprun in a batch script"
assert_not_contains err "tasks started by"
ok "ddprun as one of an srun step's tasks with --nnodes 1: warned; in a batch script: not"

# ---- ddp_spawn ---------------------------------------------------------------------------------
"$BIN/spawn_allreduce" 3 >spawn_ok 2>&1 || { cat spawn_ok; fail "spawn_allreduce 3"; }
assert_contains spawn_ok "3 ranks (shm): every element is 6, as expected"
rc=0; "$BIN/spawn_allreduce" 3 1 >spawn_fail 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "spawn_allreduce with a failing rank: exit $rc"
assert_contains spawn_fail "rank 1 of 3 exited with code 3; the other ranks were stopped"
ok "ddp_spawn: the example meets in 3 ranks; a failing rank stops the rest and is named"
