#!/usr/bin/env bash
# bench/tp.sh [DTRAIN] [ROUNDS] [CONFIGS] — tensor parallelism against one
# rank on the same work, in the same run: for each configuration, `dtrain
# train` as 1 rank x 1 thread, as --tp 2 (2 ranks x 1 thread) and as --tp 2
# --sp, in turn (A B C A B C ...), ROUNDS times. Prints per layout the
# median tokens/s of the timed steps, the speed-up over one rank, the
# parameter + optimizer bytes and the activation bytes per rank (from the
# header's memory line) relative to one rank, and the exposed
# tensor-parallel communication per step (median of the metrics).
#
# CONFIGS is a space-separated list of MODEL:B:T (default
# "gpt2-124m:4:64 shakespeare-char:8:256"). The text is
# ../shared/data/tinyshakespeare.txt when present, else README.md;
# gpt2-124m runs with its 50257-token vocabulary over the byte tokenizer.
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
configs=${3:-"gpt2-124m:4:64 shakespeare-char:8:256"}
source "$(dirname "$0")/train_lib.sh"

# run NAME ARGS...: one training run; prints "tokens/s params+opt acts tp_ms"
run() {
    train_run "$@"
    /usr/bin/env python3 - "$work/$1.log" "$work/$1/metrics.jsonl" <<'EOF'
import json, re, statistics, sys
log = open(sys.argv[1]).read()
tps = float(re.search(r"([0-9.]+) tokens/s \(median\)", log).group(1))
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def size(s):
    v, u = s.split()
    return float(v) * unit[u]
m = re.search(r"memory/rank: params ([0-9.]+ \w+), grads [0-9.]+ \w+, optimizer ([0-9.]+ \w+)"
              r".*activations ([0-9.]+ \w+) peak", log)
po = size(m.group(1)) + size(m.group(2))
act = size(m.group(3))
rows = [json.loads(l) for l in open(sys.argv[2])][1:]
tp = [r["tp_comm_ms"] for r in rows if r.get("tp_comm_ms") is not None]
print(tps, po, act, statistics.median(tp) if tp else 0.0)
EOF
}

printf '%-22s %-10s %12s %9s %14s %13s %12s\n' "model B x T" "layout" "tokens/s" "speed-up" \
    "params+opt/rk" "activations" "tp comm ms"
for cfg in $configs; do
    IFS=: read -r model b t <<<"$cfg"
    args=(--model "$model" --batch "$b" --seq "$t" --steps 6 --lr 1e-4)
    [[ $model == gpt2-* ]] && args+=(--tokenizer byte --vocab 50257)
    declare -A tps=() po=() act=() tpc=()
    layouts=("one" "tp2" "tp2-sp")
    for ((r = 0; r < rounds; r++)); do
        for l in "${layouts[@]}"; do
            case $l in
            one) extra=() ;;
            tp2) extra=(--nproc 2 --tp 2) ;;
            tp2-sp) extra=(--nproc 2 --tp 2 --sp) ;;
            esac
            read -r a p c m < <(run "$l" "${args[@]}" "${extra[@]}")
            tps[$l]+="$a "
            po[$l]=$p
            act[$l]=$c
            tpc[$l]+="$m "
        done
    done
    base=$(med "${tps[one]}")
    for l in "${layouts[@]}"; do
        x=$(med "${tps[$l]}")
        printf '%-22s %-10s %12.0f %8.2fx %13.2fx %12.2fx %12.1f\n' "$model $b x $t" "$l" "$x" \
            "$(echo "$x / $base" | bc -l)" "$(echo "${po[$l]} / ${po[one]}" | bc -l)" \
            "$(echo "${act[$l]} / ${act[one]}" | bc -l)" "$(med "${tpc[$l]}")"
    done
    unset tps po act tpc
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $rounds rounds, medians; 1 thread per rank"
