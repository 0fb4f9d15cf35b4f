#!/usr/bin/env bash
# torus_netns.sh DTRAIN [RATE] [ITERS] [RUNS] — torus2d across 4 hosts x 2
# ranks made of network namespaces (scripts/netns-cluster.sh), each host's
# link shaped to RATE (default 1gbit; "none": unshaped), against the ring
# halving-doubling and the hierarchical algorithm: `dtrain bench comm` for each,
# 4-16 MiB, RUNS rounds interleaved (default 1). Every row must be exact
# (#wrong 0) and run the algorithm asked for; the table prints each
# algorithm's median busbw and torus2d's ratio to ring and hier (reported,
# not asserted: speed goals live in benchmarks, not in tests).
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or ip/tc is missing.
set -euo pipefail
dtrain=$1
rate=${2:-1gbit}
iters=${3:-3}
runs=${4:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the netns test needs root (network namespaces)"
    exit 77
fi
for t in ip tc; do
    if ! command -v $t >/dev/null; then
        echo "SKIP: the netns test needs '$t' (iproute2)"
        exit 77
    fi
done
export DT_NETNS_PREFIX=dtt$$ DT_TIMEOUT=60
hosts=4
dir=$(mktemp -d /tmp/dt-torus-XXXXXX)
trap 'rm -rf "$dir"; "$root/scripts/netns-cluster.sh" down $hosts >/dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
shape=()
[[ $rate != none ]] && shape=(--rate "$rate")
"$root/scripts/netns-cluster.sh" up $hosts "${shape[@]}" >/dev/null ||
    fail "could not bring up $hosts hosts (shaping $rate)"

# bench comm on every host (2 ranks each), node 0 last; its table to $1.
run_all() {
    local out=$1 port=$((29500 + RANDOM % 2000)) pids=() h rc=0
    shift
    for ((h = hosts - 1; h >= 1; h--)); do
        ip netns exec "$DT_NETNS_PREFIX-$h" "$dtrain" launch --nnodes $hosts --node-rank $h \
            --master 10.77.0.1:$port -n 2 "$dtrain" bench comm "$@" >/dev/null 2>"$dir/node$h.err" &
        pids+=($!)
    done
    ip netns exec "$DT_NETNS_PREFIX-0" "$dtrain" launch --nnodes $hosts --node-rank 0 \
        --master 10.77.0.1:$port -n 2 "$dtrain" bench comm "$@" >"$out" 2>"$dir/node0.err" || rc=$?
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    ((rc == 0)) || fail "bench comm $*: exit $rc: $(cat "$dir"/node*.err | tail -n 20)"
}

algos=(ring rhd hier torus2d)
for ((r = 0; r < runs; r++)); do
    for a in "${algos[@]}"; do
        run_all "$dir/$a.$r" --sizes 4M:16M --iters "$iters" --warmup 1 --algo "$a"
        grep -q "8 ranks, transport shm+tcp" "$dir/$a.$r" || fail "$a: not 8 ranks over shm+tcp: $(cat "$dir/$a.$r")"
        rows=$(grep -Ec '^ +[0-9]+ ' "$dir/$a.$r")
        [[ $rows == 3 ]] || fail "$a: $rows rows, expected 3 (4M..16M)"
        if grep -E '^ +[0-9]+ ' "$dir/$a.$r" | awk -v a="$a" '$6 != a || $7 != 0 {bad = 1} END {exit !bad}'; then
            fail "$a: a row ran another algorithm or has wrong elements: $(cat "$dir/$a.$r")"
        fi
    done
done
echo "ok: ring, rhd, hier and torus2d exact across $hosts hosts x 2 ranks (link ${rate}), $runs round(s)"
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
printf '# %d hosts x 2 ranks, link %s, busbw GB/s (median of %d runs, %d iters each)\n' \
    $hosts "$rate" "$runs" "$iters"
printf '%10s %8s %8s %8s %8s %12s %12s\n' bytes ring rhd hier torus2d torus/ring torus/hier
for size in 4194304 8388608 16777216; do
    declare -A m=()
    for a in "${algos[@]}"; do
        m[$a]=$(cat "$dir/$a".* | awk -v s=$size '$1 == s {print $5}' | median)
    done
    awk -v s=$size -v r="${m[ring]}" -v d="${m[rhd]}" -v h="${m[hier]}" -v t="${m[torus2d]}" \
        'BEGIN {printf "%10d %8.3f %8.3f %8.3f %8.3f %11.2fx %11.2fx\n", s, r, d, h, t, t / r, t / h}'
done
