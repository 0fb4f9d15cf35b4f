#!/usr/bin/env bash
# netns-cluster.sh — a pretend cluster of K hosts on one machine, made of
# network namespaces, for multi-host tests of dtrain.
#
#   scripts/netns-cluster.sh up K [--rate 1gbit] [--delay 0.5ms]
#   scripts/netns-cluster.sh down K
#   scripts/netns-cluster.sh run K [--rate R] [--delay D] -- COMMAND [ARGS...]
#
# Layout (PREFIX defaults to "dtn", set DT_NETNS_PREFIX to run several
# clusters side by side):
#
#   namespace PREFIX-br : bridge br0, with one veth end per host (h0..hK-1)
#   namespace PREFIX-i  : eth0 = 10.77.0.(i+1)/24 (the other veth end), lo
#
# Host i is entered with `ip netns exec PREFIX-i COMMAND`. Nothing is added
# to the caller's own namespace: the bridge lives in a namespace of its own,
# so the only addresses that exist are the ones above, inside the cluster.
# --rate/--delay shape each host's eth0 egress with netem (delay) and tbf
# (rate) under it, so traffic between any two hosts is shaped on both hosts'
# links.
#
# `up` is all or nothing: on any failure (or ^C) the trap removes what was
# created. `down` is idempotent. `run` brings the cluster up, runs COMMAND
# (with DT_NETNS_PREFIX and DT_NETNS_HOSTS exported) and always tears the
# cluster down, passing on COMMAND's exit code.
set -euo pipefail

PREFIX=${DT_NETNS_PREFIX:-dtn}
SUBNET=10.77.0

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "netns-cluster: error: $*" >&2
    exit 1
}

check_env() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces need CAP_NET_ADMIN)"
    command -v ip >/dev/null || die "'ip' (iproute2) not found"
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

reachable() {
    local err
    err=$(ip netns exec "$1" timeout 1 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
    [[ $err == *"refused"* ]]
}

down() {
    local k=$1 i
    for ((i = 0; i < k; i++)); do
        if ns_exists "$PREFIX-$i"; then ip netns del "$PREFIX-$i"; fi
    done
    if ns_exists "$PREFIX-br"; then ip netns del "$PREFIX-br"; fi
    return 0
}

up() {
    local k=$1 rate=$2 delay=$3 i
    ((k >= 1 && k <= 250)) || die "K must be in [1, 250], got '$k'"
    for ((i = 0; i < k; i++)); do
        ! ns_exists "$PREFIX-$i" || die "namespace $PREFIX-$i exists already (run: $0 down $k)"
    done
    # From here on, any failure removes everything created so far.
    trap 'rc=$?; trap - EXIT INT TERM; down '"$k"'; exit $rc' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ip netns add "$PREFIX-br"
    ip -n "$PREFIX-br" link set lo up
    ip -n "$PREFIX-br" link add br0 type bridge
    ip -n "$PREFIX-br" link set br0 up
    for ((i = 0; i < k; i++)); do
        local ns="$PREFIX-$i"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Create the pair inside the host namespace, then move one end to
        # the bridge namespace: no interface ever appears in ours.
        ip -n "$ns" link add eth0 type veth peer name "h$i"
        ip -n "$ns" link set "h$i" netns "$PREFIX-br"
        ip -n "$PREFIX-br" link set "h$i" master br0
        ip -n "$PREFIX-br" link set "h$i" up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [[ -n $delay || -n $rate ]]; then
            local parent="root"
            if [[ -n $delay ]]; then
                ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem delay "$delay" ||
                    die "cannot add netem (delay $delay) on $ns: is the kernel module sch_netem available?"
                parent="parent 1:"
            fi
            if [[ -n $rate ]]; then
                # shellcheck disable=SC2086 # $parent is two words on purpose
                ip netns exec "$ns" tc qdisc add dev eth0 $parent handle 2: tbf rate "$rate" \
                    burst 256kb latency 100ms ||
                    die "cannot add tbf (rate $rate) on $ns: is the kernel module sch_tbf available?"
            fi
        fi
    done
    # Wait until every host reaches the first one (bridge ports take a
    # moment to forward). ping may not be installed; a TCP connection to a
    # closed port answered by "refused" proves the path works just as well.
    for ((i = 1; i < k; i++)); do
        local ok=0 t
        for t in $(seq 1 50); do
            if reachable "$PREFIX-$i" "$SUBNET.1"; then
                ok=1
                break
            fi
            sleep 0.1
        done
        ((ok)) || die "host $i cannot reach $SUBNET.1 over the bridge"
    done
    trap - EXIT INT TERM
    echo "netns-cluster: $k hosts up: $(for ((i = 0; i < k; i++)); do printf '%s-%d=%s.%d ' "$PREFIX" "$i" "$SUBNET" $((i + 1)); done)${rate:+rate $rate }${delay:+delay $delay}"
}

[[ $# -ge 2 ]] || usage
cmd=$1
k=$2
shift 2
[[ $k =~ ^[0-9]+$ ]] || die "K must be a number, got '$k'"
rate=""
delay=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --rate) rate=${2:?--rate needs a value (e.g. 1gbit)}; shift 2 ;;
    --delay) delay=${2:?--delay needs a value (e.g. 0.5ms)}; shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument '$1'" ;;
    esac
done

check_env
case $cmd in
up) up "$k" "$rate" "$delay" ;;
down) down "$k" ;;
run)
    [[ $# -ge 1 ]] || die "run: no command given after --"
    up "$k" "$rate" "$delay"
    trap 'trap - EXIT INT TERM; down '"$k" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    export DT_NETNS_PREFIX=$PREFIX DT_NETNS_HOSTS=$k
    set +e
    "$@"
    rc=$?
    set -e
    exit $rc
    ;;
*) usage ;;
esac
