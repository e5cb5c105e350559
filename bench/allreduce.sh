#!/usr/bin/env bash
# Allreduce side by side, 2 ranks on this machine, float32 sum, in place: ddpc shm (arena =
# zero-copy buffers, and private buffers), ddpc tcp, ddpc mpi (ddpbench under mpirun with the
# MPI backend in its default, blocking mode: the library's own overhead over the next column),
# Open MPI's MPI_Allreduce (Debian's openmpi)
# and torch.distributed with gloo (Debian's python3-torch), beside the memory-bandwidth limit
# that ddpbench measures in the same run. Each contender reports its median time per call; the
# contenders take turns REPS times and the table shows the median of those medians.
#
# Every table comes with the machine it was taken on: CPU model, cache sizes (sysfs, as the shm
# backend reads them), glibc's non-temporal threshold (where memcpy starts streaming), the
# cache-line round trip between the two cores before and after (bench/core_distance.c), and the
# allreduce variant the shm backend chose for each size (the algo column; docs/group.md). The
# choice is made afresh in this run: DDP_CACHE_DIR points at an empty directory, so the first
# ddpc group probes and the later ones reuse what it found (printed below the table).
#
# MODE variants: the shm backend's variants instead of the other contenders — each one forced
# (DDP_SHM_ALGO=libc|cached|stream|pipelined), the automatic choice, and libc with
# DDP_SHM_FLUSH=never, arena buffers, in turns with Open MPI; µs per call and Open MPI / variant.
# That is the table to send from a machine where the automatic choice looks wrong.
#
# MODE mpi: the MPI backend's two modes against Open MPI, in turns — ddpc mpi blocking (the
# default: MPI_Allreduce under the watchdog), ddpc mpi nonblocking (DDP_MPI_MODE=nonblocking:
# MPI_Iallreduce tested against the deadline, what the backend did before), Open MPI's own
# MPI_Allreduce; µs per call and each mode's time / Open MPI's. The before/after of the
# blocking mode on one host.
#
# MODE dtypes: the shm backend (arena buffers) in the element types the reducer sends —
# float32 sum, bfloat16 sum and avg (compress_bf16, bf16 gradients), float16 sum and avg — in turns
# with gloo's float16 sum (torch 1.13's gloo has no bfloat16 and no avg), the same bytes per call.
# avg against sum says what the division costs: bfloat16/float16 avg divides the float32 sum before
# its one rounding (docs/group.md).
#
# Usage: bench/allreduce.sh [BUILD_DIR] [REPS] [SIZES] [MODE]   MODE: compare (default) | variants | mpi | dtypes
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPS=${2:-3}
SIZES=${3:-4096,1048576,16777216,67108864}
MODE=${4:-compare}
PY=/usr/bin/python3
OUT=bench/out
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c
cc -O2 -pthread -o "$OUT/core_distance" bench/core_distance.c
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sizes_sp=${SIZES//,/ }
raw=$OUT/allreduce.csv
: >"$raw"
export DDP_CACHE_DIR=$OUT/choice-cache
rm -rf "$DDP_CACHE_DIR"

ddpc() { # ddpc NAME BACKEND BUFFERS [ENV…]: rows NAME,bytes,µs,algo and limit,bytes,µs
    local name=$1 backend=$2 buffers=$3
    shift 3
    # shellcheck disable=SC2086 # $DDPBENCH_ARGS: extra flags (--dtype, --reduce), split on purpose
    env OMP_NUM_THREADS=1 "$@" "$BUILD/bin/ddprun" --standalone --nproc_per_node=2 --no_prefix \
        "$BUILD/bin/ddpbench" --op allreduce --sizes "$SIZES" --backend "$backend" \
        --buffers "$buffers" --csv ${DDPBENCH_ARGS:-} 2>/dev/null |
        awk -F, -v n="$name" '$1=="allreduce" {print n "," $2 "," $4 "," $9; print "limit," $2 "," $8}'
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
mpi() { mpirun --oversubscribe --bind-to none -np 2 "$OUT/mpi_allreduce" $sizes_sp; }
ddpc_mpi() { # ddpc_mpi NAME MODE: ddpbench over the mpi backend in DDP_MPI_MODE=MODE
    OMP_NUM_THREADS=1 DDP_MPI_MODE=$2 mpirun --oversubscribe --bind-to none -np 2 \
        -x OMP_NUM_THREADS -x DDP_MPI_MODE "$BUILD/bin/ddpbench" --op allreduce \
        --sizes "$SIZES" --backend mpi --buffers private --csv 2>/dev/null |
        awk -F, -v n="$1" '$1=="allreduce" {print n "," $2 "," $4}'
}

machine() {
    local nt
    nt=$(/lib64/ld-linux-x86-64.so.2 --list-tunables 2>/dev/null |
        sed -n 's/^glibc.cpu.x86_non_temporal_threshold: \(0x[0-9a-f]*\).*/\1/p')
    echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
    printf 'caches (cpu0, sysfs):'
    for d in /sys/devices/system/cpu/cpu0/cache/index*; do
        [ "$(cat "$d/type")" = Instruction ] && continue
        printf ' L%s %s (shared by CPUs %s);' "$(cat "$d/level")" "$(cat "$d/size")" "$(cat "$d/shared_cpu_list")"
    done
    echo
    [ -n "$nt" ] && echo "glibc memcpy streams (non-temporal stores) above $((nt)) bytes"
}

d0=$("$OUT/core_distance")
for ((rep = 0; rep < REPS; rep++)); do
    if [ "$MODE" = mpi ]; then
        ddpc_mpi ddpc_mpi blocking >>"$raw"
        ddpc_mpi ddpc_mpi_nb nonblocking >>"$raw"
        mpi >>"$raw"
    elif [ "$MODE" = dtypes ]; then
        ddpc f32_sum shm arena >>"$raw"
        for t in bfloat16 float16; do
            for r in sum avg; do
                DDPBENCH_ARGS="--dtype $t --reduce $r" ddpc "${t}_$r" shm arena >>"$raw"
            done
        done
        GLOO_DTYPE=float16 gloo | sed 's/^gloo,/gloo_f16,/' >>"$raw"
    elif [ "$MODE" = variants ]; then
        for v in libc cached stream pipelined; do
            ddpc "$v" shm arena DDP_SHM_ALGO=$v >>"$raw"
        done
        ddpc auto shm arena >>"$raw"
        ddpc libc_noflush shm arena DDP_SHM_ALGO=libc DDP_SHM_FLUSH=never >>"$raw"
        mpi >>"$raw"
    else
        ddpc shm_arena shm arena >>"$raw"
        ddpc shm_private shm private >>"$raw"
        ddpc tcp tcp private >>"$raw" || echo "# tcp backend unavailable" >&2
        ddpc_mpi ddpc_mpi blocking >>"$raw" ||
            echo "# ddpc's mpi backend unavailable (built without MPI?)" >&2
        mpi >>"$raw"
        gloo >>"$raw"
    fi
done
d1=$("$OUT/core_distance")

if [ "$MODE" = dtypes ]; then
    echo "allreduce, 2 ranks, shm arena, in place, by element type and op: median time per call (µs), median of $REPS runs"
else
    echo "allreduce, 2 ranks, float32 sum, in place: median time per call (µs), median of $REPS runs"
fi
machine
echo "cache-line round trip between CPUs 0 and 1: $d0 ns before, $d1 ns after (> 200: the shm backend evicts what it reads)"
awk -F, -v mode="$MODE" '
function med(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n ? (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : -1
}
/^#/ { next }
{
    vals[$1 "," $2] = vals[$1 "," $2] " " $3
    if ($4 != "") algo[$1 "," $2] = $4
    if (!($2 in seen)) { seen[$2] = 1; order[++ns] = $2 }
}
END {
    if (mode == "mpi") {
        printf "%10s %14s %14s %11s | %12s %12s\n", "bytes", "mpi blocking", "mpi nonblock", "OpenMPI", "block/MPI", "nonblk/MPI"
        for (i = 1; i <= ns; i++) {
            s = order[i]; b = med("ddpc_mpi," s); n = med("ddpc_mpi_nb," s); m = med("mpi," s)
            printf "%10d %14.1f %14.1f %11.1f | %11.2fx %11.2fx\n", s, b, n, m, b / m, n / m
        }
        exit
    }
    if (mode == "dtypes") {
        printf "%10s %10s %10s %10s %10s %10s %10s %10s | %9s %9s %9s\n", "bytes", "f32 sum", "bf16 sum", "bf16 avg", "f16 sum", "f16 avg", "gloo f16", "mem-limit", "bavg/bsum", "havg/hsum", "gloo/f16"
        for (i = 1; i <= ns; i++) {
            s = order[i]; f = med("f32_sum," s); bs = med("bfloat16_sum," s); ba = med("bfloat16_avg," s)
            hs = med("float16_sum," s); ha = med("float16_avg," s); g = med("gloo_f16," s); l = med("limit," s)
            printf "%10d %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f | %8.2fx %8.2fx %8.1fx\n", s, f, bs, ba, hs, ha, g, l, ba / bs, ha / hs, g / hs
        }
        exit
    }
    if (mode == "variants") {
        nv = split("libc cached stream pipelined auto libc_noflush", vs, " ")
        printf "%10s", "bytes"
        for (k = 1; k <= nv; k++) printf " %12s", vs[k]
        printf " %11s | %-10s", "OpenMPI", "auto chose"
        for (k = 1; k <= nv; k++) printf " %9s", "MPI/" substr(vs[k], 1, 5)
        printf "\n"
        for (i = 1; i <= ns; i++) {
            s = order[i]; m = med("mpi," s)
            printf "%10d", s
            for (k = 1; k <= nv; k++) printf " %12.1f", med(vs[k] "," s)
            printf " %11.1f | %-10s", m, algo["auto," s]
            for (k = 1; k <= nv; k++) printf " %8.2fx", m / med(vs[k] "," s)
            printf "\n"
        }
        exit
    }
    printf "%10s %11s %-10s %11s %11s %11s %11s %11s %11s | %8s %8s %9s %9s\n", "bytes", "shm(arena)", "algo", "shm(priv)", "tcp", "ddpc-mpi", "OpenMPI", "gloo", "mem-limit", "MPI/shm", "gloo/shm", "shm/limit", "dmpi/MPI"
    for (i = 1; i <= ns; i++) {
        s = order[i]; a = med("shm_arena," s); p = med("shm_private," s); t = med("tcp," s)
        d = med("ddpc_mpi," s); m = med("mpi," s); g = med("gloo," s); l = med("limit," s)
        printf "%10d %11.1f %-10s %11.1f %11.1f %11.1f %11.1f %11.1f %11.1f | %7.1fx %7.1fx %8.2fx %8.2fx\n", s, a, algo["shm_arena," s], p, t, d, m, g, l, m / a, g / a, a / l, d / m
    }
}' "$raw"
if [ "$MODE" = mpi ]; then
    : # no shm in this table
elif compgen -G "$DDP_CACHE_DIR/shm-*.txt" >/dev/null; then
    echo "the shm choice probed in this run (per size band 64K 256K 1M 4M 16M 64M 256M): $(sed -n 3p "$DDP_CACHE_DIR"/shm-*.txt | head -1)"
else
    echo "the shm choice: from the rules (the probe did not complete in this run; docs/group.md)"
fi
