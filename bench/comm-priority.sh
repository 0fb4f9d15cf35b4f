#!/usr/bin/env bash
# bench/comm-priority.sh — DDP's gradient order on a shaped link: 2 hosts
# (network namespaces, scripts/netns-cluster.sh) x 1 rank train the same GPT
# with --comm-priority fifo and critical, alternating, --repeat times each;
# prints the median step time, how long before the previous step's last
# gradient the forward started (fwd_lead_ms: negative = after it), the time
# blocked on gradients, and critical / fifo.
#
#   bench/comm-priority.sh [OPTIONS] [DATA.txt]
#
#   --dtrain PATH   the dtrain binary (default: build/dtrain)
#   --rate R        link rate for tc (default 1gbit; "unshaped": none)
#   --model P       preset (default gpt2-124m); --batch B (1) --seq T (64)
#   --steps N       steps per run (default 8); --skip S (2) left out of the medians
#   --repeat R      runs per order, alternating (default 3)
#   --orders LIST   default "fifo critical"
#   --out DIR       keep logs and metrics.jsonl here (default: a temporary directory)
#   -- ARGS         more `dtrain train` flags for every run
#
# Every run: --clip 0 (nothing global decides the update, so critical can
# let the next forward overlap the last pieces), the same seed and data;
# the loss check at the end requires both orders to train the same losses
# bit for bit (2 ranks). DATA defaults to tinyshakespeare.txt next to the
# repository. Needs root and iproute2. docs/comm.md, "Priority scheduling".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trap 'exit 130' INT
trap 'exit 143' TERM
die() {
    echo "comm-priority: error: $*" >&2
    exit 1
}
dtrain=$root/build/dtrain
rate=1gbit
model=gpt2-124m
batch=1
seq=64
steps=8
skip=2
repeat=3
orders="fifo critical"
out=""
data=""
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --dtrain) dtrain=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --model) model=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --seq) seq=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --skip) skip=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --orders) orders=${2//,/ }; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) data=$1; shift ;;
    esac
done
for v in steps skip repeat batch seq; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "--$v must be a whole number, got '${!v}'"
done
((steps > skip)) || die "--steps $steps must be larger than --skip $skip"
[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces and tc)"
[[ -x $dtrain ]] || die "dtrain binary '$dtrain' not found"
dtrain=$(cd "$(dirname "$dtrain")" && pwd)/$(basename "$dtrain")
if [[ -z $data ]]; then
    for f in "$root/../shared/data/tinyshakespeare.txt" "$root/../../shared/data/tinyshakespeare.txt"; do
        [[ -f $f ]] && data=$(cd "$(dirname "$f")" && pwd)/$(basename "$f") && break
    done
    [[ -n $data ]] || die "no DATA given and no tinyshakespeare.txt in ../shared/data"
fi
[[ -r $data ]] || die "cannot read '$data'"
data=$(cd "$(dirname "$data")" && pwd)/$(basename "$data")

cluster=$root/scripts/netns-cluster.sh
export DT_NETNS_PREFIX=${DT_NETNS_PREFIX:-dcp$$}
P=$DT_NETNS_PREFIX
keep=1
if [[ -z $out ]]; then
    out=$(mktemp -d /tmp/dt-commprio-XXXXXX)
    keep=0
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
pids=()
cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    "$cluster" down 2 >/dev/null 2>&1 || true
    ((keep)) || rm -rf "$out"
    exit "$rc"
}
trap cleanup EXIT
shape=(--rate "$rate")
[[ $rate != unshaped ]] || shape=()
"$cluster" up 2 "${shape[@]}" >/dev/null

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
echo "comm-priority: 2 hosts x 1 rank, $model, batch $batch, seq $seq, link $rate, $steps steps" \
    "(medians over steps $((skip + 1))..$steps), $repeat run(s) per order; CPU: $cpu, $(nproc) cores"
run=0
for ((rep = 1; rep <= repeat; rep++)); do
    for order in $orders; do
        run=$((run + 1))
        dir=$out/$order/run$rep
        mkdir -p "$dir"
        port=$((30500 + 2 * run + RANDOM % 200 * 20))
        args=(train --model "$model" --data "$data" --batch "$batch" --seq "$seq" --steps "$steps"
            --threads 1 --seed 1337 --lr 3e-4 --clip 0 --eval-batches 1 --sample-tokens 0
            --progress plain --log-every "$steps" --comm-priority "$order" --no-save "${extra[@]}")
        ip netns exec "$P-1" "$dtrain" launch --nnodes 2 --node-rank 1 --master "10.77.0.1:$port" \
            -n 1 -- "$dtrain" "${args[@]}" --run-dir "$dir" >"$dir/node1.log" 2>&1 &
        pids=($!)
        rc0=0 rc1=0
        ip netns exec "$P-0" "$dtrain" launch --nnodes 2 --node-rank 0 --master "10.77.0.1:$port" \
            -n 1 -- "$dtrain" "${args[@]}" --run-dir "$dir" >"$dir/node0.log" 2>&1 || rc0=$?
        wait "${pids[0]}" || rc1=$?
        pids=()
        ((rc0 == 0 && rc1 == 0)) || die "$order run $rep failed ($rc0, $rc1): $(tail -n 5 "$dir"/node*.log)"
        rm -f "$dir/model.dtgw" # the weights (no checkpoint: --no-save)
        python3 - "$dir/metrics.jsonl" "$skip" "$order" "$rep" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
t = [r for r in rows if r["step"] > int(sys.argv[2])]
med = lambda k: statistics.median(r[k] for r in t if r.get(k) is not None)
print(f"comm-priority: {sys.argv[3]:<9} run {sys.argv[4]}: step {med('step_ms'):8.1f} ms, "
      f"forward lead {med('fwd_lead_ms'):+8.1f} ms, blocked {med('exposed_comm_ms'):7.1f} ms")
EOF
    done
done
"$cluster" down 2 >/dev/null

python3 - "$out" "$skip" "$repeat" $orders <<'EOF'
import json, os, statistics, sys
out, skip, repeat, orders = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def rows(o, r):
    return [json.loads(l) for l in open(os.path.join(out, o, f"run{r}", "metrics.jsonl"))]
def med_run(o, r, k):
    t = [x[k] for x in rows(o, r) if x["step"] > skip and x.get(k) is not None]
    return statistics.median(t)
res = {}
print()
print(f"{'order':<10} {'step ms':>9} {'fwd lead ms':>12} {'blocked ms':>11} {'comm ms':>9} {'vs fifo':>8}")
for o in orders:
    res[o] = {k: statistics.median(med_run(o, r, k) for r in range(1, repeat + 1))
              for k in ("step_ms", "fwd_lead_ms", "exposed_comm_ms", "comm_ms")}
for o in orders:
    v = res[o]
    rel = f"{v['step_ms'] / res['fifo']['step_ms']:.3f}" if "fifo" in res else "-"
    print(f"{o:<10} {v['step_ms']:9.1f} {v['fwd_lead_ms']:+12.1f} {v['exposed_comm_ms']:11.1f} "
          f"{v['comm_ms']:9.1f} {rel:>8}")
# The same losses bit for bit, run against run.
base = {x["step"]: x["loss"] for x in rows(orders[0], 1)}
bad = [(o, r) for o in orders for r in range(1, repeat + 1)
       if {x["step"]: x["loss"] for x in rows(o, r)} != base]
print("loss check:", "every run trained the same losses bit for bit" if not bad
      else f"MISMATCH in {bad}")
sys.exit(3 if bad else 0)
EOF
