#!/usr/bin/env bash
# Two "hosts" × 2 ranks under mpirun, made of network namespaces: each host is a namespace with
# its own loopback and one end of a veth pair (a private /24 that nothing else can reach), and
# its own hostname (a UTS namespace), so the group sees two hosts and takes shm+mpi: shm inside
# each host, MPI (Open MPI over TCP on the veth pair) between them. mpirun runs in host A's
# namespace and starts Open MPI's daemon on each host through a small agent script (in place of
# ssh) that enters that host's namespaces. Open MPI's TCP is held to the veth subnet.
#   collcheck: every collective against the reference over shm+mpi
#   ddptrain -np 4 across the hosts ends where the one-host run (mpirun -np 4, shm) does: the same
#   test accuracy within 0.005 and test loss within 1% (the sums are grouped differently, (a+b)+(c+d)
#   against a+b+c+d, so the bits differ from the first step; 60 steps of SGD keep that far below
#   these bounds, which a wrong reduction — a host's ranks missing, a mean over 2 — breaks at once)
# Needs root and ip netns (skips with 77 otherwise). Usage: test_mpi_hosts.sh BINDIR [collcheck args]
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mpi_lib.sh"
shift
[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v unshare >/dev/null ||
    { echo "skip: needs root, ip (iproute2) and unshare"; exit 77; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
NS_A=ddpmpi$$a NS_B=ddpmpi$$b
NET=10.231.$(($$ % 250)) # inside the two namespaces only

ns_cleanup() {
    local rc=$? left=""
    for ns in $NS_A $NS_B; do
        ip netns list 2>/dev/null | grep -qw "$ns" || continue
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            left="$left $p"
            kill -9 "$p" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    [ -z "$left" ] || { echo "FAIL: processes left in the namespaces:$left" >&2; rc=1; }
    (exit $rc)
    cleanup
}
trap ns_cleanup EXIT

unshare --uts true 2>/dev/null || { echo "skip: cannot make UTS namespaces (unshare --uts)"; exit 77; }
ip netns add $NS_A 2>/dev/null || { echo "skip: cannot create network namespaces"; exit 77; }
ip netns add $NS_B
ip link add ${NS_A}v type veth peer name ${NS_B}v
ip link set ${NS_A}v netns $NS_A
ip link set ${NS_B}v netns $NS_B
ip -n $NS_A addr add $NET.1/24 dev ${NS_A}v
ip -n $NS_B addr add $NET.2/24 dev ${NS_B}v
for ns in $NS_A $NS_B; do
    ip -n $ns link set lo up
    ip -n $ns link set ${ns}v up
done

# The agent: Open MPI runs "AGENT HOST COMMAND..." to start its daemon on HOST.
cat >"$T/agent.sh" <<AGENT
#!/bin/bash
host=\$1; shift
case \$host in hostA) ns=$NS_A ;; hostB) ns=$NS_B ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns unshare --uts sh -c "hostname \$host && exec \$*"
AGENT
chmod +x "$T/agent.sh"
printf 'hostA slots=2\nhostB slots=2\n' >"$T/hosts"
two_hosts() { # two_hosts PROGRAM ARGS...: 4 ranks, 2 on each host
    ip netns exec $NS_A mpirun --hostfile "$T/hosts" -np 4 --mca plm_rsh_agent "$T/agent.sh" \
        --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $NET.0/24 \
        --mca btl self,vader,tcp --mca btl_tcp_if_include $NET.0/24 \
        -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS "$@"
}
cd "$T"

two_hosts "$BIN/collcheck" "$@" >coll.out 2>&1 || { cat coll.out; fail "collcheck across hosts"; }
assert_contains coll.out "checks passed on 4 ranks (backend shm+mpi)"
ok "2 hosts × 2 ranks under mpirun: $(grep 'checks passed' coll.out)"

args=(--total_steps 60 --eval_every 30)
# Under AddressSanitizer, no leak check for the two trainings: LeakSanitizer's tracer thread
# crashed at exit ("Tracer caught signal 11") in a CI run with 4 ranks on 2 cores — its
# stop-the-world, not a leak. The MPI path's leaks are still checked by collcheck above and by
# integration.mpi.train.
if [ -f "$BIN/libkeep_loaded.so" ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
mpi_run 4 "$BIN/ddptrain" "${args[@]}" --out_dir one >one.out 2>&1 ||
    { cat one.out; fail "one-host training failed"; }
two_hosts "$BIN/ddptrain" "${args[@]}" --out_dir two >two.out 2>&1 ||
    { cat two.out; fail "two-host training failed"; }
assert_contains one.out "DDP: 4 processes (shm: every rank on one host, started by mpirun)"
assert_contains two.out "DDP: 4 processes (shm+mpi: 2 hosts × 2 ranks: shm within each, mpi among them, started by mpirun)"
final() { # final OUT: "LOSS ACCURACY" of the last evaluation
    grep -o 'test loss [0-9.]*, test accuracy [0-9.]*' "$1" | tail -1 |
        sed 's/test loss \(.*\), test accuracy \(.*\)/\1 \2/'
}
f1=$(final one.out) f2=$(final two.out)
[ -n "$f1" ] && [ -n "$f2" ] || fail "no final evaluation ('$f1' / '$f2')"
l1=${f1% *} a1=${f1#* } l2=${f2% *} a2=${f2#* }
awk -v l1="$l1" -v l2="$l2" -v a1="$a1" -v a2="$a2" 'BEGIN {
    da = a1 - a2; if (da < 0) da = -da
    dl = (l1 - l2) / l1; if (dl < 0) dl = -dl
    exit !(da <= 0.005 && dl <= 0.01) }' ||
    fail "two hosts: loss $l2 accuracy $a2; one host: loss $l1 accuracy $a1"
ok "mpirun -np 4 on 2 hosts (shm+mpi): test loss $l2 accuracy $a2; on 1 host (shm): $l1 $a1"
