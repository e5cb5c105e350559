#!/usr/bin/env bash
# The GPU backends on a GPU: world 1 over NCCL (when built with it), worlds 2 and 4 on one GPU
# through cuda-staged, every collective against the exact result and W ranks × B ≡ 1 × W·B
# (gpucheck.c), and a killed rank ending the job with ddprun's summary within 10 s and no worker
# left behind. Skipped (77) without a usable GPU, unless DDP_REQUIRE_GPU=1, which makes that a
# failure. With FAKE=fake, the same on the library's test-only fake GPU (DDP_TEST_FAKE_GPUS=1:
# host memory plays device memory, cuda-staged throughout), which runs anywhere.
# Usage: test_gpu.sh BINDIR NCCL_BUILT(ON|OFF) [fake]
. "$(dirname "$0")/lib.sh"
NCCL=${2:-OFF}
if [ "${3:-}" = fake ]; then
    export DDP_TEST_FAKE_GPUS=1
    NCCL=OFF
fi
CHECK=$BIN/gpucheck

set +e
"$CHECK" --probe
rc=$?
set -e
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "gpucheck --probe exited $rc"

want1=cuda-staged
[ "$NCCL" = ON ] && want1=nccl
"$CHECK" --expect $want1 >"$T/w1" 2>&1 || { cat "$T/w1"; fail "world 1 over $want1"; }
cat "$T/w1"
ok "world 1 over $want1"

# On the fake GPU (one per host) auto must choose cuda-staged itself; a real machine may have
# more GPUs than ranks, so there the backend is named.
pick=(--backend cuda-staged)
[ -n "${DDP_TEST_FAKE_GPUS:-}" ] && pick=()
for w in 2 4; do
    "$DDPRUN" --standalone --nproc_per_node $w "$CHECK" "${pick[@]}" \
        --expect cuda-staged >"$T/w$w" 2>&1 || { cat "$T/w$w"; fail "world $w over cuda-staged"; }
    grep "gpucheck" "$T/w$w"
    ok "world $w on one GPU over cuda-staged"
done

# A rank killed mid-job: the others fail with a message and ddprun stops them all, fast.
start=$(date +%s)
set +e
"$DDPRUN" --standalone --nproc_per_node 2 "$CHECK" --backend cuda-staged --kill 1 \
    >"$T/kill" 2>&1
rc=$?
set -e
took=$(($(date +%s) - start))
[ $rc -ne 0 ] || fail "a killed rank: ddprun exited 0"
grep -q "rank 1" "$T/kill" || { cat "$T/kill"; fail "the summary does not name rank 1"; }
# Start-up, one round of small collectives, the kill, the survivors' failure, the teardown: 10 s
# (30 s on the fake GPU, which CI runs on a loaded machine and under sanitizers).
limit=10
[ -n "${DDP_TEST_FAKE_GPUS:-}" ] && limit=30
[ $took -lt $limit ] || fail "a killed rank took ${took} s to end the job (limit $limit s)"
if pgrep -f "$CHECK" >/dev/null; then fail "a gpucheck process outlived the job"; fi
grep -E "rank 0: (as expected|.*failed)" "$T/kill" || true
ok "a killed rank ends the job in ${took} s with ddprun's summary"
