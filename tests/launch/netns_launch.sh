#!/usr/bin/env bash
# netns_launch.sh DTRAIN PROBE [COLL_CHECK] — two hosts (network namespaces
# made by scripts/netns-cluster.sh) x 2 ranks started with `dtrain launch` by
# hand, node 0 at 10.77.0.1: every rank gets the right global rank, node
# rank and master address; a rank failing on host 1 ends the job on host 0;
# with COLL_CHECK, the collectives are correct across the hosts, ranks of
# one host use shm and the others TCP, and the hierarchical allreduce is
# the default choice (and what runs) for a large message, and `dtrain bench
# comm` runs across the hosts with every result exact.
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or `ip` is missing.
set -euo pipefail
dtrain=$1
probe=$2
coll=${3:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the netns test needs root (network namespaces)"
    exit 77
fi
if ! command -v ip >/dev/null; then
    echo "SKIP: the netns test needs 'ip' (iproute2)"
    exit 77
fi
export DT_NETNS_PREFIX=dtl$$
dir=$(mktemp -d /tmp/dt-netns-XXXXXX)
trap 'rm -rf "$dir"; "$root/scripts/netns-cluster.sh" down 2 >/dev/null 2>&1' EXIT
export dtrain probe dir
fail() { echo "FAIL: $*" >&2; exit 1; }

# The script itself: down is idempotent, up refuses to clobber a cluster,
# and a failing up (shaping this kernel may not support) leaves nothing.
script=$root/scripts/netns-cluster.sh
count_ns() { ip netns list | awk '{print $1}' | grep -c "^$DT_NETNS_PREFIX-" || true; }
"$script" down 2 && "$script" down 2 || fail "down on nothing must succeed"
"$script" up 2 >/dev/null
[[ $(count_ns) == 3 ]] || fail "up 2 made $(count_ns) namespaces, expected 3"
if "$script" up 2 2>"$dir/up2.err"; then fail "a second up 2 succeeded"; fi
grep -q "exists already" "$dir/up2.err" || fail "second up: $(cat "$dir/up2.err")"
"$script" down 2
[[ $(count_ns) == 0 ]] || fail "down 2 left $(count_ns) namespaces"
if "$script" up 2 --delay 1ms --rate 100mbit >/dev/null 2>"$dir/shape.err"; then
    ip netns exec "$DT_NETNS_PREFIX-0" tc qdisc show dev eth0 | grep -q netem || fail "no netem qdisc"
    "$script" down 2
    echo "ok: shaping (netem + tbf) set up and torn down"
else
    grep -q "sch_netem" "$dir/shape.err" || fail "shaping failed unclearly: $(cat "$dir/shape.err")"
    echo "ok: this kernel has no netem; up failed clearly: $(tail -n1 "$dir/shape.err")"
fi
[[ $(count_ns) == 0 ]] || fail "a failed or finished up left $(count_ns) namespaces"
echo "ok: netns-cluster.sh up/down idempotent and all-or-nothing"

# Both launchers, one per host; node 1 starts first and waits for node 0.
two_hosts() {
    "$root/scripts/netns-cluster.sh" run 2 -- bash -c '
        ip netns exec $DT_NETNS_PREFIX-1 $dtrain launch --nnodes 2 --node-rank 1 \
            --master 10.77.0.1:29400 -n 2 "$@" 2>$dir/node1.err & n1=$!
        ip netns exec $DT_NETNS_PREFIX-0 $dtrain launch --nnodes 2 --node-rank 0 \
            --master 10.77.0.1:29400 -n 2 "$@" >$dir/node0.out 2>$dir/node0.err; rc0=$?
        wait $n1; rc1=$?
        echo "$rc0 $rc1" > $dir/codes' _ "$@"
    cat "$dir/node0.out"
    cat "$dir/node0.err" "$dir/node1.err" >&2
}

two_hosts "$probe" env "$dir"
read -r rc0 rc1 <"$dir/codes"
[[ $rc0 == 0 && $rc1 == 0 ]] || fail "launchers exited $rc0 and $rc1"
for r in 0 1 2 3; do
    f=$dir/env.$r
    [[ -f $f ]] || fail "rank $r did not run"
    grep -qx "DT_RANK=$r" "$f" || fail "rank $r: $(grep DT_RANK= "$f")"
    grep -qx "DT_NODE_RANK=$((r / 2))" "$f" || fail "rank $r: $(grep NODE_RANK "$f")"
    grep -qx "DT_WORLD_SIZE=4" "$f" || fail "rank $r: wrong world size"
    grep -qx "DT_MASTER_ADDR=10.77.0.1" "$f" || fail "rank $r: $(grep MASTER_ADDR "$f")"
    grep -qx "DT_MASTER_PORT=29401" "$f" || fail "rank $r: $(grep MASTER_PORT "$f")"
done
[[ $(grep -h DT_JOB_TOKEN= "$dir"/env.* | sort -u | wc -l) == 1 ]] || fail "tokens differ"
echo "ok: 2 hosts x 2 ranks, environment right on every rank"

rm -f "$dir"/env.* "$dir"/pid.*
start=$(date +%s%N)
two_hosts "$probe" fail "$dir" 3 9
read -r rc0 rc1 <"$dir/codes"
[[ $rc0 == 9 && $rc1 == 9 ]] || fail "launchers exited $rc0 and $rc1, expected 9 and 9"
grep -q "rank 3 (node 1, local rank 1" "$dir/node0.err" || fail "node 0's summary does not name rank 3"
elapsed=$((($(date +%s%N) - start) / 1000000))
echo "ok: rank 3 failing on host 1 ended the job on both hosts (${elapsed} ms including the cluster setup)"
for f in "$dir"/pid.*; do
    for p in $(cat "$f"); do
        if kill -0 "$p" 2>/dev/null && ! grep -q ') Z' "/proc/$p/stat" 2>/dev/null; then
            fail "pid $p from $f still running"
        fi
    done
done
echo "ok: nothing left running"

if [[ -n $coll ]]; then
    two_hosts --tag-output "$coll" --expect-transport shm+tcp --expect-hier
    read -r rc0 rc1 <"$dir/codes"
    [[ $rc0 == 0 && $rc1 == 0 ]] || fail "collective check across hosts: launchers exited $rc0 and $rc1"
    echo "ok: collectives across 2 hosts x 2 ranks (shm+tcp, hier allreduce by default)"
fi

two_hosts "$dtrain" bench comm --sizes 64K:2M --iters 3 --warmup 1
read -r rc0 rc1 <"$dir/codes"
[[ $rc0 == 0 && $rc1 == 0 ]] || fail "bench comm across hosts: launchers exited $rc0 and $rc1"
out=$dir/node0.out
grep -q "4 ranks, transport shm+tcp" "$out" || fail "bench comm: not 4 ranks over shm+tcp"
rows=$(grep -Ec '^ +[0-9]+ ' "$out")
[[ $rows == 6 ]] || fail "bench comm: $rows rows, expected 6 (64K..2M)"
grep -Eq '^ +2097152 .* hier +0$' "$out" || fail "bench comm: 2 MiB did not run hier with 0 wrong"
if grep -E '^ +[0-9]+ ' "$out" | awk '$NF != 0 {bad = 1} END {exit !bad}'; then
    fail "bench comm: some row has wrong elements"
fi
echo "ok: dtrain bench comm across 2 hosts: 6 sizes, every element right, hier for large messages"

