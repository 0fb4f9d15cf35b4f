#!/usr/bin/env bash
# bench/cp.sh [DTRAIN] [ROUNDS] [SEQ] — context parallelism against one rank
# on the same long-sequence work, in the same run: a 4-layer, 256-wide,
# 4-head model, batch 1 of SEQ tokens (default 8192), trained as 1 rank x 1
# thread, as --cp 2 --cp-mode ulysses and as --cp 2 --cp-mode ring (2 ranks
# x 1 thread each), in turn (A B C A B C ...), ROUNDS times (default 3).
# Prints per layout the median tokens/s, the speed-up over one rank, the
# planned activation bytes and the measured peak resident memory per rank
# relative to one rank, and the context-parallel attention time per step
# with the share of it that is exposed communication (medians of the
# metrics).
#
# Then the longest sequence that fits a memory budget (BUDGET_GIB, default
# 8) per rank, for cp 1, 2 and 4 in both modes, from `dtrain plan memory`
# (the trainer's own layout; measured peaks stay within a few percent of
# it, see the table above).
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
seq=${3:-8192}
budget=${BUDGET_GIB:-8}
source "$(dirname "$0")/train_lib.sh"
model=(--model tiny --layers 4 --dim 256 --heads 4)

# run NAME ARGS...: prints "tokens/s activations peak_rss attn_ms exposed_share"
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
act = size(re.search(r"memory/rank: .*activations ([0-9.]+ \w+) peak", log).group(1))
rss = size(re.search(r"measured peak resident ([0-9.]+ \w+)", log).group(1))
rows = [json.loads(l) for l in open(sys.argv[2])][1:]
attn = [r["cp_attention_ms"] for r in rows if r.get("cp_attention_ms") is not None]
comm = [r["tp_comm_ms"] for r in rows if r.get("tp_comm_ms") is not None]
a = statistics.median(attn) if attn else 0.0
c = statistics.median(comm) if comm else 0.0
print(tps, act, rss, a, c / a if a else 0.0)
EOF
}

echo "cp.sh: ${model[*]} --batch 1 --seq $seq, 1 thread per rank, $rounds round(s); $(lscpu | sed -n 's/^Model name: *//p')"
printf '%-12s %10s %9s %13s %13s %12s %9s\n' layout tokens/s speed-up "activations" "peak RSS" \
    "attn ms" exposed
declare -A tps=() act=() rss=() attn=() share=()
layouts=(one cp2-ulysses cp2-ring)
for ((r = 0; r < rounds; r++)); do
    for l in "${layouts[@]}"; do
        case $l in
        one) extra=() ;;
        cp2-ulysses) extra=(--nproc 2 --cp 2 --cp-mode ulysses) ;;
        cp2-ring) extra=(--nproc 2 --cp 2 --cp-mode ring) ;;
        esac
        read -r a b c d e < <(run "$l" "${model[@]}" --batch 1 --seq "$seq" --steps 4 --warmup 1 \
            --lr 1e-4 "${extra[@]}")
        tps[$l]+="$a "
        act[$l]=$b
        rss[$l]=$c
        attn[$l]+="$d "
        share[$l]+="$e "
    done
done
base=$(med "${tps[one]}")
for l in "${layouts[@]}"; do
    t=$(med "${tps[$l]}")
    awk -v l="$l" -v t="$t" -v b="$base" -v a="${act[$l]}" -v a0="${act[one]}" \
        -v s="${rss[$l]}" -v s0="${rss[one]}" -v m="$(med "${attn[$l]}")" \
        -v e="$(med "${share[$l]}")" 'BEGIN {
        printf "%-12s %10.0f %8.2fx %7.0f MiB %4.2fx %7.0f MiB %4.2fx %9.0f %8.1f%%\n",
            l, t, t / b, a / 2^20, a / a0, s / 2^20, s / s0, m, 100 * e }'
done

# The longest T (a multiple of 256) whose plan fits the budget per rank.
tmax() {
    local cp=$1 mode=$2 lo=256 hi=$((1 << 20)) mid total
    while ((lo < hi)); do
        mid=$(((lo + hi + 256) / 512 * 256))
        total=$("$dtrain" plan memory "${model[@]}" --vocab 65 --batch 1 --seq "$mid" \
            --nproc "$cp" --cp "$cp" --cp-mode "$mode" 2>/dev/null | python3 -c '
import re, sys
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
t = [float(v) * unit[u] for v, u in re.findall(r"^  rank .*: ([0-9.]+) (\w+)$", sys.stdin.read(), re.M)]
print(int(max(t)) if t else 0)' || echo 0)
        if ((total > 0 && total <= budget * (1 << 30))); then lo=$mid; else hi=$((mid - 256)); fi
    done
    echo "$lo"
}
echo
echo "longest sequence within $budget GiB per rank (dtrain plan memory, batch 1):"
for mode in ulysses ring; do
    line="  $mode:"
    for cp in 1 2 4; do line+=" cp $cp T_max $(tmax "$cp" "$mode")"; done
    echo "$line"
done
