#!/usr/bin/env bash
# gpu_emu.nccl_*: the NCCL backend (src/group/nccl/nccl.c, unchanged) on the emulated GPU module
# over the emulated NCCL (tests/emu/nccl_emu.cpp), one emulated device per rank:
#   w1, w2, w3, w4  gpucheck (tests/integration/gpucheck.c) over nccl at 1, 2, 3, 4 ranks:
#               every collective against the exact result (AVG at 3 ranks: NCCL's, each input
#               times fl(1/3), within a few ulps of the sum / 3), W ranks × B ≡ 1 × W·B; at 3
#               ranks each collective and the finalize answer ncclInProgress first
#               (DDP_EMU_NCCL_INPROGRESS=1: nccl.c's settle() polls them)
#   join        joincheck --device cuda at 3 ranks (uneven inputs; dividing by the ranks still
#               training runs on the device)
#   kill        a rank killed after a round of collectives: ddprun's summary names it within
#               10 s, no gpucheck left; then with the ranks started by hand (no ddprun to stop
#               the survivor): rank 0's next allreduce fails by itself within 8 s, its message
#               naming the allreduce and the dead rank (the emulation's ncclRemoteError, the
#               watchdog's abort)
#   quiet_kill, quiet_abort  as kill by hand, and rank 1 calling ddp_group_abort then destroying
#               its group, with an NCCL that never reports a dead peer (DDP_EMU_NCCL_QUIET=1, as
#               NVLink/P2P/SHM): rank 0 fails within 8 s through the store's failure notice,
#               as the peer's fault, naming rank 1
#   train_kill  ddptrain on 2 ranks over nccl, started by hand (its GPU group borrowing the host
#               group's store, which rank 0 hosts), rank 1 killed right after the step-2
#               checkpoint: rank 0's next gradient allreduce (the GPU group's) fails with
#               NCCL's ncclRemoteError, and rank 0 stops as its consequence, exit code 86
#               (DDP_EXIT_PEER_FAILED: the peer is the root cause), not 1
#   train_fail  ddptrain on 2 ranks by hand over an NCCL that reports nothing (QUIET), rank 1's
#               forward failing at step 3 (DDP_TEST_FAIL_FORWARD_AT_STEP): it aborts its GPU group
#               with the reason, and rank 0 exits 86 at once, naming rank 1 and why
#   stuck       rank 1's second collective never runs (DDP_EMU_NCCL_STALL=1:2, a hung kernel),
#               DDP_TIMEOUT=2: both ranks fail within 8 s with the watchdog's time-out naming
#               allreduce #2 (their own, or the other's through the store's notice)
#   late        rank 1's init fails (DDP_EMU_NCCL_FAIL=init), DDP_TIMEOUT=2: rank 0's non-blocking
#               init gives up at the deadline, "did not finish within 2 s", and aborts
#   dup         two ranks on one emulated device (rank 1's devices reordered, as a
#               CUDA_VISIBLE_DEVICES mistake would): the communicator is refused, "Duplicate GPU"
# Each leaves no /dev/shm segment behind (the emulation's names carry this test's tag).
# usage: test_gpu_emu_nccl.sh BINDIR EMU_MODULE MODE
. "$(dirname "$0")/../integration/lib.sh"
MODULE=${2:?usage: $0 BINDIR EMU_MODULE MODE}
MODE=${3:?usage: $0 BINDIR EMU_MODULE MODE}
CHECK=$BIN/gpucheck
TAG=t$$
export OPENBLAS_NUM_THREADS=1 DDP_GPU_MODULE=$MODULE DDP_REQUIRE_GPU=1 DDP_BACKEND=nccl \
    DDP_EMU_NCCL_TAG=$TAG
CLEANUP_GLOBS+=("/dev/shm/ddpc-nccl-emu-$TAG-*")
no_segments() {
    local left
    left=$(compgen -G "/dev/shm/ddpc-nccl-emu-$TAG-*" || true)
    [ -z "$left" ] || fail "$1: /dev/shm segments left behind: $left"
}
# by_hand W ARGS…: W ranks of gpucheck started without ddprun (rank 1 with R1_ENV's settings
# added), outputs in $T/h.RANK, exit codes in RCS[RANK]
R1_ENV=()
by_hand() {
    local w=$1 port pids=() r extra
    shift
    port=$(free_port)
    for ((r = 0; r < w; r++)); do
        extra=()
        [ $r = 1 ] && extra=("${R1_ENV[@]}")
        RANK=$r WORLD_SIZE=$w LOCAL_RANK=$r LOCAL_WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port DDP_STORE_TOKEN=$TAG env "${extra[@]}" "$CHECK" "$@" >"$T/h.$r" 2>&1 &
        pids+=($!)
        BG_PIDS+=($!)
    done
    RCS=()
    for ((r = 0; r < w; r++)); do
        RCS[r]=0
        wait "${pids[$r]}" 2>/dev/null || RCS[r]=$?
    done
}
# want_rc RANK CODE WHY: by_hand's rank RANK exited CODE, else fail showing its output
want_rc() {
    [ "${RCS[$1]}" = "$2" ] || { cat "$T/h.$1"; fail "rank $1 exited ${RCS[$1]}, want $2 ($3)"; }
}
# want_line RANK PATTERN WHAT: rank RANK's output has PATTERN, else fail
want_line() {
    grep -q "$2" "$T/h.$1" || { cat "$T/h.$1"; fail "rank $1: no message $3"; }
}

case $MODE in
w1)
    rc=0; DDP_EMU_GPUS=1 "$CHECK" --expect nccl >"$T/out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$T/out"; fail "world 1 over nccl: exit $rc"; }
    grep gpucheck "$T/out"
    ok "world 1 over the emulated NCCL: every collective exact"
    ;;
w2 | w3 | w4)
    w=${MODE#w}
    quick=()
    [ "$w" != 2 ] && quick=(--quick) # 1 Mi + 3 elements: still 4 chunks of the 1 MiB areas
    [ "$w" = 3 ] && export DDP_EMU_NCCL_INPROGRESS=1
    rc=0; DDP_EMU_GPUS=$w "$DDPRUN" --standalone --nproc_per_node "$w" "$CHECK" "${quick[@]}" \
        --expect nccl >"$T/out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$T/out"; fail "world $w over nccl: exit $rc"; }
    grep gpucheck "$T/out"
    ok "world $w over the emulated NCCL, a device each: every collective exact"
    ;;
join)
    # uneven inputs with the buckets on the emulated devices: the step's sum over NCCL, then the
    # division by the ranks still training as cudaops' reduce kernel (ipcreduce.cu) runs it
    rc=0; DDP_EMU_GPUS=3 "$DDPRUN" --standalone --nproc_per_node 3 "$BIN/joincheck" --device cuda \
        >"$T/out" 2>&1 || rc=$?
    [ $rc -eq 0 ] || { cat "$T/out"; fail "joincheck at 3 ranks over nccl: exit $rc"; }
    grep "all checks passed" "$T/out"
    ok "uneven inputs over the emulated NCCL at 3 ranks: every rank's parameters as the serial reference's"
    ;;
kill)
    start=$(date +%s)
    rc=0; DDP_TEST_TAG=kill$$ DDP_EMU_GPUS=2 "$DDPRUN" --standalone --nproc_per_node 2 "$CHECK" --kill 1 \
        >"$T/out" 2>&1 || rc=$?
    took=$(($(date +%s) - start))
    [ $rc -ne 0 ] || { cat "$T/out"; fail "a killed rank: ddprun exited 0"; }
    grep -q "worker failed: rank 1 .*SIGKILL" "$T/out" || { cat "$T/out"; fail "the summary does not name rank 1"; }
    [ $took -lt 10 ] || fail "a killed rank took ${took} s to end the job (limit 10 s)"
    left=$(tagged_pids kill$$)
    [ -z "$left" ] || fail "gpucheck processes outlived the job:" $left
    ok "a killed rank ends the job in ${took} s with ddprun's summary"
    start=$(date +%s)
    # (NCCL's own report: the store's notice, which would race it, is off here; quiet_kill)
    DDP_TEST_NO_NOTICE=1 DDP_EMU_GPUS=2 by_hand 2 --kill 1
    took=$(($(date +%s) - start))
    want_rc 1 137 SIGKILL
    want_rc 0 3 "its allreduce failed"
    want_line 0 "rank 0: as expected: rank 0: nccl: allreduce #[0-9]* (float32 × 1) failed: NCCL reports remote process exited.*rank 1 (process [0-9]*) died" \
        "naming the allreduce and the dead rank"
    [ $took -lt 8 ] || fail "rank 0 took ${took} s to fail (limit 8 s)"
    grep "as expected" "$T/h.0"
    ok "rank 1 killed, no ddprun: rank 0's allreduce fails by itself in ${took} s, naming it"
    ;;
quiet_kill | quiet_abort)
    # NCCL within a node (NVLink, P2P, shared memory) never reports a dead or aborted peer
    # (DDP_EMU_NCCL_QUIET=1): the store's failure notice (src/group/notice.c) must end rank 0's
    # allreduce within 8 s, as the peer's fault, naming rank 1
    export DDP_EMU_NCCL_QUIET=1
    start=$(date +%s)
    if [ $MODE = quiet_kill ]; then
        DDP_EMU_GPUS=2 by_hand 2 --kill 1
        want_rc 1 137 SIGKILL
        want_line 0 "rank 0: as expected: rank 1 (process [0-9]* on .*) left without destroying its group" \
            "naming the dead rank (its store connection's death mark)"
    else
        DDP_EMU_GPUS=2 by_hand 2 --abort 1
        want_rc 1 4 "it aborted and destroyed its group"
        want_line 0 "rank 0: as expected: rank 1 aborted the group: " "naming the rank that aborted"
    fi
    took=$(($(date +%s) - start))
    want_rc 0 3 "its allreduce failed"
    [ $took -lt 8 ] || fail "rank 0 took ${took} s to fail (limit 8 s)"
    grep "as expected" "$T/h.0"
    no_segments "$MODE"
    ok "$MODE: rank 0's allreduce fails through the store's notice in ${took} s, naming rank 1"
    ;;
train_kill)
    cd "$T"
    tiny_gpt
    unset DDP_BACKEND # the host group's: ddptrain's own choice (--gpu_backend is the GPU's)
    CHECK=$BIN/ddptrain R1_ENV=(DDP_TEST_KILL_AFTER_CHECKPOINT=2)
    DDP_EMU_GPUS=2 by_hand 2 "${TINY_GPT[@]}" --device cuda --gpu_backend nccl --total_steps 6 \
        --checkpoint.every 2 --out_dir run
    want_rc 1 137 "SIGKILL after its checkpoint"
    want_rc 0 86 "a peer's failure (DDP_EXIT_PEER_FAILED)"
    want_line 0 "this rank stops with it: exit code 86" "saying it stops with the dead peer"
    grep "ddptrain: rank 0" "$T/h.0"
    ok "ddptrain over nccl, rank 1 killed: rank 0 exits 86, the peer's failure, not its own"
    ;;
train_fail)
    # rank 1 fails on its own in step 3's forward (as out of GPU memory would) while rank 0
    # waits in the gradient allreduce of an NCCL that reports nothing (DDP_EMU_NCCL_QUIET=1):
    # ddptrain aborts its GPU group with the reason, and rank 0 learns it through the store's
    # notice at once, exiting 86 (the peer's failure) — not at DDP_TIMEOUT (120 s here)
    cd "$T"
    tiny_gpt
    unset DDP_BACKEND
    export DDP_EMU_NCCL_QUIET=1 DDP_TIMEOUT=120
    CHECK=$BIN/ddptrain R1_ENV=(DDP_TEST_FAIL_FORWARD_AT_STEP=3)
    start=$(date +%s)
    DDP_EMU_GPUS=2 by_hand 2 "${TINY_GPT[@]}" --device cuda --gpu_backend nccl --total_steps 6 \
        --out_dir run
    took=$(($(date +%s) - start))
    want_rc 1 1 "its own failure"
    want_line 1 "ddptrain: rank 1: forward: the test's failure" "saying what failed"
    want_rc 0 86 "a peer's failure (DDP_EXIT_PEER_FAILED)"
    want_line 0 "rank 1 aborted the group: forward: the test's failure" "naming rank 1 and why"
    [ $took -lt 60 ] || fail "the job took ${took} s to end (rank 0 waited for its 120 s deadline?)"
    grep "ddptrain: rank 0" "$T/h.0"
    ok "ddptrain over a silent nccl, rank 1 failing on its own: rank 0 exits 86 in ${took} s, told why"
    ;;
stuck)
    start=$(date +%s)
    DDP_EMU_GPUS=2 DDP_TIMEOUT=2 DDP_EMU_NCCL_STALL=1:2 by_hand 2 --quick
    took=$(($(date +%s) - start))
    # each rank's own failure of allreduce #2 or the other's through the store's notice,
    # whichever came first (rank 0 may also see rank 1's abort as the emulation's
    # ncclRemoteError); the first of all is a watchdog's time-out
    for r in 0 1; do
        want_rc $r 1 "a failed check"
        want_line $r "rank $r: FAILED: allreduce: .*rank [01]: nccl: allreduce #2 (float32 × 1) " \
            "naming allreduce #2"
    done
    grep -q "allreduce #2 (float32 × 1) timed out after 2 s on the GPU: the communicator was aborted" \
        "$T/h.0" "$T/h.1" || { cat "$T/h.0" "$T/h.1"; fail "no rank names the watchdog's time-out"; }
    [ $took -lt 8 ] || fail "the stuck collective took ${took} s to fail (limit 8 s)"
    grep -h FAILED "$T/h.0" "$T/h.1"
    ok "a stuck collective: the watchdog aborts it and names it, in ${took} s"
    ;;
late)
    start=$(date +%s)
    R1_ENV=(DDP_EMU_NCCL_FAIL=init)
    DDP_EMU_GPUS=2 DDP_TIMEOUT=2 by_hand 2 --quick
    took=$(($(date +%s) - start))
    want_rc 0 1 "init failed"
    want_rc 1 1 "init failed"
    want_line 0 "rank 0 (GPU 0): creating the communicator of 2 ranks did not finish within 2 s; HINT" \
        "saying init did not finish within 2 s"
    want_line 1 "rank 1 (GPU 1): creating the communicator of 2 ranks failed: unhandled system error.*DDP_EMU_NCCL_FAIL=init" \
        "naming its failed init"
    [ $took -lt 8 ] || fail "rank 0 took ${took} s to give up (limit 8 s)"
    cat "$T/h.0" "$T/h.1"
    ok "a rank missing from init: the other gives up at the deadline, in ${took} s"
    ;;
dup)
    rc=0
    # $RANK and $0 are the rank's shell's to expand
    # shellcheck disable=SC2016
    DDP_EMU_GPUS=2 "$DDPRUN" --standalone --nproc_per_node 2 bash -c \
        '[ "$RANK" = 1 ] && export DDP_EMU_VISIBLE_DEVICES=1,0; exec "$0" "$@"' "$CHECK" \
        >"$T/out" 2>&1 || rc=$?
    [ $rc -ne 0 ] || { cat "$T/out"; fail "two ranks on one device: ddprun exited 0"; }
    grep -q "creating the communicator of 2 ranks failed: invalid usage.*Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 10" "$T/out" ||
        { cat "$T/out"; fail "no message naming the duplicate GPU"; }
    grep -q "Duplicate GPU detected.*HINT: each rank needs a GPU of its own" "$T/out" ||
        { cat "$T/out"; fail "the hint does not say each rank needs a GPU of its own"; }
    grep -m1 -o "Duplicate GPU detected[^;]*" "$T/out"
    ok "two ranks on one emulated device: NCCL's init refuses them"
    ;;
*) fail "unknown mode $MODE" ;;
esac
no_segments "$MODE"
