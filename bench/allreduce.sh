#!/usr/bin/env bash
# Allreduce side by side, 2 ranks on this machine, float32 sum, in place: ddpc shm (arena =
# zero-copy buffers, and private buffers), ddpc tcp, ddpc mpi (ddpbench under mpirun with the
# MPI backend: MPI_Iallreduce tested against the deadline, the library's own overhead over the
# next column), Open MPI's MPI_Allreduce (Debian's openmpi)
# and torch.distributed with gloo (Debian's python3-torch), beside the memory-bandwidth limit
# that ddpbench measures in the same run. Each contender reports its median time per call; the
# contenders take turns REPS times and the table shows the median of those medians.
# Usage: bench/allreduce.sh [BUILD_DIR] [REPS] [SIZES]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPS=${2:-3}
SIZES=${3:-4096,1048576,16777216,67108864}
PY=/usr/bin/python3
OUT=bench/out
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sizes_sp=${SIZES//,/ }
raw=$OUT/allreduce.csv
: >"$raw"

ddpc() { # ddpc NAME BACKEND BUFFERS
    OMP_NUM_THREADS=1 "$BUILD/bin/ddprun" --standalone --nproc_per_node=2 --no_prefix \
        "$BUILD/bin/ddpbench" --op allreduce --sizes "$SIZES" --backend "$2" --buffers "$3" --csv \
        2>/dev/null | awk -F, -v n="$1" '$1=="allreduce" {print n "," $2 "," $4; print "limit," $2 "," $8}'
}
gloo() {
    local port pids=()
    port=$(free_port)
    for r in 0 1; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 OMP_NUM_THREADS=1 \
            "$PY" bench/gloo_allreduce.py $sizes_sp >"$OUT/gloo.$r" 2>"$OUT/gloo.err.$r" &
        pids+=($!)
    done
    wait "${pids[@]}"
    cat "$OUT/gloo.0"
}
for ((rep = 0; rep < REPS; rep++)); do
    ddpc shm_arena shm arena >>"$raw"
    ddpc shm_private shm private >>"$raw"
    ddpc tcp tcp private >>"$raw" || echo "# tcp backend unavailable" >&2
    OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 2 "$BUILD/bin/ddpbench" \
        --op allreduce --sizes "$SIZES" --backend mpi --buffers private --csv 2>/dev/null |
        awk -F, '$1=="allreduce" {print "ddpc_mpi," $2 "," $4}' >>"$raw" ||
        echo "# ddpc's mpi backend unavailable (built without MPI?)" >&2
    mpirun --oversubscribe --bind-to none -np 2 "$OUT/mpi_allreduce" $sizes_sp >>"$raw"
    gloo >>"$raw"
done

echo "allreduce, 2 ranks, float32 sum, in place: median time per call (µs), median of $REPS runs"
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
awk -F, '
function med(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n ? (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : -1
}
/^#/ { next }
{ vals[$1 "," $2] = vals[$1 "," $2] " " $3; if (!($2 in seen)) { seen[$2] = 1; order[++ns] = $2 } }
END {
    printf "%10s %11s %11s %11s %11s %11s %11s %11s | %8s %8s %9s %9s\n", "bytes", "shm(arena)", "shm(priv)", "tcp", "ddpc-mpi", "OpenMPI", "gloo", "mem-limit", "MPI/shm", "gloo/shm", "shm/limit", "dmpi/MPI"
    for (i = 1; i <= ns; i++) {
        s = order[i]; a = med("shm_arena," s); p = med("shm_private," s); t = med("tcp," s)
        d = med("ddpc_mpi," s); m = med("mpi," s); g = med("gloo," s); l = med("limit," s)
        printf "%10d %11.1f %11.1f %11.1f %11.1f %11.1f %11.1f %11.1f | %7.1fx %7.1fx %8.2fx %8.2fx\n", s, a, p, t, d, m, g, l, m / a, g / a, a / l, d / m
    }
}' "$raw"
