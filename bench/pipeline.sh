#!/usr/bin/env bash
# bench/pipeline.sh [DTRAIN] [ROUNDS] — pipeline parallelism, measured in
# real runs of `dtrain train` (1 thread per rank, the text of
# ../shared/data/tinyshakespeare.txt when present, else README.md):
#
# 1. Throughput: a 12-layer model (dim 256, 8 heads, seq 128, char
#    vocabulary), 8 micro-batches of 4 sequences per step, as one rank and
#    as --pp 2 with each schedule, in turn (A B C ... A B C), ROUNDS times:
#    median tokens/s of the timed steps, the speed-up over one rank, the
#    measured bubble (median of the steps' pp_bubble) against the
#    schedule's theory, and stage 0's live micro-batches and activation
#    memory (the header's per-rank line).
# 2. Bubble: 1f1b, interleaved:2 and zb at P = 2 and 4 stages (P = 4 runs
#    4 ranks on this machine's cores: with fewer than 4 cores the ranks
#    share them and the "idle" time of one is another's compute, so those
#    rows measure the executor, not a pipeline), M = 4, 8 and 16
#    micro-batches of 2 sequences: measured bubble, theory, and the
#    relative difference.
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
source "$(dirname "$0")/train_lib.sh"
model=(--model shakespeare-char --layers 12 --dim 256 --heads 8 --seq 128 --lr 1e-4)

# run NAME ARGS...: one training run; prints
# "tokens/s bubble theory live activations_bytes"
run() {
    local name=$1
    shift
    train_run "$name" "${model[@]}" "$@"
    /usr/bin/env python3 - "$work/$name.log" "$work/$name/metrics.jsonl" <<'EOF'
import json, re, statistics, sys
log = open(sys.argv[1]).read()
tps = float(re.search(r"([0-9.]+) tokens/s \(median\)", log).group(1))
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
v, u = re.search(r"activations ([0-9.]+) (\w+) peak", log).groups()
act = float(v) * unit[u]
m = re.search(r"pipeline bubble [0-9.]+% \(theory ([0-9.]+)%\), (\d+) micro", log)
theory, live = (float(m.group(1)), int(m.group(2))) if m else (0.0, 1)
rows = [json.loads(l) for l in open(sys.argv[2])][1:]
b = [r["pp_bubble"] for r in rows if r.get("pp_bubble") is not None]
print(tps, 100 * statistics.median(b) if b else 0.0, theory, live, act)
EOF
}

echo "== throughput: 12 layers, dim 256, seq 128, 8 micro-batches of 4, 1 thread per rank"
printf '%-18s %10s %9s %9s %8s %6s %13s\n' layout tokens/s speed-up bubble theory live "activations"
layouts=(one gpipe 1f1b interleaved:2 zb)
declare -A tps=() bub=() th=() live=() act=()
for ((r = 0; r < rounds; r++)); do
    for l in "${layouts[@]}"; do
        if [[ $l == one ]]; then extra=(); else extra=(--nproc 2 --pp 2 --pp-schedule "$l"); fi
        read -r a b t v m < <(run "t-${l/:/}" --batch 4 --micro-batches 8 --steps 5 "${extra[@]}")
        tps[$l]+="$a "
        bub[$l]+="$b "
        th[$l]=$t
        live[$l]=$v
        act[$l]=$m
    done
done
base=$(med "${tps[one]}")
for l in "${layouts[@]}"; do
    x=$(med "${tps[$l]}")
    name=$l
    [[ $l == one ]] || name="pp 2 $l"
    printf '%-18s %10.0f %8.2fx %8.1f%% %7.1f%% %6d %10.1f MiB\n' "$name" "$x" \
        "$(echo "$x / $base" | bc -l)" "$(med "${bub[$l]}")" "${th[$l]}" "${live[$l]}" \
        "$(echo "${act[$l]} / 1048576" | bc -l)"
done

echo
echo "== bubble: micro-batches of 2 sequences, measured (median of rounds) vs theory"
printf '%-4s %-14s %4s %9s %9s %10s\n' P schedule M measured theory "rel. diff"
for P in 2 4; do
    for s in 1f1b interleaved:2 zb; do
        for M in 4 8 16; do
            [[ $s == interleaved:2 && $((M % P)) -ne 0 ]] && continue
            b=""
            for ((r = 0; r < rounds; r++)); do
                read -r _ x t _ _ < <(run "b$P-${s/:/}-$M" --batch 2 --micro-batches "$M" \
                    --steps 4 --nproc "$P" --pp "$P" --pp-schedule "$s")
                b+="$x "
            done
            x=$(med "$b")
            printf '%-4s %-14s %4s %8.1f%% %8.1f%% %+9.0f%%\n' "$P" "$s" "$M" "$x" "$t" \
                "$(echo "100 * ($x - $t) / $t" | bc -l)"
        done
    done
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $rounds rounds, medians;" \
    "zb's theory column is 1F1B's"
