#!/usr/bin/env bash
# bench/planner.sh [DTRAIN] [ROUNDS] — the planner's predictions against
# measured runs on this machine. Measures this machine once (`dtrain plan
# --cluster this --save-cluster`), then for each configuration below runs
# `dtrain train` (default threads: the CPUs shared by the ranks) ROUNDS times
# and prints the median measured step time (metrics.jsonl, steps after the
# third) beside the planner's prediction for the same layout (`dtrain plan
# --dp .. --tp .. --json`), and the measured peak resident memory of rank 0
# (less what the process held before the model) beside the planned total
# (with a split model, plus rank 0's assembly of the whole model at the end).
# Run it under `flock -x /tmp/dtrain-cpu.lock` on a quiet machine.
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
data=$here/../shared/data/tinyshakespeare.txt
[[ -f $data ]] || data=$here/README.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$dtrain" plan --cluster this --save-cluster "$work/this.json" --top 1 > /dev/null
model=(--model shakespeare-char --layers 4 --dim 256 --heads 4 --seq 128)
pmodel=(--model shakespeare-char --layers 4 --dim 256 --heads 4 --seq 128 --vocab 65)
lscpu | sed -n 's/^Model name: *//p' | head -1 | sed 's/^/CPU: /'
printf '%-34s %10s %10s %7s %10s %10s %7s\n' config "meas ms" "pred ms" err "meas MiB" "plan MiB" err
# cfg NAME N MB M DP TP PP ZERO PREC RECOMPUTE SCHED
cfg() {
    local name=$1 n=$2 mb=$3 M=$4 dp=$5 tp=$6 pp=$7 zero=$8 prec=$9 rec=${10} sched=${11}
    local gb=$((dp * mb * M)) times=() mems=()
    local extra=()
    [[ $pp -gt 1 ]] && extra+=(--pp-schedule "$sched")
    for ((r = 0; r < rounds; r++)); do
        rm -rf "$work/run"
        "$dtrain" train --data "$data" "${model[@]}" --nproc "$n" --dp "$dp" --tp "$tp" --pp "$pp" \
            --batch "$mb" --accum "$M" --zero "$zero" --precision "$prec" --recompute "$rec" \
            "${extra[@]}" --steps 12 --sample-tokens 0 --progress plain --val-split 0 \
            --peak-flops 1e9 --run-dir "$work/run" > "$work/log" 2>&1 || {
            echo "$name: dtrain train failed:" >&2; tail -5 "$work/log" >&2; exit 1; }
        times+=("$(python3 -c '
import json, sys, statistics
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1])][3:]
print(statistics.median(ms))' "$work/run/metrics.jsonl")")
        mems+=("$(python3 -c '
import re, sys
log = open(sys.argv[1]).read()
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def size(s):
    v, u = s.split(); return float(v) * unit[u]
m = re.search(r"measured peak resident ([0-9.]+ \w+) of which ([0-9.]+ \w+) before", log)
print((size(m.group(1)) - size(m.group(2))) / 2**20 if m else "nan")' "$work/log")")
    done
    local sched_flag=()
    [[ $pp -gt 1 ]] && sched_flag+=(--pp-schedule "$sched")
    "$dtrain" plan "${pmodel[@]}" --cluster "$work/this.json" --devices "$n" --global-batch "$gb" \
        --dp "$dp" --tp "$tp" --pp "$pp" --micro-batch "$mb" --zero "$zero" --precision "$prec" \
        --recompute "$rec" "${sched_flag[@]}" --json --top 1 > "$work/plan.json"
    python3 - "$name" "$work/plan.json" "${times[*]}" "${mems[*]}" <<'PY'
import json, statistics, sys
name, plan, times, mems = sys.argv[1:]
c = json.load(open(plan))["candidates"]
t = statistics.median(float(x) for x in times.split())
m = statistics.median(float(x) for x in mems.split())
if not c:
    print("%-34s %10.1f %10s" % (name, t, "(no plan)")); sys.exit(0)
p = c[0]["step_s"] * 1e3
# Rank 0's peak comes at the end when the model is split: the plan's
# memory per device plus its assembly of the whole model.
pm = (c[0]["memory_per_device"] + c[0].get("assembly_rank0", 0)) / 2**20
print("%-34s %10.1f %10.1f %+6.1f%% %10.1f %10.1f %+6.1f%%" % (name, t, p, 100 * (p / t - 1), m, pm, 100 * (pm / m - 1)))
PY
}
cfg "1 rank fp32 mb8"                1 8 1 1 1 1 0 fp32 none   1f1b
cfg "1 rank bf16 mb8"                1 8 1 1 1 1 0 bf16 none   1f1b
cfg "1 rank fp32 recompute"          1 8 1 1 1 1 0 fp32 blocks 1f1b
cfg "1 rank fp32 mb4 x2"             1 4 2 1 1 1 0 fp32 none   1f1b
cfg "dp2 fp32"                       2 8 1 2 1 1 0 fp32 none   1f1b
cfg "dp2 bf16"                       2 8 1 2 1 1 0 bf16 none   1f1b
cfg "dp2 zero1"                      2 8 1 2 1 1 1 fp32 none   1f1b
cfg "dp2 zero2 mb4 x2"               2 4 2 2 1 1 2 fp32 none   1f1b
cfg "dp2 zero3"                      2 8 1 2 1 1 3 fp32 none   1f1b
cfg "tp2 fp32"                       2 8 1 1 2 1 0 fp32 none   1f1b
cfg "pp2 1f1b mb2 x4"                2 2 4 1 1 2 0 fp32 none   1f1b
cfg "pp2 zb mb2 x4"                  2 2 4 1 1 2 0 fp32 none   zb
cfg "dp4 fp32 (2 cores)"             4 4 1 4 1 1 0 fp32 none   1f1b
cfg "dp2 x tp2 fp32 (2 cores)"       4 4 1 2 2 1 0 fp32 none   1f1b
