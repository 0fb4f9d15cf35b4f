#!/usr/bin/env bash
# bench/compression-eval.sh — gradient compression on a bandwidth-limited
# link: 2 hosts (network namespaces, scripts/netns-cluster.sh) x 1 rank train
# the same GPT for the same steps once per codec and link rate; prints step
# time, bytes per step, speed-up over `none` and the final validation loss.
#
#   bench/compression-eval.sh [OPTIONS] [DATA.txt]
#
#   --dtrain PATH    the dtrain binary (default: BUILD/dtrain, built if missing)
#   --build DIR      build directory (default: build)
#   --codecs LIST    comma- or space-separated codec specs (default: all nine)
#   --rates LIST     link rates for tc (default: 100mbit,1gbit; "unshaped": no tc)
#   --delay D        one-way delay per host link (default 0.5ms; needs sch_netem)
#   --steps N        optimizer steps per run (default 30)
#   --skip N         steps left out of the step-time median (default 5)
#   --model P        preset (default shakespeare-char); --batch B (4) --seq T (64)
#   --threads K      threads per rank (default 1: two ranks share two cores)
#   --repeat R       run every codec R times, round robin (default 1); the
#                    table shows the median of the R runs' medians and of
#                    the in-round speed-ups
#   --out DIR        keep logs and metrics here (default: a temporary directory)
#   -- ARGS          more `dtrain train` flags, the same for every run
#
# The same seed, data, model and flags for every codec; only --compress
# changes. DATA defaults to tinyshakespeare.txt from the shared data
# directory next to the repository. Needs root and iproute2. Namespaces and
# processes are removed on exit, also on Ctrl-C. See docs/compress.md,
# section "Evaluation".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Signals exit through the EXIT trap (set once there is something to clean
# up). Trapped from the start: untrapped, bash ignores a SIGINT sent to it
# alone while a foreground child that did not get the signal runs.
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
    echo "compression-eval: error: $*" >&2
    exit 1
}
usage() {
    sed -n '7,/^# The same seed/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit "${1:-2}"
}

dtrain=""
build=$root/build
codecs="none fp16 bf16 int8 qsgd:4 sign topk:0.01 randk:0.01 powersgd:4"
rates="100mbit 1gbit"
delay=0.5ms
steps=30
skip=5
model=shakespeare-char
batch=4
seq=64
threads=1
repeat=1
out=""
data=""
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --dtrain) dtrain=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --codecs) codecs=${2//,/ }; shift 2 ;;
    --rates) rates=${2//,/ }; shift 2 ;;
    --delay) delay=${2?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --skip) skip=${2:?}; shift 2 ;;
    --model) model=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --seq) seq=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h | --help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [[ -z $data ]] || die "more than one data file: '$data' and '$1'"; data=$1; shift ;;
    esac
done
for v in steps skip batch seq threads repeat; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "--$v must be a whole number, got '${!v}'"
done
((repeat >= 1)) || die "--repeat must be at least 1"
((steps > skip)) || die "--steps $steps must be larger than --skip $skip"
warmup=$((steps / 3 < 10 ? steps / 3 : 10)) # learning-rate warm-up steps
[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN)"
command -v ip >/dev/null || die "'ip' (iproute2) not found"
command -v tc >/dev/null || die "'tc' (iproute2) not found"
command -v python3 >/dev/null || die "python3 not found (it reads metrics.jsonl)"

if [[ -z $data ]]; then
    for f in "$root/../shared/data/tinyshakespeare.txt" "$root/../../shared/data/tinyshakespeare.txt"; do
        if [[ -f $f ]]; then
            data=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
            break
        fi
    done
    [[ -n $data ]] || die "no DATA given and no tinyshakespeare.txt in ../shared/data: pass a text file"
fi
[[ -r $data ]] || die "cannot read data file '$data'"
data=$(cd "$(dirname "$data")" && pwd)/$(basename "$data")

if [[ -z $dtrain ]]; then
    dtrain=$build/dtrain
    if [[ ! -x $dtrain ]]; then
        echo "compression-eval: building $dtrain" >&2
        cmake -S "$root" -B "$build" >/dev/null
        cmake --build "$build" -j2 --target dtrain_cli >/dev/null
    fi
fi
[[ -x $dtrain ]] || die "dtrain binary '$dtrain' not found or not executable"
dtrain=$(cd "$(dirname "$dtrain")" && pwd)/$(basename "$dtrain")
for c in $codecs; do
    # Validate every spec before any namespace exists: a good one gets as
    # far as the missing --data.
    msg=$("$dtrain" train --compress "$c" 2>&1 || true)
    [[ $msg == *"--data FILE is required"* ]] || die "codec '$c': $(echo "$msg" | head -n 1)"
done

cluster=$root/scripts/netns-cluster.sh
export DT_NETNS_PREFIX=${DT_NETNS_PREFIX:-dce$$}
P=$DT_NETNS_PREFIX
keep_out=1
if [[ -z $out ]]; then
    out=$(mktemp -d /tmp/dt-compeval-XXXXXX)
    keep_out=0
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
results=$out/results.tsv
: >"$results"

# Cleanup: the launchers we started (by PID; each stops its ranks, which
# also die with it through PR_SET_PDEATHSIG), then the namespaces.
pids=()
cleanup() {
    local rc=$? p i
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for ((i = 0; i < 50; i++)); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    "$cluster" down 2 >/dev/null 2>&1 || true
    ((keep_out)) || rm -rf "$out"
    exit "$rc"
}
trap cleanup EXIT

# Is there any way to delay packets here? netem is the only qdisc that adds
# a fixed delay; ETF/FQ could hold packets until a BPF-set skb->tstamp, but
# are checked too so the message can say what is missing.
delay_note="no delay asked"
use_delay=""
if [[ -n $delay && $delay != 0 && $delay != 0ms ]]; then
    if "$cluster" up 1 --delay "$delay" >/dev/null 2>&1; then
        "$cluster" down 1 >/dev/null
        use_delay=$delay
        delay_note="delay $delay per host link (netem)"
    else
        "$cluster" down 1 >/dev/null 2>&1 || true
        delay_note="delay $delay NOT emulated: this kernel has no sch_netem"
        if [[ -r /proc/config.gz ]] && command -v zcat >/dev/null; then
            etf=$(zcat /proc/config.gz | grep -cE '^CONFIG_NET_SCH_(ETF|FQ)=' || true)
            ((etf)) || delay_note+=" (nor sch_etf/sch_fq for a BPF-timestamped delay)"
        fi
    fi
fi

start_all=$(date +%s)
echo "compression-eval: 2 hosts x 1 rank, model $model, batch $batch, seq $seq, steps $steps," \
    "AdamW lr 1e-3 warm-up $warmup, threads $threads, data $(basename "$data")"
echo "compression-eval: $delay_note"
echo "compression-eval: logs and metrics in $out$( ((keep_out)) || echo ' (removed at exit; keep with --out)')"

run=0
for rate in $rates; do
    shape=(--rate "$rate")
    [[ $rate != unshaped ]] || shape=()
    "$cluster" up 2 "${shape[@]}" ${use_delay:+--delay "$use_delay"} >/dev/null
    for ((rep = 1; rep <= repeat; rep++)); do for codec in $codecs; do
        run=$((run + 1))
        dir=$out/$rate/${codec//:/-}
        ((repeat == 1)) || dir+=/run$rep
        mkdir -p "$dir"
        # A fresh port per run: the previous job's sockets may linger.
        port=$((29500 + 2 * run))
        args=(train --model "$model" --data "$data" --batch "$batch" --seq "$seq"
            --steps "$steps" --threads "$threads" --seed 1337 --lr 1e-3 --warmup "$warmup"
            --eval-batches 16 --sample-tokens 0 --progress plain --log-every "$steps"
            --compress "$codec" "${extra[@]}")
        t0=$(date +%s%N)
        ip netns exec "$P-1" "$dtrain" launch --nnodes 2 --node-rank 1 \
            --master "10.77.0.1:$port" -n 1 -- "$dtrain" "${args[@]}" >"$dir/node1.log" 2>&1 &
        p1=$!
        ip netns exec "$P-0" "$dtrain" launch --nnodes 2 --node-rank 0 \
            --master "10.77.0.1:$port" -n 1 -- "$dtrain" "${args[@]}" --run-dir "$dir" \
            >"$dir/node0.log" 2>&1 &
        p0=$!
        pids=("$p0" "$p1")
        rc0=0 rc1=0
        wait "$p0" || rc0=$?
        wait "$p1" || rc1=$?
        pids=()
        secs=$((($(date +%s%N) - t0) / 1000000))
        if ((rc0 != 0 || rc1 != 0)); then
            echo "compression-eval: $rate $codec failed (exit codes $rc0, $rc1); last lines:" >&2
            tail -n 5 "$dir/node0.log" "$dir/node1.log" | sed 's/^/    /' >&2
            printf '%s\t%s\tfailed\n' "$rate" "$codec" >>"$results"
            continue
        fi
        python3 - "$dir/metrics.jsonl" "$skip" "$rate" "$codec" "$secs" >>"$results" <<'EOF'
import json, statistics, sys
path, skip, rate, codec, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]) / 1000
rows = [json.loads(l) for l in open(path)]
timed = [r for r in rows if r["step"] > skip]
med = lambda k: statistics.median(r[k] for r in timed)
val = rows[-1]["val_loss"]
print("\t".join(map(str, [rate, codec, "ok", med("step_ms"), med("compute_ms"),
                          med("exposed_comm_ms"), med("comm_ms"), med("bytes_sent"),
                          val if val is not None else "nan", rows[-1]["step"], round(secs, 1)])))
EOF
        tail -n 1 "$results" | awk -F'\t' '{printf "compression-eval: %-8s %-11s step %8.1f ms  val %s  (%s s)\n", $1, $2, $4, $9, $11}'
    done; done
    "$cluster" down 2 >/dev/null
done

python3 - "$results" "$steps" "$skip" "$repeat" <<'EOF'
import statistics, sys
path, steps, skip, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runs = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
# One row per (link, codec): the median of its runs' figures (a failed run
# fails the row). The validation loss is the same in every run.
rows, by = [], {}
for r in runs:
    key = (r[0], r[1])
    if key not in by:
        by[key] = []
        rows.append(key)
    by[key].append(r)
def merge(key):
    rs = by[key]
    if any(r[2] != "ok" for r in rs):
        return list(key) + ["failed"]
    med = lambda i: str(statistics.median(float(r[i]) for r in rs))
    return list(key) + ["ok"] + [med(i) for i in range(3, 8)] + [rs[-1][8]]
rows = [merge(k) for k in rows]
none = {r[0]: r for r in rows if r[1] == "none" and r[2] == "ok"}
# Speed-up: none's step time over the codec's within each round (the runs
# closest in time, so slow changes of the machine's load cancel), then the
# median over the rounds.
def speedup(r):
    nr = by.get((r[0], "none"))
    if not nr or any(x[2] != "ok" for x in nr):
        return None
    mine = by[(r[0], r[1])]
    return statistics.median(float(a[3]) / float(b[3]) for a, b in zip(nr, mine))
print()
print(f"step time: median over steps {int(skip) + 1}..{steps} of rank 0's step_ms", end="")
print(f", then the median of {repeat} runs" if repeat > 1 else "", end="")
print("; bytes: what rank 0 sent per step")
if repeat > 1:
    print("speed-up: the median over the rounds of none's step time over the codec's in that round")
hdr = ("link", "codec", "step ms", "compute", "exposed", "MB/step", "speed-up", "val loss", "val vs none")
fmt = "{:<8} {:<11} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>11}"
print(fmt.format(*hdr))
for r in rows:
    if r[2] != "ok":
        print(fmt.format(r[0], r[1], "failed", "", "", "", "", "", ""))
        continue
    step, comp, exp, byts, val = float(r[3]), float(r[4]), float(r[5]), float(r[7]), float(r[8])
    n = none.get(r[0])
    su = speedup(r)
    sp = f"{su:.2f}x" if su else "-"
    dv = f"{100 * (val / float(n[8]) - 1):+.2f}%" if n else "-"
    print(fmt.format(r[0], r[1], f"{step:.1f}", f"{comp:.1f}", f"{exp:.1f}", f"{byts / 1e6:.3f}",
                     sp, f"{val:.4f}", dv))
EOF
echo
echo "compression-eval: total $(($(date +%s) - start_all)) s (machine may be shared: compare rows of one run only)"
if grep -q $'\tfailed' "$results"; then exit 1; fi
