#!/usr/bin/env bash
# ddptrain's MLP on 2 ranks started by mpirun, which sets no thread count, side by side in one
# run: before ddp_world_default_threads each rank's OpenBLAS started a thread per core of the host
# (shown here by setting OMP_NUM_THREADS and OPENBLAS_NUM_THREADS to the host's cores), now each
# rank takes its share (the variables unset); ddprun, which sets them itself, for reference.
# Median wall time of REPS runs each, interleaved; ratios against the old behaviour.
#   bench/mpirun_threads.sh [BUILD_DIR] [REPS] [STEPS]
set -euo pipefail
BUILD=${1:-build}
REPS=${2:-5}
STEPS=${3:-1500}
BIN=$(cd "$BUILD/bin" && pwd)
OUT=$(mktemp -d /tmp/ddp-mpirun-threads.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
command -v mpirun >/dev/null || { echo "no mpirun (openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
CORES=$(nproc --all)
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo
    --mca oob_tcp_if_include lo -np 2)
ARGS=(--total_steps "$STEPS" --eval_every 0 --overwrite true)

run() { # run NAME CMD...: appends the wall time in seconds to $OUT/NAME
    local name=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@" --out_dir "$OUT/run-$name" >"$OUT/$name.log" 2>&1 || { cat "$OUT/$name.log"; exit 1; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >>"$OUT/$name"
}
median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

for _ in $(seq "$REPS"); do
    run old env OMP_NUM_THREADS="$CORES" OPENBLAS_NUM_THREADS="$CORES" "${MPI[@]}" \
        -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$BIN/ddptrain" "${ARGS[@]}"
    run new "${MPI[@]}" "$BIN/ddptrain" "${ARGS[@]}"
    run ddprun "$BIN/ddprun" --standalone --nproc_per_node 2 "$BIN/ddptrain" "${ARGS[@]}"
done
grep -h "thread" "$OUT/new.log" | head -1
old=$(median "$OUT/old")
printf "%-44s %8s %8s\n" "2 ranks, MLP $STEPS steps ($CORES cores)" "median s" "vs old"
for n in old new ddprun; do
    m=$(median "$OUT/$n")
    printf "%-44s %8.2f %8.2f\n" "$n" "$m" "$(awk -v a="$old" -v b="$m" 'BEGIN {print a / b}')"
done
