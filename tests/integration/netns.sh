# netns.sh — two "hosts" made of network namespaces, for the multi-host tests and benchmarks.
# Sourced after lib.sh (tests) or on its own (bench/multihost_allreduce.sh).
#
#   netns_up TAG     makes namespaces ddp-TAG-a and ddp-TAG-b, each with loopback up, joined by
#                    a veth pair (ddpTAGa in a, ddpTAGb in b) with addresses 10.231.0.1 and
#                    10.231.0.2/24: only these two namespaces ever see those addresses. Sets
#                    NS_A NS_B ADDR_A ADDR_B DEV_A DEV_B. Returns 1 when namespaces cannot be
#                    made here (not root, no CAP_SYS_ADMIN), with the reason in NETNS_WHY.
#   netns_down       deletes both namespaces (the veth pair goes with them); safe to call twice.
#   in_a CMD… / in_b CMD…   run CMD inside a namespace (ip netns exec; the pid stays the same,
#                    so "$!" of a background in_a is the command's own pid).
#
# The caller arranges for netns_down to run on every exit (lib.sh's tests: netns_trap).
# The hostname is the same in both namespaces, so ranks need DDP_HOST_ID to know they are on
# different hosts.

NS_A= NS_B=

netns_up() {
    local tag=$1
    NETNS_WHY=
    if [ "$(id -u)" != 0 ]; then
        NETNS_WHY="network namespaces need root"
        return 1
    fi
    NS_A=ddp-$tag-a NS_B=ddp-$tag-b
    DEV_A=ddp${tag}a DEV_B=ddp${tag}b
    DEV_A=${DEV_A:0:15} DEV_B=${DEV_B:0:15}
    ADDR_A=10.231.0.1 ADDR_B=10.231.0.2
    if ! ip netns add "$NS_A" 2>/dev/null || ! ip netns add "$NS_B" 2>/dev/null; then
        NETNS_WHY="ip netns add failed (no CAP_SYS_ADMIN?)"
        netns_down
        return 1
    fi
    ip -n "$NS_A" link add "$DEV_A" type veth peer name "$DEV_B" netns "$NS_B" &&
        ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up &&
        ip -n "$NS_A" addr add "$ADDR_A/24" dev "$DEV_A" &&
        ip -n "$NS_B" addr add "$ADDR_B/24" dev "$DEV_B" &&
        ip -n "$NS_A" link set "$DEV_A" up && ip -n "$NS_B" link set "$DEV_B" up || {
        NETNS_WHY="cannot make the veth pair between $NS_A and $NS_B"
        netns_down
        return 1
    }
    return 0
}

netns_down() {
    [ -n "$NS_A" ] && ip netns del "$NS_A" 2>/dev/null
    [ -n "$NS_B" ] && ip netns del "$NS_B" 2>/dev/null
    NS_A= NS_B=
    return 0
}

in_a() { ip netns exec "$NS_A" "$@"; }
in_b() { ip netns exec "$NS_B" "$@"; }

# netns_trap: for lib.sh's tests: delete the namespaces, then lib.sh's cleanup (which kills what
# the test started and keeps the exit status); Ctrl-C and SIGTERM exit through the same path.
netns_trap() {
    trap 'rc=$?; netns_down; (exit $rc); cleanup' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
