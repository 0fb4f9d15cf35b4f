#!/usr/bin/env bash
# bench/trace-overhead.sh [DTRAIN] [ROUNDS] [CONFIGS] — what `dtrain train
# --trace` costs: for each configuration the same training with tracing
# off and on, in turn (off on off on ...), ROUNDS times, 2 ranks x 1 thread.
# Per run the median step time of steps 3..S (metrics.jsonl); printed per
# configuration: the median over the rounds of each, the events recorded per
# step and rank, and the overhead (on / off - 1). Target (issue 21): <= 3%.
#
# CONFIGS is a space-separated list of MODEL:LAYERS:DIM:B:T:STEPS (default
# "tiny:2:64:4:64:60 shakespeare-char:4:128:8:128:30": a step of a few ms,
# where the per-event cost weighs most, and the demo's model). Run it alone
# on the machine (/work/tools/cpu-exclusive or a quiet box).
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
configs=${3:-"tiny:2:64:4:64:60 shakespeare-char:4:128:8:128:30"}
source "$(dirname "$0")/train_lib.sh"

# step NAME: the median step_ms of steps 3.. of run NAME
step() {
    /usr/bin/env python3 - "$work/$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(statistics.median(r["step_ms"] for r in rows))
PY
}
# events NAME STEPS: trace events per step and rank
events() {
    /usr/bin/env python3 - "$work/$1/trace/trace.json" "$2" <<'PY'
import sys
n = sum(1 for l in open(sys.argv[1]) if '"ph":"X"' in l)
print(round(n / int(sys.argv[2]) / 2))
PY
}

printf '# trace overhead: %s, %s round(s), 2 ranks x 1 thread; %s\n' "$dtrain" "$rounds" \
    "$(lscpu | sed -n 's/^Model name: *//p')"
printf '# %-30s %12s %12s %10s %14s\n' config "off ms/step" "on ms/step" overhead "events/step"
for cfg in $configs; do
    IFS=: read -r model layers dim b t steps <<<"$cfg"
    args=(--model "$model" --layers "$layers" --dim "$dim" --heads $((dim / 32)) --batch "$b"
          --seq "$t" --steps "$steps" --nproc 2)
    off=() on=()
    for ((r = 0; r < rounds; r++)); do
        train_run off "${args[@]}"
        off+=("$(step off)")
        train_run on "${args[@]}" --trace
        on+=("$(step on)")
    done
    o=$(med "${off[*]}") n=$(med "${on[*]}")
    printf '  %-30s %12.3f %12.3f %9.2f%% %14s\n' "$cfg" "$o" "$n" \
        "$(awk -v a="$o" -v b="$n" 'BEGIN { print 100 * (b / a - 1) }')" "$(events on "$steps")"
    echo "#   off: ${off[*]}"
    echo "#   on:  ${on[*]}"
done
