#!/usr/bin/env bash
# Allreduce across two hosts under mpirun, side by side: ddpc's MPI backends against Open MPI's
# own MPI_Allreduce, in the same run. The two hosts are network namespaces on this machine
# joined by a veth pair (a private /24 seen only inside them), each with its own hostname (a UTS
# namespace), as tests/integration/test_mpi_hosts.sh makes them; mpirun runs in host A and
# starts Open MPI's daemon on each host through an agent script that enters its namespaces.
# Each host runs on its own half of the machine's cores (taskset), as in
# bench/multihost_allreduce.sh, and where a host's ranks outnumber its cores every contender's
# MPI yields while it polls (mpi_yield_when_idle: Open MPI cannot see taskset's limit, and a rank
# spinning on a core its peer needs would measure the scheduler). Open MPI's TCP is held to the
# veth subnet. float32 sum, in place, median time per call as each
# contender measures it; they take turns REPS times and the table shows the median of medians:
#   1 rank per host   ddpc mpi (ddpbench --backend mpi) vs bench/mpi_allreduce.c
#   2 ranks per host  ddpc auto = shm+mpi (shm inside a host, MPI between the hosts' leaders)
#                     vs bench/mpi_allreduce.c (Open MPI's own hierarchy: vader + tcp)
# ddpc runs in both of the mpi backend's modes (DDP_MPI_MODE): blocking, the default
# (MPI_Allreduce under the watchdog), and nonblocking (MPI_Iallreduce tested against the
# deadline: what the backend did before blocking became the default): the before and after.
# Needs root. Removes its namespaces and processes on exit.
# Usage: bench/mpi_hosts_allreduce.sh [BUILD_DIR] [REPS] [SIZES]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:-build}" && pwd)
REPS=${2:-3}
SIZES=${3:-4096,65536,1048576,16777216,67108864}
[ "$(id -u)" -eq 0 ] || { echo "mpi_hosts_allreduce: needs root (network namespaces)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
W=$(mktemp -d "${TMPDIR:-/tmp}/ddp-mpihosts.XXXXXX")
NS_A=ddpmb$$a NS_B=ddpmb$$b NET=10.232.$(($$ % 250))
cleanup() {
    for ns in $NS_A $NS_B; do
        for p in $(ip netns pids $ns 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del $ns 2>/dev/null || true
    done
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT
ip netns add $NS_A && ip netns add $NS_B
ip link add ${NS_A}v type veth peer name ${NS_B}v
ip link set ${NS_A}v netns $NS_A && ip link set ${NS_B}v netns $NS_B
ip -n $NS_A addr add $NET.1/24 dev ${NS_A}v && ip -n $NS_B addr add $NET.2/24 dev ${NS_B}v
for ns in $NS_A $NS_B; do ip -n $ns link set lo up && ip -n $ns link set ${ns}v up; done
NCPU=$(OMP_NUM_THREADS= nproc) # nproc obeys OMP_NUM_THREADS, which is 1 here
HALF=$((NCPU / 2))
if [ "$HALF" -ge 1 ]; then
    CPUS_A=0-$((HALF - 1)) CPUS_B=$HALF-$((NCPU - 1))
else
    CPUS_A=0 CPUS_B=0 HALF=1
fi
cat >"$W/agent.sh" <<AGENT
#!/bin/bash
host=\$1; shift
case \$host in hostA) ns=$NS_A cpus=$CPUS_A ;; hostB) ns=$NS_B cpus=$CPUS_B ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns taskset -c \$cpus unshare --uts sh -c "hostname \$host && exec \$*"
AGENT
chmod +x "$W/agent.sh"
mpicc -O2 -o "$W/mpi_allreduce" bench/mpi_allreduce.c
two_hosts() { # two_hosts PER_HOST PROGRAM ARGS...
    local per=$1 yield=0
    shift
    [ "$per" -gt "$HALF" ] && yield=1
    printf 'hostA slots=%d\nhostB slots=%d\n' "$per" "$per" >"$W/hosts"
    ip netns exec $NS_A mpirun --hostfile "$W/hosts" -np $((2 * per)) --bind-to none \
        --mca mpi_yield_when_idle $yield \
        --mca plm_rsh_agent "$W/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
        --mca oob_tcp_if_include $NET.0/24 --mca btl self,vader,tcp \
        --mca btl_tcp_if_include $NET.0/24 -x OMP_NUM_THREADS -x DDP_HOST_CORES "$@"
}
# ddpc's ranks see one core each under taskset; the cores their host shares are HALF (which the
# group would otherwise take to be all the machine's: docs/environment.md, DDP_HOST_CORES)
export DDP_HOST_CORES=$HALF
raw=$W/raw.csv
: >"$raw"
for ((rep = 0; rep < REPS; rep++)); do
    for per in 1 2; do
        be=mpi
        [ $per = 2 ] && be=auto
        for mode in blocking nonblocking; do
            tag=ddpc$per
            [ $mode = nonblocking ] && tag=nb$per
            DDP_MPI_MODE=$mode two_hosts $per -x DDP_MPI_MODE "$BUILD/bin/ddpbench" --op allreduce \
                --sizes "$SIZES" --backend $be --buffers private --csv 2>/dev/null |
                awk -F, -v t=$tag '$1=="allreduce" {print t "," $2 "," $4}' >>"$raw"
        done
        two_hosts $per "$W/mpi_allreduce" ${SIZES//,/ } | sed "s/^mpi,/mpi$per,/" >>"$raw"
    done
done
echo "allreduce across 2 namespace hosts under mpirun, float32 sum, in place: median time per call (µs), median of $REPS runs"
echo "machine: $NCPU cores (host A on CPUs $CPUS_A, host B on $CPUS_B), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%Y-%m-%d)"
awk -F, '
function med(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n ? (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : -1
}
{ vals[$1 "," $2] = vals[$1 "," $2] " " $3; if (!($2 in seen)) { seen[$2] = 1; order[++ns] = $2 } }
END {
    printf "%10s | %10s %10s %10s %7s %7s | %10s %10s %10s %7s %7s\n", "bytes", "mpi blk", "mpi nonblk", "OpenMPI", "blk", "nonblk", "shm+mpi b", "shm+mpi nb", "OpenMPI", "blk", "nonblk"
    printf "%10s | %48s | %48s\n", "", "1 rank per host (ratios: ddpc / Open MPI)", "2 ranks per host (ratios: ddpc / Open MPI)"
    for (i = 1; i <= ns; i++) {
        s = order[i]; d1 = med("ddpc1," s); n1 = med("nb1," s); m1 = med("mpi1," s)
        d2 = med("ddpc2," s); n2 = med("nb2," s); m2 = med("mpi2," s)
        printf "%10d | %10.1f %10.1f %10.1f %6.2fx %6.2fx | %10.1f %10.1f %10.1f %6.2fx %6.2fx\n", s, d1, n1, m1, d1 / m1, n1 / m1, d2, n2, m2, d2 / m2, n2 / m2
    }
}' "$raw"
