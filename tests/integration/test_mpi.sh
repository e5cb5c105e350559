#!/usr/bin/env bash
# The MPI backend on one host, jobs started by mpirun (set-up through MPI, no store):
#   collectives NP BACKEND [collcheck args]   collcheck on NP ranks (BACKEND: mpi, or auto,
#             which is shm set up through MPI): every collective, dtype and op against the reference
#   train     mpirun -np 2 ddptrain (auto: shm set up through MPI) and --backend mpi end with
#             the same weights, bit for bit, as ddprun --nproc_per_node 2 with the same config
#   timeout   a rank that never calls the collective: the others fail within the deadline with
#             an error naming the operation, then the job ends (MPI_Abort), nothing left behind
#   ddprun    --backend mpi under ddprun is a clear error saying to use mpirun
# Usage: test_mpi.sh BINDIR MODE
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mpi_lib.sh"
MODE=${2:?usage: $0 BINDIR collectives|train|timeout|ddprun}
TRAIN=$BIN/ddptrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

weights() { # weights RUN_DIR STEP: every tensor's values, without the metadata
    "$BIN/ckpt_tool" dump "$1/checkpoints/step$2.safetensors" | grep -v '^M '
}
final() { # final OUT: the last test accuracy and loss line
    grep -o 'test loss [0-9.]*, test accuracy [0-9.]*' "$1" | tail -1
}

case $MODE in
collectives)
    np=${3:?collectives NP BACKEND}
    backend=${4:?collectives NP BACKEND}
    shift 4
    want=$backend
    [ "$backend" = auto ] && want=shm
    DDP_BACKEND=$backend mpi_run "$np" -x DDP_BACKEND "$BIN/collcheck" "$@" >out 2>&1 ||
        { cat out; fail "collcheck on $np ranks ($backend) failed"; }
    assert_contains out "checks passed on $np ranks (backend $want)"
    ok "$(grep 'checks passed' out)"
    ;;
train)
    # At 2 ranks every gradient element is one addition a + b, which IEEE arithmetic rounds the
    # same whichever rank adds (it commutes), and AVG's division by 2 is exact: so MPI's
    # allreduce, shm's and tcp's must give the same bits, and so must the whole run.
    args=(--total_steps 60 --eval_every 30)
    "$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" "${args[@]}" --out_dir ref >ref.out 2>&1 ||
        { cat ref.out; fail "ddprun training failed"; }
    mpi_run 2 "$TRAIN" "${args[@]}" --out_dir auto >auto.out 2>&1 ||
        { cat auto.out; fail "mpirun training (auto) failed"; }
    mpi_run 2 "$TRAIN" "${args[@]}" --backend mpi --out_dir mpi >mpi.out 2>&1 ||
        { cat mpi.out; fail "mpirun training (--backend mpi) failed"; }
    assert_contains auto.out "DDP: 2 processes (shm: every rank on one host, started by mpirun)"
    assert_contains mpi.out "DDP: 2 processes (mpi: named by the caller or DDP_BACKEND, started by mpirun)"
    [ "$(grep -c 'DDP: ' auto.out)" -eq 1 ] || fail "not one world of 2: $(grep 'DDP: ' auto.out)"
    weights ref 60 >ref.w
    [ -s ref.w ] || fail "no weights in the reference checkpoint"
    for run in auto mpi; do
        weights $run 60 >$run.w
        cmp -s ref.w $run.w || fail "mpirun ($run) weights differ from ddprun's"
        [ "$(final $run.out)" = "$(final ref.out)" ] ||
            fail "mpirun ($run): '$(final $run.out)', ddprun: '$(final ref.out)'"
    done
    ok "mpirun -np 2 ddptrain (shm set up through MPI, and --backend mpi) = ddprun, bit for bit: $(final ref.out)"
    ;;
timeout)
    # The last rank never calls allreduce; the others' deadline is 2 s.
    for backend in mpi auto; do
        d=$T/$backend
        mkdir -p "$d"
        t0=$(now_ms)
        rc=0
        FAULT_DIR=$d DDP_TIMEOUT=2 DDP_BACKEND=$backend timeout 60 \
            mpirun "${MPI_LOCAL[@]}" -x FAULT_DIR -x DDP_TIMEOUT -x DDP_BACKEND -np 3 \
            "$BIN/faultcheck" absent >"$d/out" 2>&1 || rc=$?
        took=$(($(now_ms) - t0))
        [ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$d/out"; fail "$backend: mpirun exited $rc"; }
        [ $took -lt 30000 ] || fail "$backend: the job took $took ms to end"
        # mpi cannot say who is missing; shm names rank 2 (the first rank to time out aborts
        # the group, so the other may report that abort, which quotes the timeout)
        want="allreduce #1 (float32 × 1048576) timed out in mpi after"
        [ $backend = auto ] && want="allreduce #1 (float32 × 1048576) timed out in shm: rank 2 did not arrive"
        # Each waiting rank reports unless the first one's MPI_Abort (after a second's grace)
        # ends it first: at least one must, and every report must be right.
        reported=0
        for r in 0 1; do
            grep -q "^rank $r error:" "$d/out" || continue
            reported=$((reported + 1))
            grep "^rank $r error: allreduce #1 (float32 × 1048576)" "$d/out" | grep -qF "$want" ||
                { cat "$d/out"; fail "$backend: rank $r's error does not say '$want'"; }
            ms=$(sed -n "s/^rank $r failed after \([0-9]*\) ms.*/\1/p" "$d/out")
            [ -n "$ms" ] && [ "$ms" -ge 1900 ] && [ "$ms" -le 7000 ] ||
                { cat "$d/out"; fail "$backend: rank $r reported after '$ms' ms, deadline 2000"; }
        done
        [ $reported -ge 1 ] || { cat "$d/out"; fail "$backend: no rank reported the timeout"; }
        assert_contains "$d/out" "ending the MPI job (MPI_Abort)"
        assert_not_contains "$d/out" "rank 2 error"
        wait_gone "$d" 5
        ok "$backend: a rank that never arrives: $reported of 2 waiting ranks named allreduce #1 after ${ms} ms, the job ended in $took ms"
    done
    ;;
ddprun)
    rc=0
    "$DDPRUN" --standalone --nproc_per_node 2 "$TRAIN" --total_steps 2 --backend mpi \
        >out 2>&1 || rc=$?
    [ $rc -ne 0 ] || fail "--backend mpi under ddprun succeeded"
    assert_contains out "backend 'mpi' needs processes started by an MPI launcher"
    assert_contains out "start the job with 'mpirun -np N'"
    ok "--backend mpi under ddprun: a clear error naming mpirun"
    ;;
*) fail "unknown mode '$MODE'" ;;
esac
