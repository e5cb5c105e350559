#!/usr/bin/env bash
# How the mpi backend waits, two builds side by side (or one build alone), under mpirun on this
# host, in both DDP_MPI_MODEs (blocking: Open MPI's MPI_Allreduce, which waits inside Open MPI;
# nonblocking: MPI_Iallreduce tested by the backend's own loop, src/group/mpi/mpi.c's wait_req):
#   a  2 ranks, a core each (mpirun's default binding): what spinning is for; must not slow down
#   b  NP_OVER ranks on this host's cores (mpirun --oversubscribe: Open MPI binds none of them)
#   c  2 ranks on ONE core (taskset -c 0 mpirun --bind-to none: the job confined to one CPU, as
#      in a cgroup or a container with fewer CPUs than ranks)
#   d  2 ranks, a core each, beside one CPU hog (`yes`)
# For each: ddpbench's median µs per allreduce at 4 KiB and 256 KiB (ITERS calls each; a run cut
# at CAP s counts as CAP s per call, shown as such); and in cases a and c, ddptrain's
# Fashion-MNIST MLP samples/s (--backend mpi, 400 steps, the median of its 50-step windows). Each repetition runs A then B (B then A in the
# next); the figures are medians over the repetitions.
# Usage: bench/mpi_wait.sh BUILD_A [BUILD_B] [REPS] [ITERS]
#   e.g. git archive HEAD | tar -x -C /tmp/old && cmake -S /tmp/old -B /tmp/old/build && \
#        cmake --build /tmp/old/build -j2 --target ddpbench ddptrain && \
#        bench/mpi_wait.sh /tmp/old/build build 5
# Needs mpirun (Open MPI) and a build with DDP_MPI; as root it passes mpirun's root flags.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
A=$1 B=${2:-} REPS=${3:-5} ITERS=${4:-500}
CAP=60 # seconds for one ddpbench run
command -v mpirun >/dev/null || { echo "mpi_wait.sh: no mpirun (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_base_warn_component_unused=0 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# shellcheck disable=SC2054 # the commas are in mpirun's values
LOCAL=(--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) # this process's CPUs
NP_OVER=$((CORES * 2)) # case b
OUT=$(mktemp -d)
HOG=
cleanup() {
    [ -n "$HOG" ] && kill "$HOG" 2>/dev/null
    rm -rf "$OUT"
}
trap cleanup EXIT

place() { # place CASE MODE: P = the mpirun command line (up to the program) that CASE places
    case $1 in
    a | d) P=(mpirun "${LOCAL[@]}" -np 2) ;;
    b) P=(mpirun "${LOCAL[@]}" --oversubscribe -np "$NP_OVER") ;;
    c) P=(taskset -c 0 mpirun "${LOCAL[@]}" --bind-to none -np 2) ;;
    esac
    P+=(-x DDP_MPI_MODE="$2")
}
bench() { # bench BUILD CASE MODE: "bytes us" lines (ddpbench's median per call)
    local P
    place "$2" "$3"
    if timeout "$CAP" "${P[@]}" "$1/bin/ddpbench" --backend mpi --sizes 4K,256K --iters "$ITERS" \
        --csv >"$OUT/bench" 2>/dev/null; then
        awk -F, '$1=="allreduce" {print $2, $4}' "$OUT/bench"
    else # cut (or failed): CAP per call, so that it shows
        echo "4096 $((CAP * 1000000))"
        echo "262144 $((CAP * 1000000))"
    fi
}
train() { # train BUILD CASE MODE: ddptrain MLP samples/s, 400 steps
    local P
    place "$2" "$3"
    timeout $((CAP * 3)) "${P[@]}" "$1/bin/ddptrain" --config configs/fashion-mlp.yaml \
        --backend mpi --total_steps 400 --log_every 50 --eval_every 100000 --checkpoint.every 0 \
        --data.threads 0 --overwrite true --out_dir "$OUT/run" 2>/dev/null |
        sed -n 's/^step \([0-9]*\)\/.* | \([0-9]*\) samples\/s.*/\1 \2/p' |
        awk '$1 > 50 && $1 < 400 {print $2}' | tr '\n' ' ' | med
}

declare -A R
builds=(A)
[ -n "$B" ] && builds=(A B)
for ((i = 0; i < REPS; i++)); do
    order=A
    [ -n "$B" ] && order=$(turn_order $i)
    for w in $order; do
        b=$A
        [ "$w" = B ] && b=$B
        for m in blocking nonblocking; do
            for c in a b c d; do
                [ $c = d ] && hog_on
                while read -r bytes us; do R[$w.$m.$c.$bytes]+=" $us"; done < <(bench "$b" $c $m)
                [ $c = d ] && hog_off
            done
            R[$w.$m.a.mlp]+=" $(train "$b" a $m)"
            R[$w.$m.c.mlp]+=" $(train "$b" c $m)"
        done
    done
done

echo "A = $A${B:+, B = $B}; $REPS repetitions${B:+, turns alternate}; $ITERS calls per size"
echo "machine: $CORES cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d); load now: $(cut -d' ' -f1-3 /proc/loadavg)"
label() {
    case $1 in
    a) echo "a: 2 ranks, a core each" ;;
    b) echo "b: $NP_OVER ranks on $CORES cores" ;;
    c) echo "c: 2 ranks on one core" ;;
    d) echo "d: 2 ranks + a CPU hog" ;;
    esac
}
if [ -n "$B" ]; then
    printf '%-12s %-34s %12s %12s %9s\n' mode measure "A (median)" "B (median)" "A/B"
else
    printf '%-12s %-34s %12s\n' mode measure "median"
fi
row() { # row MODE LABEL KEY UNIT
    local a b
    a=$(med <<<"${R[A.$3]}")
    if [ -z "$B" ]; then
        printf '%-12s %-34s %9.2f %-2s\n' "$1" "$2" "$a" "$4"
        return
    fi
    b=$(med <<<"${R[B.$3]}")
    printf '%-12s %-34s %9.2f %-2s %9.2f %-2s %8.2fx\n' "$1" "$2" "$a" "$4" "$b" "$4" \
        "$(awk -v x="$a" -v y="$b" 'BEGIN {print (y > 0 ? x / y : 0)}')"
}
for m in blocking nonblocking; do
    for c in a b c d; do
        for s in 4096 262144; do row $m "$(label $c): $((s / 1024)) KiB" "$m.$c.$s" µs; done
    done
    row $m "a: ddptrain MLP (samples/s)" "$m.a.mlp" /s
    row $m "c: ddptrain MLP (samples/s)" "$m.c.mlp" /s
done
echo "(A/B: A's figure over B's; for µs > 1 means B is faster, for samples/s < 1 does; a run cut at $CAP s counts $((CAP * 1000000)) µs)"
for w in "${builds[@]}"; do
    echo "($w runs, c 4 KiB: blocking${R[$w.blocking.c.4096]} | nonblocking${R[$w.nonblocking.c.4096]})"
done
