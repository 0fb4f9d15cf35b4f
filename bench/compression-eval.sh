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
#   --codecs LIST    comma- or space-separated codec entries (default: all
#                    nine, and topk:0.01@20~40, powersgd:4+d30000); an entry
#                    is SPEC[@N[~R][/v]][+dD], SPEC a --compress spec (auto
#                    with its candidates joined by _: auto:none_fp16_int8):
#                      @N   dense warm-up, --compress-start N
#                      ~R   top-k density ramp, --compress-ramp R (alone: @0~R)
#                      /v   freeze AdamW's v after the warm-up (--compress-freeze-v)
#                      +dD  tensors below D values exact, --compress-dense-below D
#                    e.g. topk:0.01@20~40, topk:0.01@40~80/v, powersgd:4+d30000.
#                    Whole-run time: warm-up steps at none's step time, the
#                    ramp's steps as timed in a run of their own, the rest at
#                    the codec's step time (docs/compress.md, "Evaluation")
#   --rates LIST     link rates for tc (default: 100mbit,1gbit; "unshaped": no tc)
#   --delay D        one-way delay per host link (default 0.5ms; needs sch_netem)
#   --steps N        timed steps per shaped run (default 20)
#   --skip N         steps left out of the step-time median (default 5)
#   --quality-steps Q  steps of the run whose validation loss the table shows,
#                    run once per codec without shaping (default 200; 0: the
#                    loss after the timed --steps run). The timed runs use the
#                    same Q-step schedule and stop after --steps.
#   --model P        preset (default shakespeare-char); --batch B (4) --seq T (64)
#   --threads K      threads per rank (default 1: two ranks share two cores)
#   --repeat R       run every codec R times, round robin (default 1); the
#                    table shows the median of the R runs' medians and of
#                    the in-round speed-ups
#   --out DIR        keep logs and metrics here (default: a temporary directory)
#   --append         add to the results already in --out (the table shows
#                    all of them): a long evaluation in pieces, e.g. one
#                    --codecs/--rates piece at a time, then --rates "" for
#                    the quality runs alone
#   --skip-quality   no quality runs in this invocation (another piece does them)
#   -- ARGS          more `dtrain train` flags, the same for every run
#
# --compress auto chooses its codecs from the link it measures, so its
# losses depend on the link: an auto entry gets its quality run on each
# timed link (Q steps there, after the timed runs of that link) and is left
# out of the shaped-versus-unshaped loss check.
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
# The nine codecs, and top-k and PowerSGD as recommended for 200 steps
# (docs/compress.md, "Quality of the biased codecs"): within 3% of none.
codecs="none fp16 bf16 int8 qsgd:4 sign topk:0.01 randk:0.01 powersgd:4 topk:0.01@20~40 powersgd:4+d30000"
rates="100mbit 1gbit"
delay=0.5ms
steps=20
skip=5
quality=200
model=shakespeare-char
batch=4
seq=64
threads=1
repeat=1
out=""
append=0
skip_quality=0
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
    --quality-steps) quality=${2:?}; shift 2 ;;
    --model) model=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --seq) seq=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --append) append=1; shift ;;
    --skip-quality) skip_quality=1; shift ;;
    -h | --help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [[ -z $data ]] || die "more than one data file: '$data' and '$1'"; data=$1; shift ;;
    esac
done
for v in steps skip batch seq threads repeat quality; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v/quality/quality-steps} must be a whole number, got '${!v}'"
done
((repeat >= 1)) || die "--repeat must be at least 1"
((steps > skip)) || die "--steps $steps must be larger than --skip $skip"
((quality == 0 || quality >= steps)) ||
    die "--quality-steps $quality must be 0 or at least --steps $steps"
# The schedule (warm-up, cosine decay) spans the quality run, and the timed
# runs follow it for their first --steps steps: same losses, step for step.
total=$((quality > 0 ? quality : steps))
warmup=$((total / 3 < 10 ? total / 3 : 10)) # learning-rate warm-up steps
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
# parse_entry ENTRY: split a codec entry SPEC[@N[~R][/v]][+dD] into e_spec,
# e_start (N), e_ramp (R), e_v (1 with /v), e_dense (D) and e_key, the
# spec of its timed run (SPEC[+dD]: the warm-up and ramp do not change the
# compressed step). Dies with the entry and the expected form when it does
# not parse.
entry_re='^([^@+~/]+)(@([0-9]+)(~([0-9]+))?(/v)?)?(\+d([0-9]+))?$'
parse_entry() {
    [[ $1 =~ $entry_re ]] ||
        die "codec entry '$1': write SPEC[@N[~R][/v]][+dD], N R D whole numbers (e.g. topk:0.01@20~40, powersgd:4+d30000)"
    e_spec=${BASH_REMATCH[1]}
    [[ $e_spec != auto* ]] || e_spec=${e_spec//_/,} # the candidates of auto:a_b_c
    e_start=$((10#${BASH_REMATCH[3]:-0}))
    e_ramp=$((10#${BASH_REMATCH[5]:-0}))
    e_v=$([[ -n ${BASH_REMATCH[6]} ]] && echo 1 || echo 0)
    e_dense=$((10#${BASH_REMATCH[8]:-0}))
    e_key=$e_spec
    ((e_dense == 0)) || e_key+=+d$e_dense
}
# entry_flags ENTRY: the `dtrain train` flags of a codec entry's quality
# run, one word per flag.
entry_flags() {
    parse_entry "$1"
    echo "--compress $e_spec"
    ((e_start == 0)) || echo "--compress-start $e_start"
    ((e_ramp == 0)) || echo "--compress-ramp $e_ramp"
    ((e_v == 0)) || echo "--compress-freeze-v"
    ((e_dense == 0)) || echo "--compress-dense-below $e_dense"
}
# dense_flags KEY: the --compress-dense-below of a timed run's key.
dense_flags() {
    parse_entry "$1"
    ((e_dense == 0)) || echo "--compress-dense-below $e_dense"
}
# The ramp runs (below) start the ramp after min(N, --skip) dense steps.
ramp_start() { echo $(($1 < skip ? $1 : skip)); }
for c in $codecs; do
    # Validate every entry before any namespace exists: a good one gets as
    # far as the missing --data.
    parse_entry "$c"
    if ((e_start > 0 || e_ramp > 0)); then
        ((quality > 0)) || die "codec '$c': a warm-up or ramp needs --quality-steps > 0"
        ((e_start + e_ramp < quality)) ||
            die "codec '$c': warm-up $e_start + ramp $e_ramp must be below --quality-steps $quality"
    fi
    # shellcheck disable=SC2046 # one word per flag
    msg=$("$dtrain" train $(entry_flags "$c") --data /nonexistent/compeval-check.txt 2>&1 || true)
    [[ $msg == *"/nonexistent/compeval-check.txt"* ]] || die "codec '$c': $(echo "$msg" | head -n 1)"
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
quality_tsv=$out/quality.tsv
ramp_tsv=$out/ramp.tsv
if ((append)); then
    [[ -n $keep_out && $keep_out == 1 ]] || die "--append needs --out DIR"
    touch "$results" "$quality_tsv" "$ramp_tsv"
else
    : >"$results"
    : >"$quality_tsv"
    : >"$ramp_tsv"
fi

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
echo "compression-eval: 2 hosts x 1 rank, model $model, batch $batch, seq $seq, AdamW lr 1e-3" \
    "warm-up $warmup, cosine over $total steps, threads $threads, data $(basename "$data")"
if ((quality > 0)); then
    echo "compression-eval: timed: the first $steps steps per link rate; quality: $quality steps unshaped"
else
    echo "compression-eval: $steps steps per codec and link rate (quality: the loss after them)"
fi
echo "compression-eval: $delay_note"
echo "compression-eval: logs and metrics in $out$( ((keep_out)) || echo ' (removed at exit; keep with --out)')"

# run_pair DIR PORT ARGS...: one 2-host job (rank 0 writes DIR/metrics.jsonl);
# non-zero when a launcher failed, after printing their last lines.
# Runs of earlier pieces (--append) keep their ports' numbers apart.
run=$(cat "$results" "$quality_tsv" "$ramp_tsv" | wc -l)
run_pair() {
    local dir=$1 port=$2 rc0=0 rc1=0 p0 p1
    shift 2
    mkdir -p "$dir"
    # Both ranks get the run directory (one file system): a rank without
    # one would wait for rank 0 to name it.
    ip netns exec "$P-1" "$dtrain" launch --nnodes 2 --node-rank 1 \
        --master "10.77.0.1:$port" -n 1 -- "$dtrain" "$@" --run-dir "$dir" \
        >"$dir/node1.log" 2>&1 &
    p1=$!
    ip netns exec "$P-0" "$dtrain" launch --nnodes 2 --node-rank 0 \
        --master "10.77.0.1:$port" -n 1 -- "$dtrain" "$@" --run-dir "$dir" \
        >"$dir/node0.log" 2>&1 &
    p0=$!
    pids=("$p0" "$p1")
    wait "$p0" || rc0=$?
    wait "$p1" || rc1=$?
    pids=()
    if ((rc0 != 0 || rc1 != 0)); then
        echo "compression-eval: $dir failed (exit codes $rc0, $rc1); last lines:" >&2
        tail -n 5 "$dir/node0.log" "$dir/node1.log" | sed 's/^/    /' >&2
        return 1
    fi
}
common=(train --model "$model" --data "$data" --batch "$batch" --seq "$seq" --steps "$total"
    --threads "$threads" --seed 1337 --lr 1e-3 --warmup "$warmup" --eval-batches 16
    --sample-tokens 0 --progress plain --log-every "$total")

# Timed runs: shaped links, the codec from step 1 (a warm-up's dense steps
# are none's steps: the table charges them at none's step time), stopped
# after --steps steps of the quality run's schedule.
stop=()
((quality == 0)) || stop=(--stop-after "$steps")
# One timed run per key SPEC[+dD]: SPEC, SPEC@N, SPEC@N~R/v ... share it.
specs=""
ramps=""
for entry in $codecs; do
    parse_entry "$entry"
    [[ " $specs " == *" $e_key "* ]] || specs+=" $e_key"
    ((e_ramp == 0)) || [[ " $ramps " == *" $entry "* ]] || ramps+=" $entry"
done
# time_run DIR PORT ARGS...: run_pair, then the seconds it took in $secs.
time_run() {
    local t0
    t0=$(date +%s%N)
    run_pair "$@" || return 1
    secs=$((($(date +%s%N) - t0) / 1000000))
}
for rate in $rates; do
    shape=(--rate "$rate")
    [[ $rate != unshaped ]] || shape=()
    "$cluster" up 2 "${shape[@]}" ${use_delay:+--delay "$use_delay"} >/dev/null
    for ((rep = 1; rep <= repeat; rep++)); do for entry in $specs; do
        run=$((run + 1))
        dir=$out/$rate/${entry//[:+]/-}
        ((repeat == 1)) || dir+=/run$rep
        parse_entry "$entry"
        # A fresh port per run: the previous job's sockets may linger.
        # shellcheck disable=SC2046 # one word per flag
        if ! time_run "$dir" $((29500 + 2 * run)) "${common[@]}" "${stop[@]}" \
            --compress "$e_spec" $(dense_flags "$entry") "${extra[@]}"; then
            printf '%s\t%s\tfailed\n' "$rate" "$entry" >>"$results"
            continue
        fi
        python3 - "$dir/metrics.jsonl" "$skip" "$rate" "$entry" "$secs" >>"$results" <<'EOF'
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
        tail -n 1 "$results" | awk -F'\t' '{printf "compression-eval: %-8s %-18s step %8.1f ms  (%s s)\n", $1, $2, $4, $11}'
    done; done
    # Ramp runs, one per entry with a ramp ~R: the ramp's R steps on this
    # link, after S = min(N, --skip) dense steps (so the first, slower
    # steps of a run are not among them; with N <= --skip this is the
    # entry's own schedule), stopped after S + R steps. The table charges
    # the sum of their step_ms for the ramp.
    for ((rep = 1; rep <= repeat; rep++)); do for entry in $ramps; do
        run=$((run + 1))
        parse_entry "$entry"
        s0=$(ramp_start "$e_start")
        dir=$out/$rate/ramp-${entry//[:@~\/+]/-}
        ((repeat == 1)) || dir+=/run$rep
        freeze=()
        ((e_v == 0 || s0 == 0)) || freeze=(--compress-freeze-v)
        # shellcheck disable=SC2046 # one word per flag
        if ! time_run "$dir" $((29500 + 2 * run)) "${common[@]}" --stop-after $((s0 + e_ramp)) \
            --compress "$e_spec" --compress-start "$s0" --compress-ramp "$e_ramp" "${freeze[@]}" \
            $(dense_flags "$entry") "${extra[@]}"; then
            printf '%s\t%s\tfailed\n' "$rate" "$entry" >>"$ramp_tsv"
            continue
        fi
        python3 - "$dir/metrics.jsonl" "$s0" "$e_ramp" "$rate" "$entry" "$secs" >>"$ramp_tsv" <<'EOF'
import json, sys
path, s0, ramp, rate, entry, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]) / 1000
rows = [json.loads(l) for l in open(path)]
rs = [r for r in rows if s0 < r["step"] <= s0 + ramp]
assert len(rs) == ramp, f"{path}: {len(rs)} ramp steps, expected {ramp}"
print("\t".join(map(str, [rate, entry, "ok", sum(r["step_ms"] for r in rs),
                          sum(r["bytes_sent"] for r in rs), s0, round(secs, 1)])))
EOF
        tail -n 1 "$ramp_tsv" | awk -F'\t' '{printf "compression-eval: %-8s %-18s ramp steps %d.. sum %8.1f ms  (%s s)\n", $1, $2, $6 + 1, $4, $7}'
    done; done
    # Adaptive entries: the whole schedule on this link (their choices, and
    # so their losses, follow the link), as "ENTRY@RATE" quality rows.
    for entry in $codecs; do
        [[ $entry == auto* ]] && ((quality > 0 && !skip_quality)) || continue
        run=$((run + 1))
        dir=$out/quality-$rate/${entry//[:@~\/+]/-}
        # shellcheck disable=SC2046 # one word per flag
        if ! time_run "$dir" $((29500 + 2 * run)) "${common[@]}" $(entry_flags "$entry") \
            "${extra[@]}"; then
            printf '%s\tfailed\n' "$entry@$rate" >>"$quality_tsv"
            continue
        fi
        python3 - "$dir/metrics.jsonl" "$entry@$rate" "$secs" >>"$quality_tsv" <<'EOF2'
import json, sys
path, codec, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]) / 1000
rows = [json.loads(l) for l in open(path)]
val = rows[-1]["val_loss"]
print("\t".join(map(str, [codec, "ok", val if val is not None else "nan", rows[-1]["step"], 0,
                          round(secs, 1)])))
EOF2
        tail -n 1 "$quality_tsv" | awk -F'\t' '{printf "compression-eval: quality  %-18s val %s after %s steps  (%s s)\n", $1, $3, $4, $6}'
    done
    "$cluster" down 2 >/dev/null
done

# Quality runs: the whole schedule, no shaping (training is deterministic:
# the loss does not depend on the link; the check below compares).
if ((quality > 0 && !skip_quality)); then
    "$cluster" up 2 >/dev/null
    for entry in $codecs; do
        [[ $entry != auto* ]] || continue # on each timed link instead (above)
        run=$((run + 1))
        parse_entry "$entry"
        dir=$out/quality/${entry//[:@~\/+]/-}
        # shellcheck disable=SC2046 # one word per flag
        if ! time_run "$dir" $((29500 + 2 * run)) "${common[@]}" $(entry_flags "$entry") \
            "${extra[@]}"; then
            printf '%s\tfailed\n' "$entry" >>"$quality_tsv"
            continue
        fi
        python3 - "$dir/metrics.jsonl" "$entry" "$e_start" "$secs" >>"$quality_tsv" <<'EOF'
import json, sys
path, codec, start, secs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) / 1000
rows = [json.loads(l) for l in open(path)]
val = rows[-1]["val_loss"]
print("\t".join(map(str, [codec, "ok", val if val is not None else "nan", rows[-1]["step"], start,
                          round(secs, 1)])))
EOF
        tail -n 1 "$quality_tsv" | awk -F'\t' '{printf "compression-eval: quality  %-18s val %s after %s steps  (%s s)\n", $1, $3, $4, $6}'
    done
    "$cluster" down 2 >/dev/null
fi

python3 - "$results" "$quality_tsv" "$ramp_tsv" "$out" "$steps" "$skip" "$repeat" "$quality" <<'EOF'
import json, os, re, statistics, sys
path, qpath, rpath, out = sys.argv[1:5]
steps, skip, repeat, quality = (int(x) for x in sys.argv[5:9])
# A codec entry SPEC[@N[~R][/v]][+dD] (the script's parse_entry).
ENTRY = re.compile(r"^([^@+~/]+)(@([0-9]+)(~([0-9]+))?(/v)?)?(\+d([0-9]+))?$")
def parse(entry):
    m = ENTRY.match(entry)
    key = m[1] + (f"+d{int(m[8])}" if m[8] and int(m[8]) else "")
    return {"key": key, "start": int(m[3] or 0), "ramp": int(m[5] or 0), "v": bool(m[6])}
runs = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
qual = {}  # entry -> its quality run; later pieces win
auto_q = {}  # (link, auto entry) -> the val loss of its run on that link
for l in open(qpath):
    f = l.rstrip("\n").split("\t")
    v = float(f[2]) if f[1] == "ok" else float("nan")
    if f[0].startswith("auto"):
        e, _, link = f[0].rpartition("@")
        auto_q[(link, e)] = v
        continue
    qual[f[0]] = dict(parse(f[0]), val=v)
ramps = {}  # (link, entry) -> its ramp runs: [ok, sum step_ms, bytes, S]
for l in open(rpath):
    f = l.rstrip("\n").split("\t")
    ramps.setdefault((f[0], f[1]), []).append(f[2:])
# One row per (link, timed key): the median of its runs' figures (a failed
# run fails the row).
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
def val_of(r, entry):
    if not quality:
        return float(r[8])
    if entry.startswith("auto"):
        return auto_q.get((r[0], entry), float("nan"))
    q = qual.get(entry)
    return q["val"] if q else float("nan")
# Table rows: every timed (link, key) row once per quality entry of that
# key (SPEC, SPEC@N~R, ...), or once if it has none.
by_key = {}
for e in qual:
    by_key.setdefault(qual[e]["key"], []).append(e)
table = [(r, e) for r in rows for e in (by_key.get(r[1]) if quality and r[1] in by_key else [r[1]])]
def slug(entry):
    return re.sub(r"[:@~/+]", "-", entry)
def losses(p):
    return {j["step"]: j["loss"] for j in map(json.loads, open(p))}
def subdirs(d):
    return [d] if repeat == 1 else [os.path.join(d, f"run{i}") for i in range(1, repeat + 1)]

# Determinism check: a shaped run and the unshaped quality run of the same
# flags must give the same training losses over the shaped run's steps.
# Checked for every timed run whose key is an entry of its own (no warm-up
# or ramp: otherwise the timed run compresses from step 1 and the quality
# run does not), and for every ramp run that follows its entry's schedule
# (warm-up N <= --skip).
checked, bad = [], []
def check(label, run_dir, entry):
    qp = os.path.join(out, "quality", slug(entry), "metrics.jsonl")
    if not os.path.exists(qp):
        return
    ql = losses(qp)
    for sub in subdirs(run_dir):
        if not os.path.exists(os.path.join(sub, "metrics.jsonl")):
            continue
        tl = losses(os.path.join(sub, "metrics.jsonl"))
        diff = [s for s in sorted(tl) if tl[s] != ql.get(s)]
        if diff:
            bad.append(f"{label} step {diff[0]}: {tl[diff[0]]} vs {ql.get(diff[0])}")
        else:
            checked.append(label)
            break
if quality:
    for (rate, entry), rs in by.items():
        q = qual.get(entry)
        if q and q["start"] == 0 and q["ramp"] == 0 and all(r[2] == "ok" for r in rs):
            check(f"{rate}/{entry}", os.path.join(out, rate, slug(entry)), entry)
    for (rate, entry), rs in ramps.items():
        q = qual.get(entry)
        if q and all(r[0] == "ok" for r in rs) and int(rs[0][3]) == q["start"]:
            check(f"{rate}/{entry}(ramp)", os.path.join(out, rate, "ramp-" + slug(entry)), entry)

total = quality or steps
print()
print(f"step ms: median over steps {skip + 1}..{steps} of rank 0's step_ms on the shaped link", end="")
print(f", then the median of {repeat} runs" if repeat > 1 else "", end="")
print("; MB/step: what rank 0 sent per compressed step")
if repeat > 1:
    print("speed-up: the median over the rounds of none's step time over the codec's in that round")
if quality:
    print(f"run s: {total} steps at this link = N warm-up steps (@N) x none's step ms + the R ramp"
          f" steps (~R) as timed in their own run + the rest x step ms; val loss: after {total}"
          " steps, from the unshaped run")
else:
    print(f"run s: {total} steps x step ms; val loss: after the {total} timed steps")
hdr = ("link", "codec", "step ms", "compute", "exposed", "MB/step", "speed-up", "run s", "run x",
       "val loss", "val vs none")
fmt = "{:<8} {:<20} {:>9} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>9} {:>11}"
print(fmt.format(*hdr))
notes = []
for r, entry in table:
    if r[2] != "ok":
        print(fmt.format(r[0], entry, "failed", *[""] * 8))
        continue
    step, comp, exp, byts = float(r[3]), float(r[4]), float(r[5]), float(r[7])
    val = val_of(r, entry)
    n = none.get(r[0])
    su = speedup(r)
    q = qual.get(entry, {"start": 0, "ramp": 0})
    start, ramp = q["start"], q["ramp"]
    ramp_s = 0.0
    if ramp:
        rr = ramps.get((r[0], entry), [])
        if rr and all(x[0] == "ok" for x in rr):
            ramp_s = statistics.median(float(x[1]) for x in rr) / 1e3
            mb = statistics.median(float(x[2]) for x in rr) / 1e6
            notes.append(f"{r[0]} {entry}: the {ramp} ramp steps {ramp_s:.3f} s, {mb:.1f} MB"
                         f" (steps {int(rr[0][3]) + 1}..{int(rr[0][3]) + ramp} of their run)")
        else:
            ramp_s = float("nan")
    rest = (total - start - ramp) * step / 1e3 + ramp_s
    if n:
        run_s = start * float(n[3]) / 1e3 + rest
        run_x = f"{total * float(n[3]) / 1e3 / run_s:.2f}x"
        nv = val_of(n, "none")
        dv = f"{100 * (val / nv - 1):+.2f}%"
    else:
        run_s, run_x, dv = rest if start == 0 else float("nan"), "-", "-"
    print(fmt.format(r[0], entry, f"{step:.1f}", f"{comp:.1f}", f"{exp:.1f}", f"{byts / 1e6:.3f}",
                     f"{su:.2f}x" if su else "-", f"{run_s:.1f}", run_x, f"{val:.4f}", dv))
for line in notes:
    print("ramp:", line)
# What the adaptive entries chose: the most frequent choice over the timed
# steps of each link, and the link estimate of the last step.
for (rate, entry), rs in by.items():
    if not entry.startswith("auto"):
        continue
    for sub in subdirs(os.path.join(out, rate, slug(entry))):
        p = os.path.join(sub, "metrics.jsonl")
        if not os.path.exists(p):
            continue
        ms = [json.loads(l) for l in open(p)]
        ch = [m.get("codecs") for m in ms if m["step"] > skip and m.get("codecs")]
        if ch:
            top = max(set(ch), key=ch.count)
            print(f"{entry} on {rate}: {top} in {ch.count(top)} of {len(ch)} timed steps, "
                  f"link estimate {ms[-1].get('link_MBps') or 0:.1f} MB/s")
        break
if quality:
    print()
    if checked:
        print(f"loss check: shaped and unshaped runs agree bit for bit over steps 1..{steps}"
              " (a ramp run: over its S + R steps):",
              " ".join(checked))
    if bad:
        print("loss check: MISMATCH between shaped and unshaped runs:", "; ".join(bad))
        sys.exit(3)
EOF
echo
echo "compression-eval: total $(($(date +%s) - start_all)) s (machine may be shared: compare rows of one run only)"
if grep -q $'\tfailed' "$results" "$quality_tsv"; then exit 1; fi
