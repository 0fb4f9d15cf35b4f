#!/usr/bin/env bash
# bench/async-eval.sh — synchronous DDP against local SGD and gossip with a
# straggler: N ranks on this machine train the same GPT (same seed, data
# and flags; only --dp-mode changes), one rank slowed by DT_FAULT_SLOW.
# DDP's validation loss at step --steps is the target; every other mode
# runs twice as many steps and the table shows the wall-clock (rank 0's
# elapsed_s: from the start of the loop to the end of the evaluation,
# evaluations and their waits included) to the first evaluation at or
# below the target.
#
#   bench/async-eval.sh [OPTIONS]
#
#   --dtrain PATH   the dtrain binary (default: build/dtrain)
#   --data PATH     the corpus (default: ../shared/data/tinyshakespeare.txt
#                   beside the checkout, else README.md)
#   --nproc N       ranks (default 4)
#   --steps N       DDP's steps; the target is its validation loss there
#                   (default 64)
#   --eval-every E  evaluation interval (default 8: local SGD's H, so that an
#                   evaluation, itself a meeting of the replicas, adds none)
#   --slow R:F      DT_FAULT_SLOW: rank R computes F times slower (default
#                   1:2; "none" for no straggler)
#   --repeat K      runs per mode, round robin; the table shows medians
#                   (default 3)
#   --modes LIST    semicolon-separated NAME=FLAGS (default: ddp, local with
#                   H 8, gossip on a ring, a parameter server with 4 shards
#                   and staleness 4)
#   --hosts H       run the ranks as H hosts of nproc/H ranks each on network
#                   namespaces (scripts/netns-cluster.sh; needs root), TCP
#                   between them (default 0: one machine, shared memory)
#   --rate R        with --hosts: shape each host's link with tc (tbf), e.g.
#                   100mbit (default: unshaped)
#   --out DIR       keep the runs here (default: a temporary directory)
#   -- ARGS         more `dtrain train` flags for every run
#
# Columns: mode; wall-clock to the target (median, and the speed-up over
# DDP's median); samples/s over the whole run (its elapsed_s); communication time per
# sample (rank 0's comm_ms over the run / samples); bytes each rank sent per
# step (mean; the parameter server: pushes and the replies of its server
# thread, not what goes to the rank's own server); validation loss at step --steps (equal samples; median);
# the step that reached the target. Run it alone: /work/tools/cpu-exclusive
# bench/async-eval.sh (or flock -x /tmp/dtrain-cpu.lock ...). See docs/async.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dtrain=$root/build/dtrain
nproc=4 steps=64 eval_every=8 slow=1:2 repeat=3 out='' hosts=0 rate='' data=''
modes="ddp=--dp-mode ddp;local-h8=--dp-mode local --sync-every 8;gossip-ring=--dp-mode gossip --gossip-topology ring;ps-k4-s4=--dp-mode ps --ps-servers 4 --staleness 4"
extra=()
die() {
    echo "async-eval: error: $*" >&2
    exit 1
}
while (($#)); do
    case $1 in
    --dtrain) dtrain=$2 && shift 2 ;;
    --data) data=$2 && shift 2 ;;
    --nproc) nproc=$2 && shift 2 ;;
    --steps) steps=$2 && shift 2 ;;
    --eval-every) eval_every=$2 && shift 2 ;;
    --slow) slow=$2 && shift 2 ;;
    --repeat) repeat=$2 && shift 2 ;;
    --modes) modes=$2 && shift 2 ;;
    --out) out=$2 && shift 2 ;;
    --hosts) hosts=$2 && shift 2 ;;
    --rate) rate=$2 && shift 2 ;;
    --) shift && extra=("$@") && break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ -x $dtrain ]] || die "no dtrain binary at $dtrain (make build, or --dtrain PATH)"
[[ $slow == none || $slow =~ ^[0-9]+:[0-9.]+$ ]] || die "--slow $slow: expected RANK:FACTOR or none"
if [[ -z $data ]]; then
    data=$root/../shared/data/tinyshakespeare.txt
    [[ -f $data ]] || data=$root/README.md
fi
[[ -f $data ]] || die "--data $data: no such file"
if ! [[ $hosts =~ ^[0-9]+$ ]] || ((hosts > 0 && nproc % hosts != 0)); then
    die "--hosts $hosts: must divide --nproc $nproc"
fi
keep=1
if [[ -z $out ]]; then
    out=$(mktemp -d)
    keep=0
fi
mkdir -p "$out"
cluster=$root/scripts/netns-cluster.sh
export DT_NETNS_PREFIX=${DT_NETNS_PREFIX:-dae$$}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    ((hosts == 0)) || "$cluster" down "$hosts" >/dev/null 2>&1 || true
    ((keep)) || rm -rf "$out"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if ((hosts > 0)); then
    "$cluster" up "$hosts" ${rate:+--rate "$rate"} >/dev/null || die "cannot bring up $hosts namespaces"
fi

# The model and schedule of every run: a constant learning rate after the
# warm-up, so a run of 2N steps passes through the same schedule as DDP's
# N; plain SGD, which is what the parameter server steps.
common=(--data "$data" --model tiny --layers 4 --dim 128 --heads 4 --seq 64 --global-batch 32
    --optimizer sgd --momentum 0 --weight-decay 0 --lr 0.3 --warmup 10 --schedule constant
    --threads 1 --peak-flops 1e9 --sample-tokens 0
    --progress plain --val-split 0.05 --eval-every "$eval_every" --eval-batches 4 --seed 1337)

IFS=';' read -r -a entries <<<"$modes"
run() { # NAME FLAGS STEPS REP
    local dir=$out/$1.$4
    rm -rf "$dir"
    local env=()
    [[ $slow == none ]] || env=(DT_FAULT_SLOW="$slow")
    if ((hosts == 0)); then
        # shellcheck disable=SC2086 # FLAGS is a list of words
        env "${env[@]}" "$dtrain" train "${common[@]}" $2 --steps "$3" --nproc "$nproc" \
            --run-dir "$dir" "${extra[@]}" >"$dir.log" 2>&1 || {
            tail -n 5 "$dir.log" >&2
            die "dtrain train $2 failed (log $dir.log)"
        }
        return
    fi
    # One launcher per host, every rank told the run directory (one file
    # system: rank 0 writes the metrics, every rank its checkpoint shards).
    local i pids=() rc=0 port=$((20000 + RANDOM % 20000))
    for ((i = hosts - 1; i >= 0; i--)); do
        # shellcheck disable=SC2086 # FLAGS is a list of words
        ip netns exec "$DT_NETNS_PREFIX-$i" env "${env[@]}" "$dtrain" launch --nnodes "$hosts" \
            --node-rank "$i" --master "10.77.0.1:$port" -n $((nproc / hosts)) -- "$dtrain" train \
            "${common[@]}" $2 --steps "$3" --run-dir "$dir" "${extra[@]}" >"$dir.$i.log" 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || rc=$?; done
    ((rc == 0)) || {
        tail -n 5 "$dir".*.log >&2
        die "dtrain train $2 failed on the namespaces (logs $dir.*.log)"
    }
}
where="one machine (shared memory)"
((hosts == 0)) || where="$hosts hosts x $((nproc / hosts)) ranks on network namespaces (TCP), links ${rate:-unshaped}"
echo "async-eval: $where; $nproc ranks, DT_FAULT_SLOW=$slow, DDP target at step $steps, $repeat run(s) per mode, $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))" >&2
for ((rep = 1; rep <= repeat; rep++)); do
    for e in "${entries[@]}"; do
        name=${e%%=*} flags=${e#*=}
        [[ $name == ddp ]] && n=$steps || n=$((2 * steps))
        echo "  run $rep/$repeat: $name ($n steps)" >&2
        run "$name" "$flags" "$n" "$rep"
    done
done

/usr/bin/python3 - "$out" "$steps" "$repeat" "$nproc" "${entries[@]}" <<'EOF'
import json, statistics, sys
out, steps, repeat, nproc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = [e.split("=", 1)[0] for e in sys.argv[5:]]

def load(name, rep):
    rows = [json.loads(l) for l in open(f"{out}/{name}.{rep}/metrics.jsonl")]
    return {r["step"]: r for r in rows}

runs = {n: [load(n, r) for r in range(1, repeat + 1)] for n in names}
target = statistics.median(m[steps]["val_loss"] for m in runs["ddp"])

# Wall-clock: elapsed_s, taken after each step's evaluation. Evaluations
# are meetings of every rank, where one that ran ahead (the parameter
# server's fast workers) waits for the straggler: summing step_ms, which
# leaves them out, would hide that wait.
def summary(m):
    reached, at = None, None
    for s in sorted(m):
        v = m[s]["val_loss"]
        if reached is None and v is not None and v <= target:
            reached, at = m[s]["elapsed_s"], s
    total = max(r["elapsed_s"] for r in m.values())
    samples = 32 * len(m)
    return dict(time=reached, at=at, sps=samples / total,
                comm=sum(r["comm_ms"] or 0 for r in m.values()) / samples,
                bytes=statistics.mean(r["bytes_sent"] for r in m.values()),
                final=m[steps]["val_loss"])

rows = {n: [summary(m) for m in runs[n]] for n in names}
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
ddp_t = med(r["time"] for r in rows["ddp"])
print(f"target: DDP's validation loss at step {steps}: {target:.4f} ({nproc} ranks)")
print(f"{'mode':<14} {'to target s':>11} {'speed-up':>8} {'samples/s':>9} {'comm ms/sample':>14} {'bytes/step':>11} "
      f"{'loss@' + str(steps):>9} {'vs ddp':>7} {'step':>5}")
ddp_final = med(r["final"] for r in rows["ddp"])
for n in names:
    rs = rows[n]
    t = med(r["time"] for r in rs)
    reached = sum(r["time"] is not None for r in rs)
    ts = f"{t:.1f}" if t is not None else "not reached"
    if t is not None and reached < len(rs):
        ts += f" ({reached}/{len(rs)})"
    sp = f"{ddp_t / t:.2f}x" if t else "-"
    final = med(r["final"] for r in rs)
    at = med(r["at"] for r in rs)
    print(f"{n:<14} {ts:>11} {sp:>8} {med(r['sps'] for r in rs):>9.1f} {med(r['comm'] for r in rs):>14.2f} "
          f"{med(r['bytes'] for r in rs) / 2**20:>9.2f}Mi {final:>9.4f} "
          f"{100 * (final - ddp_final) / ddp_final:>+6.1f}% {at if at else '-':>5}")
EOF
