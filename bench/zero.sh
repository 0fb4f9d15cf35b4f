#!/usr/bin/env bash
# bench/zero.sh [DTRAIN] [ROUNDS] [CONFIGS] — ZeRO stages against DDP on the
# same work, in the same run: for each configuration, `dtrain train` as 2
# ranks x 1 thread with --zero 0, 1, 2 and 3 and --zero 1 with the optimizer
# state offloaded to a file (--offload optimizer=disk:DIR, DIR under
# $TMPDIR), in turn (A B C D E A B C D E ...),
# ROUNDS times. Prints per stage the median tokens/s of the timed steps and
# its ratio to zero 0, the per-rank model state (parameters + gradients +
# optimizer, from the plan the header prints) relative to zero 0, the
# planned per-rank total and the measured peak resident memory of rank 0
# (less what the process held before the model), and their difference.
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
mkdir "$work/offload"

# run NAME ARGS...: prints "tokens/s model_state plan measured"
run() {
    train_run "$@"
    /usr/bin/env python3 - "$work/$1.log" <<'EOF'
import re, sys
log = open(sys.argv[1]).read()
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def size(s):
    v, u = s.split()
    return float(v) * unit[u]
tps = float(re.search(r"([0-9.]+) tokens/s \(median\)", log).group(1))
m = re.search(r"memory plan/rank \(dtrain plan memory; rank 0\): params ([0-9.]+ \w+), "
              r"grads ([0-9.]+ \w+), optimizer ([0-9.]+ \w+)", log)
state = size(m.group(1)) + size(m.group(2)) + size(m.group(3))
m = re.search(r"planned ([0-9.]+ \w+) per rank \(rank 0\), measured peak resident ([0-9.]+ \w+) "
              r"of which ([0-9.]+ \w+) before", log)
print(tps, state, size(m.group(1)), size(m.group(2)) - size(m.group(3)))
EOF
}

printf '%-22s %-14s %10s %8s %13s %11s %11s %8s\n' "model B x T" stage tokens/s ratio \
    "model state" "plan/rank" measured error
for cfg in $configs; do
    IFS=: read -r model b t <<<"$cfg"
    args=(--model "$model" --batch "$b" --seq "$t" --steps 6 --lr 1e-4 --nproc 2)
    [[ $model == gpt2-* ]] && args+=(--tokenizer byte --vocab 50257)
    declare -A tps=() st=() plan=() meas=()
    for ((r = 0; r < rounds; r++)); do
        for z in 0 1 2 3 1o; do
            zargs=(--zero "${z%o}")
            [[ $z == *o ]] && zargs+=(--offload "optimizer=disk:$work/offload")
            read -r a s p m < <(run "z$z" "${args[@]}" "${zargs[@]}")
            tps[$z]+="$a "
            st[$z]=$s
            plan[$z]=$p
            meas[$z]+="$m "
        done
    done
    base=$(med "${tps[0]}")
    for z in 0 1 2 3 1o; do
        x=$(med "${tps[$z]}")
        mm=$(med "${meas[$z]}")
        printf '%-22s %-14s %10.0f %7.2fx %12.2fx %7.0f MiB %7.0f MiB %+7.1f%%\n' "$model $b x $t" \
            "zero ${z%o}$([[ $z == *o ]] && echo ' + offload')" "$x" "$(echo "$x / $base" | bc -l)" "$(echo "${st[$z]} / ${st[0]}" | bc -l)" \
            "$(echo "${plan[$z]} / 1048576" | bc -l)" "$(echo "$mm / 1048576" | bc -l)" \
            "$(echo "100 * ($mm - ${plan[$z]}) / ${plan[$z]}" | bc -l)"
    done
    unset tps st plan meas
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $rounds rounds, medians; 2 ranks x 1 thread;" \
    "measured = rank 0's peak resident memory less what it held before the model"
