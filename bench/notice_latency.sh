#!/usr/bin/env bash
# How fast a rank of an nccl group learns that a peer is gone, started by hand (no ddprun to stop
# the job): the time from rank 1's abort or SIGKILL to the end of rank 0's waiting allreduce
# (gpucheck --abort 1 / --kill 1 print both wall clocks; one host, one clock), median of REPS
# runs, for
#   notice, abort     rank 1 calls ddp_group_abort: the store's failure notice (src/group/notice.c)
#   notice, kill      rank 1 is SIGKILLed: its store connection's death mark
#   nccl, kill        NCCL's own report (ncclRemoteError), the notices off (DDP_TEST_NO_NOTICE=1):
#                     what NCCL gives where its transport notices a death (sockets, IB)
#   neither, abort    an NCCL that reports nothing (NVLink/P2P/SHM within a node) and no notices:
#                     the group's deadline (DDP_TIMEOUT, 5 s here; 30 min by default)
# over the emulated NCCL on the CPU (tests/emu: DDP_EMU_NCCL_QUIET=1 for the silent transport):
# nccl.c, the watchdog, the notices and the store are the real code, over loopback; the
# emulation's own report is a liveness check every 10 ms, a real NCCL's differs.
#
#   bench/notice_latency.sh [BUILD] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BUILD=${1:-build}
REPS=${2:-10}
MOD=$BUILD/gpu_emu/libddp_gpu_emu.so
[ -e "$MOD" ] || { echo "no emulated module at $MOD: build the tests first" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"; rm -f /dev/shm/ddpc-nccl-emu-bench$$-*' EXIT
export OPENBLAS_NUM_THREADS=1 DDP_GPU_MODULE=$MOD DDP_REQUIRE_GPU=1 DDP_BACKEND=nccl \
    DDP_EMU_GPUS=2 DDP_EMU_NCCL_TAG=bench$$

# one_run MODE ENV…: the latency in ms of one pair of ranks (empty if the run went wrong); rank
# 0's message is kept in $OUT/last
one_run() {
    local mode=$1 port pids=() r
    shift
    port=$(free_port)
    for r in 0 1; do
        env "$@" RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port DDP_STORE_TOKEN=bench "$BUILD/bin/gpucheck" "--$mode" 1 \
            >"$OUT/h.$r" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}" 2>/dev/null || true
    local t1 t0
    t1=$(sed -n 's/^rank 1: \(aborting\|dying\) at \([0-9.]*\)$/\2/p' "$OUT/h.1")
    t0=$(sed -n 's/^rank 0: failed at \([0-9.]*\)$/\1/p' "$OUT/h.0")
    sed -n 's/^rank 0: \(as expected: \|FAILED: \)//p' "$OUT/h.0" | head -1 >"$OUT/last"
    [ -n "$t1" ] && [ -n "$t0" ] && awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f\n", (a - b) * 1000 }'
}

# row NAME MODE REPS ENV…: the median over REPS runs
row() {
    local name=$1 mode=$2 reps=$3 ms=() v i
    shift 3
    for ((i = 0; i < reps; i++)); do
        v=$(one_run "$mode" "$@")
        [ -n "$v" ] && ms+=("$v")
    done
    if [ ${#ms[@]} -eq 0 ]; then
        printf '| %s | — | 0 of %d runs timed | |\n' "$name" "$reps"
    else
        printf '| %s | %s | %d of %d runs; min %s, max %s | %.90s |\n' "$name" \
            "$(echo "${ms[*]}" | med)" ${#ms[@]} "$reps" \
            "$(printf '%s\n' "${ms[@]}" | sort -n | head -1)" \
            "$(printf '%s\n' "${ms[@]}" | sort -n | tail -1)" "$(cat "$OUT/last")"
    fi
}

echo "| how rank 0 learns | median ms | runs | rank 0's message (the last run's, cut) |"
echo "|---|---:|---|---|"
row "notice, abort (silent NCCL)" abort "$REPS" DDP_EMU_NCCL_QUIET=1
row "notice, kill (silent NCCL)" kill "$REPS" DDP_EMU_NCCL_QUIET=1
row "NCCL's ncclRemoteError, kill (notices off)" kill "$REPS" DDP_TEST_NO_NOTICE=1
row "the deadline, abort (silent NCCL, notices off, DDP_TIMEOUT=5)" abort 2 DDP_EMU_NCCL_QUIET=1 \
    DDP_TEST_NO_NOTICE=1 DDP_TIMEOUT=5
