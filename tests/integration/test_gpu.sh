#!/usr/bin/env bash
# The GPU backends on a GPU: world 1 over NCCL (when built with it), worlds 2 and 4 on one GPU
# through cuda-ipc and through cuda-staged, every collective against the exact result and W ranks
# × B ≡ 1 × W·B (gpucheck.c), and a killed rank ending the job with ddprun's summary within 10 s
# and no worker left behind, over each. Skipped (77) without a usable GPU, unless
# DDP_REQUIRE_GPU=1, which makes that a failure. With FAKE=fake, the same on the library's
# test-only fake GPU (DDP_TEST_FAKE_GPUS=1: host memory plays device memory, memfds its IPC),
# which runs anywhere, plus cuda-ipc in many small chunks and a rank dying inside a cuda-ipc
# allreduce (ranks started by hand: the survivors must fail by themselves, within 8 s).
# Usage: test_gpu.sh BINDIR NCCL_BUILT(ON|OFF) [fake]
. "$(dirname "$0")/lib.sh"
NCCL=${2:-OFF}
if [ "${3:-}" = fake ]; then
    export DDP_TEST_FAKE_GPUS=1
    NCCL=OFF
fi
CHECK=$BIN/gpucheck
QUICK=() # sanitizer builds: 1 Mi elements at most (the small-arena run still spans chunks)
[ -n "$SANITIZE" ] && QUICK=(--quick)

set +e
"$CHECK" --probe
rc=$?
set -e
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "gpucheck --probe exited $rc"

# World 1: nccl where built; else auto's cuda-ipc (one host, one rank).
want1=cuda-ipc
[ "$NCCL" = ON ] && want1=nccl
"$CHECK" "${QUICK[@]}" --expect $want1 >"$T/w1" 2>&1 || { cat "$T/w1"; fail "world 1 over $want1"; }
cat "$T/w1"
ok "world 1 over $want1"

# Worlds 2 and 4 on one GPU, over each shared-GPU backend. On the fake GPU (one per host) auto
# must choose cuda-ipc itself; a real machine may have more GPUs than ranks, so there the backend
# is named.
for be in cuda-ipc cuda-staged; do
    pick=(--backend $be)
    [ -n "${DDP_TEST_FAKE_GPUS:-}" ] && [ $be = cuda-ipc ] && pick=()
    for w in 2 4; do
        "$DDPRUN" --standalone --nproc_per_node $w "$CHECK" "${pick[@]}" "${QUICK[@]}" \
            --expect $be >"$T/w$w" 2>&1 || { cat "$T/w$w"; fail "world $w over $be"; }
        grep "gpucheck" "$T/w$w"
        ok "world $w on one GPU over $be"
    done
done
# cuda-ipc with a small staging region: every collective in many chunks, 3 ranks (uneven
# slices). Fake GPU only (the chunk count makes it slow; the GPU runs the default region).
if [ -n "${DDP_TEST_FAKE_GPUS:-}" ]; then
    "$DDPRUN" --standalone --nproc_per_node 3 "$CHECK" "${QUICK[@]}" --backend cuda-ipc \
        --arena 1048576 \
        --expect cuda-ipc >"$T/w3s" 2>&1 || { cat "$T/w3s"; fail "world 3 over cuda-ipc, 256 KiB halves"; }
    grep "gpucheck" "$T/w3s"
    ok "world 3 over cuda-ipc in 256 KiB chunks"
fi

# A rank killed mid-job: the others fail with a message and ddprun stops them all, fast.
for be in cuda-ipc cuda-staged; do
    start=$(date +%s)
    set +e
    DDP_TEST_TAG=kill$$ "$DDPRUN" --standalone --nproc_per_node 2 "$CHECK" --backend $be --kill 1 \
        >"$T/kill" 2>&1
    rc=$?
    set -e
    took=$(($(date +%s) - start))
    [ $rc -ne 0 ] || fail "$be: a killed rank: ddprun exited 0"
    grep -q "rank 1" "$T/kill" || { cat "$T/kill"; fail "$be: the summary does not name rank 1"; }
    # Start-up, one round of small collectives, the kill, the survivors' failure, the teardown:
    # 10 s (30 s on the fake GPU, which CI runs on a loaded machine and under sanitizers).
    limit=10
    [ -n "${DDP_TEST_FAKE_GPUS:-}" ] && limit=30
    [ $took -lt $limit ] || fail "$be: a killed rank took ${took} s to end the job (limit $limit s)"
    left=$(tagged_pids kill$$)
    [ -z "$left" ] || fail "$be: gpucheck processes outlived the job:" $left
    grep -E "rank 0: (as expected|.*failed)" "$T/kill" || true
    ok "$be: a killed rank ends the job in ${took} s with ddprun's summary"
done

# A rank dying INSIDE an allreduce (the fake GPU kills rank 1 in cuda-ipc's reduction, between
# the two barriers of a chunk, or in cuda-staged's copy into the staging buffer, while its peers
# wait in the host collective), and a rank whose device call fails there (the GPU's error: it
# aborts the host backend), 3 ranks started by hand (no ddprun to end the others), the group's
# timeout 60 s: every live rank must fail that allreduce within 8 s with a one-line message
# naming it.
if [ -n "${DDP_TEST_FAKE_GPUS:-}" ]; then
    for be in cuda-ipc cuda-staged; do
        for fault in kill fail; do
            port=$(free_port)
            pids=()
            for r in 0 1 2; do
                GPUCHECK_FAULT=$fault RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 \
                    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$CHECK" --backend $be \
                    --fail-within 8 >"$T/mid.$r" 2>&1 &
                pids+=($!)
                BG_PIDS+=($!)
            done
            for r in 0 1 2; do
                rc=0
                wait "${pids[$r]}" 2>/dev/null || rc=$?
                want=3
                [ $r = 1 ] && [ $fault = kill ] && want=137 # SIGKILL
                [ $rc -eq $want ] ||
                    { cat "$T/mid.$r"; fail "$be: $fault in an allreduce: rank $r exited $rc, want $want"; }
            done
            case $be/$fault in
            */kill) want="rank %s: as expected, after .*allreduce #.*rank 1 .*died" ;;
            cuda-ipc/fail) want="rank %s: as expected, after .*cuda-ipc: allreduce #.* failed on member 1: cuda: reduce: an illegal memory access" ;;
            cuda-staged/fail) want="rank %s: as expected, after .*cuda-staged: allreduce #.* failed on member 1: cuda: copy device → host: an illegal memory access" ;;
            esac
            for r in 0 2; do
                # shellcheck disable=SC2059
                grep -q "$(printf "$want" $r)" "$T/mid.$r" ||
                    { cat "$T/mid.$r"; fail "$be: $fault: rank $r: no message naming the allreduce and rank 1"; }
                grep "rank $r: as expected" "$T/mid.$r"
            done
            ok "$be: a rank that $([ $fault = kill ] && echo dies || echo fails) inside an allreduce fails the others within 8 s, with a message"
        done
    done
fi
