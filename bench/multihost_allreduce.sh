#!/usr/bin/env bash
# Allreduce across two hosts, side by side: two network namespaces on this machine joined by a
# veth pair (tests/integration/netns.sh: 10.231.0.1 and 10.231.0.2, seen only inside them), so
# every byte between the hosts crosses a real interface and the kernel's TCP stack. float32 sum,
# in place, median time per call as each contender measures it; the contenders take turns REPS
# times and the table shows the median of those medians, per layout:
#   1 rank per host   ddpc tcp (ddpbench --backend tcp), Open MPI, gloo
#   2 ranks per host  ddpc auto = shm+tcp (shm inside a host, tcp between), Open MPI, gloo
# Open MPI: bench/mpi_allreduce.c under mpirun started in host A, whose rsh agent starts the
# daemons with `ip netns exec`; its TCP traffic is kept to the veth subnet. gloo:
# bench/gloo_allreduce.py with Debian's torch, on the veth interface.
# Each host gets its own half of this machine's cores (taskset), as two machines would: host A
# the first half, host B the second (both all of them on a 1-core machine); every contender
# runs under the same split, so ranks of one host compete only with each other.
# Needs root (namespaces). Removes the namespaces and its processes on exit and on Ctrl-C.
# Usage: bench/multihost_allreduce.sh [BUILD_DIR] [REPS] [SIZES]
#
# Adding a contender: write a function contender_NAME that takes the ranks per host (1 or 2) and
# prints "NAME,BYTES,MICROSECONDS" lines for $SIZES, then add NAME to CONTENDERS. Every
# contender whose name starts with "ddpc" gets ratio columns against openmpi and gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:-build}" && pwd)
REPS=${2:-3}
SIZES=${3:-4096,65536,1048576,16777216,67108864}
PY=/usr/bin/python3
read -r -a CONTENDERS <<<"${CONTENDERS:-ddpc openmpi gloo}" # env: a subset, e.g. "ddpc openmpi"
read -r -a LAYOUTS <<<"${LAYOUTS:-1 2}"                   # env: ranks per host to run
. tests/integration/netns.sh

W=$(mktemp -d "${TMPDIR:-/tmp}/ddp-multihost.XXXXXX")
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    netns_down
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
netns_up "b$$" || { echo "multihost_allreduce: $NETNS_WHY" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sizes_sp=${SIZES//,/ }
port_seq=$((20000 + RANDOM % 20000))
next_port() { port_seq=$((port_seq + 1)); PORT=$port_seq; }

# host I (0 = A, 1 = B): its namespace, veth device and cores
host_ns() { [ "$1" = 0 ] && echo "$NS_A" || echo "$NS_B"; }
host_dev() { [ "$1" = 0 ] && echo "$DEV_A" || echo "$DEV_B"; }
NCPU=$(nproc)
HALF=$((NCPU / 2))
if [ "$HALF" -ge 1 ]; then
    CPUS_A=0-$((HALF - 1)) CPUS_B=$HALF-$((NCPU - 1))
else
    CPUS_A=0 CPUS_B=0
fi
host_cpus() { [ "$1" = 0 ] && echo "$CPUS_A" || echo "$CPUS_B"; }
# on_host I CMD…: CMD inside host I's namespace, on its cores
on_host() {
    local h=$1
    shift
    ip netns exec "$(host_ns "$h")" taskset -c "$(host_cpus "$h")" "$@"
}

# ---- Open MPI across the namespaces ----
mpicc -O2 -o "$W/mpi_allreduce" bench/mpi_allreduce.c
cat >"$W/agent.sh" <<EOF
#!/bin/sh
# mpirun's rsh agent: "agent.sh HOST COMMAND…" runs COMMAND in that host's namespace
h=\$1; shift
# and on its cores; each host's shared-memory files in a directory of its own (both hosts have
# the same hostname, so Open MPI would name their segments alike)
case \$h in
hostA) ns=$NS_A cpus=$CPUS_A ;;
hostB) ns=$NS_B cpus=$CPUS_B ;;
*) echo "agent.sh: unknown host \$h" >&2; exit 1 ;;
esac
mkdir -p "$W/shm-\$h"
export OMPI_MCA_btl_vader_backing_directory="$W/shm-\$h"
exec ip netns exec "\$ns" taskset -c "\$cpus" sh -c "\$*"
EOF
chmod +x "$W/agent.sh"
# mpirun_ns PPN PROGRAM ARGS…: PPN ranks on each host, ranks 0..PPN−1 on host A. Where PPN is
# more than a host's cores, its ranks yield while they poll (mpi_yield_when_idle, Open MPI's
# setting for an oversubscribed node: it does not see taskset's limit itself, and without it
# one rank spinning on a core its peer needs made a 1 MB allreduce take 56 ms instead of 0.24).
mpirun_ns() {
    local ppn=$1 slots=$((HALF > 0 ? HALF : 1)) yield=0
    shift
    [ "$ppn" -gt "$slots" ] && yield=1
    printf 'hostA slots=%d\nhostB slots=%d\n' "$slots" "$slots" >"$W/hosts"
    ip netns exec "$NS_A" mpirun --hostfile "$W/hosts" -np $((2 * ppn)) \
        --map-by "ppr:$ppn:node" --oversubscribe --bind-to none \
        --mca mpi_yield_when_idle $yield --mca plm_rsh_agent "$W/agent.sh" \
        --mca oob_tcp_if_include 10.231.0.0/24 --mca btl tcp,vader,self \
        --mca btl_tcp_if_include 10.231.0.0/24 -x OMP_NUM_THREADS=1 "$@"
}

contender_openmpi() {
    mpirun_ns "$1" "$W/mpi_allreduce" $sizes_sp >"$W/openmpi.out" 2>"$W/openmpi.err" ||
        { cat "$W/openmpi.err" >&2; return 1; }
    sed 's/^mpi,/openmpi,/' "$W/openmpi.out"
}

# ---- ddpc: one ddprun per host (--nnodes 2), rank 0's ddpbench reports ----
contender_ddpc() {
    local ppn=$1 backend node pid
    backend=$([ "$ppn" = 1 ] && echo tcp || echo auto)
    next_port
    for node in 1 0; do
        on_host $node env DDP_HOST_ID=host$node OMP_NUM_THREADS=1 \
            "$BUILD/bin/ddprun" --nnodes 2 --node_rank $node --master_addr "$ADDR_A" \
            --master_port "$PORT" --nproc_per_node "$ppn" --no_prefix --rdzv_timeout 60 \
            "$BUILD/bin/ddpbench" --op allreduce --sizes "$SIZES" --backend "$backend" --csv \
            >"$W/ddpc.out.$node" 2>"$W/ddpc.err.$node" &
        pid=$!
        PIDS+=($pid)
        [ $node = 1 ] && continue
        wait $pid || { cat "$W/ddpc.err.0" >&2; return 1; }
    done
    wait "${PIDS[-2]}" || { cat "$W/ddpc.err.1" >&2; return 1; }
    awk -F, '$1=="allreduce" {print "ddpc," $2 "," $4}' "$W/ddpc.out.0"
}

# ---- gloo: every rank started by hand in its host ----
contender_gloo() {
    local ppn=$1 r host pids=() rc=0
    next_port
    for ((r = 0; r < 2 * ppn; r++)); do
        host=$((r / ppn))
        on_host $host env MASTER_ADDR="$ADDR_A" MASTER_PORT="$PORT" RANK=$r \
            WORLD_SIZE=$((2 * ppn)) GLOO_SOCKET_IFNAME="$(host_dev $host)" OMP_NUM_THREADS=1 \
            "$PY" bench/gloo_allreduce.py $sizes_sp >"$W/gloo.$r" 2>"$W/gloo.err.$r" &
        PIDS+=($!)
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || rc=1; done
    [ $rc = 0 ] || { cat "$W"/gloo.err.* >&2; return 1; }
    cat "$W/gloo.0"
}

raw=$W/raw.csv
: >"$raw"
for ((rep = 0; rep < REPS; rep++)); do
    for ppn in "${LAYOUTS[@]}"; do
        for c in "${CONTENDERS[@]}"; do
            # not in a pipeline: the contender runs in this shell, so PIDS reaches cleanup
            if "contender_$c" "$ppn" >"$W/one.csv"; then
                sed "s/^/$ppn,/" "$W/one.csv" >>"$raw"
            else
                echo "# $c with $ppn rank(s) per host failed in run $rep" >&2
            fi
        done
    done
done

echo "allreduce across 2 hosts (network namespaces joined by a veth pair), float32 sum, in place:"
echo "median time per call (µs), median of $REPS runs; ratio = ddpc time / peer time (< 1: ddpc faster)"
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
awk -F, -v names="${CONTENDERS[*]}" '
function med(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n ? (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : -1
}
/^#/ { next }
{
    key = $1 "," $2 "," $3; vals[key] = vals[key] " " $4
    if (!(($1 "," $3) in seen)) { seen[$1 "," $3] = 1; order[$1] = order[$1] " " $3 }
    if (!($1 in lay)) { lay[$1] = 1; layouts[++nl] = $1 }
}
END {
    nc = split(names, cs, " ")
    for (l = 1; l <= nl; l++) {
        p = layouts[l]
        printf "\n%d rank%s per host (%d ranks; ddpc %s)\n", p, p == 1 ? "" : "s", 2 * p, p == 1 ? "tcp" : "shm+tcp"
        printf "%10s", "bytes"
        for (c = 1; c <= nc; c++) printf " %11s", cs[c]
        printf " |"
        for (c = 1; c <= nc; c++) if (cs[c] ~ /^ddpc/) printf " %14s %14s", cs[c] "/OpenMPI", cs[c] "/gloo"
        printf "\n"
        ns = split(order[p], sz, " ")
        for (i = 1; i <= ns; i++) {
            s = sz[i]
            printf "%10d", s
            for (c = 1; c <= nc; c++) { v[c] = med(p "," cs[c] "," s); printf " %11.1f", v[c] }
            printf " |"
            m = med(p ",openmpi," s); g = med(p ",gloo," s)
            for (c = 1; c <= nc; c++) if (cs[c] ~ /^ddpc/)
                printf " %13.2fx %13.2fx", (m > 0 ? v[c] / m : -1), (g > 0 ? v[c] / g : -1)
            printf "\n"
        }
    }
}' "$raw"
