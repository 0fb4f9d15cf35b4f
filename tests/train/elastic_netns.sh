#!/usr/bin/env bash
# elastic_netns.sh DTRAIN — elastic training across two hosts (network
# namespaces made by scripts/netns-cluster.sh), 2 ranks each, started with
# `dtrain launch --nnodes 2 --elastic 2:4` by hand. Once the job is past
# step 10, host 0's launcher is SIGKILLed: its two ranks die with it, rank 0
# among them, which serves the rendezvous store. The ranks of host 1 must
# go on at 2 ranks (the store moved to host 1), host 1's launcher exits 0,
# RUN/elastic.jsonl records ranks 0 and 1 lost, and the losses after the
# restored step equal a 2-rank run resumed from that step's checkpoint.
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or `ip` is missing.
set -euo pipefail
dtrain=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the netns test needs root (network namespaces)"
    exit 77
fi
if ! command -v ip >/dev/null; then
    echo "SKIP: the netns test needs 'ip' (iproute2)"
    exit 77
fi
export DT_NETNS_PREFIX=dte$$
dir=$(mktemp -d /tmp/dt-elastic-netns-XXXXXX)
trap 'rm -rf "$dir"; "$root/scripts/netns-cluster.sh" down 2 >/dev/null 2>&1' EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$dir"/node*.log; do
        echo "--- $f" >&2
        tail -n 15 "$f" >&2
    done
    exit 1
}

steps=40
common=(--data "$root/README.md" --model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1
        --peak-flops 1e9 --sample-tokens 0 --progress plain --val-split 0 --lr 1e-3 --warmup 1
        --seed 7 --global-batch 12 --keep 1000 --ckpt-every 1 --steps $steps)
export dtrain dir
export DT_JOB_TOKEN=0123456789abcdef0123456789abcdef
# Rank 0 a straggler (DT_FAULT_SLOW) so that the run lasts long enough.
"$root/scripts/netns-cluster.sh" run 2 -- bash -c '
    run=$dir/run
    for n in 1 0; do
        DT_FAULT_SLOW=0:8 ip netns exec $DT_NETNS_PREFIX-$n $dtrain launch --nnodes 2 \
            --node-rank $n --master 10.77.0.1:29410 -n 2 --elastic 2:4 -- $dtrain train "$@" \
            --elastic 2:4 --run-dir $run --ckpt-dir $run/ck >$dir/node$n.log 2>&1 &
        eval pid$n=$!
    done
    for i in $(seq 1 1200); do
        [ "$(wc -l < $run/metrics.jsonl 2>/dev/null || echo 0)" -ge 10 ] && break
        sleep 0.05
    done
    kill -9 $pid0
    wait $pid1; echo $? > $dir/rc1
    wait $pid0 || true' _ "${common[@]}"

[[ -f $dir/rc1 ]] || fail "host 1's launcher did not finish"
[[ $(cat "$dir/rc1") == 0 ]] || fail "host 1's launcher exited $(cat "$dir/rc1")"
grep -q "node 0's launcher is gone; the ranks here go on" "$dir/node1.log" ||
    fail "host 1's launcher did not go on alone"
[[ -f $dir/run/elastic.jsonl ]] || fail "no membership change recorded"
read -r s0 world lost < <(python3 - "$dir/run/elastic.jsonl" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
last = ev[-1]
print(last["step"], last["world"], last["lost"])
EOF
)
[[ $world == 2 ]] || fail "the job went on at $world ranks, expected 2"
[[ $lost == 0,1 ]] || fail "lost ranks $lost, expected 0,1"
echo "ok: host 0 (ranks 0 and 1, the store's host) killed; host 1's 2 ranks went on from step $s0"

mkdir -p "$dir/ref/ck"
cp "$dir/run/ck/ckpt-$(printf %06d "$s0").dtck" "$dir/ref/ck/"
"$dtrain" train "${common[@]}" --nproc 2 --resume --ckpt-dir "$dir/ref/ck" --run-dir "$dir/ref" \
    >"$dir/ref.log" 2>&1 || fail "the reference run failed: $(tail -n 3 "$dir/ref.log")"
python3 - "$dir/run/metrics.jsonl" "$dir/ref/metrics.jsonl" "$s0" "$steps" <<'EOF' || fail "losses differ"
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
s0, steps = int(sys.argv[3]), int(sys.argv[4])
assert sorted(a) == list(range(1, steps + 1)), "the elastic run's metrics lack steps"
for s in range(s0 + 1, steps + 1):
    if abs(a[s] - b[s]) > 1e-5 * abs(b[s]):
        sys.exit(f"step {s}: {a[s]} elastic, {b[s]} resumed")
print(f"ok: losses of steps {s0 + 1}..{steps} equal a 2-rank run resumed from step {s0}")
EOF
