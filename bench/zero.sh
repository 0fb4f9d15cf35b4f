#!/usr/bin/env bash
# bench/zero.sh [DTRAIN] [ROUNDS] [CONFIGS] [VARIANTS] — ZeRO stages against
# DDP on the same work, in the same run: for each configuration, `dtrain
# train` as 2 ranks x 1 thread in each variant in turn (A B C ... A B C ...),
# ROUNDS times. Prints per variant the median tokens/s of the timed steps and
# its ratio to the first variant, the per-rank model state (parameters +
# gradients + optimizer + 16-bit weights resident, from the plan the header
# prints) relative to the first variant, the planned per-rank total and the
# measured peak resident memory of rank 0 (less what the process held before
# the model), and their difference.
#
# CONFIGS is a space-separated list of MODEL:B:T (default
# "gpt2-124m:4:64 shakespeare-char:8:256"). VARIANTS (default "0 1 2 3 1o")
# are, each: 0..3 (--zero N); 1o (--zero 1, the optimizer state offloaded:
# --offload optimizer=disk:DIR); 3p (--zero 3, the parameter pieces
# offloaded: params=disk:DIR), 3pd (the same with O_DIRECT: params=direct:DIR),
# 3po (both offloaded); 0h and 3h (--precision bf16 at zero 0 and 3), 3h4
# (the same with --bucket-size 4M); 0i8,
# 2i8 (--compress int8 at zero 0 and 2); 0bf and 1bf (--grad-dtype bf16 at
# zero 0 and 1). DIR is under $TMPDIR. The text is
# ../shared/data/tinyshakespeare.txt when present, else README.md; gpt2-124m
# runs with its 50257-token vocabulary over the byte tokenizer.
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
configs=${3:-"gpt2-124m:4:64 shakespeare-char:8:256"}
variants=${4:-"0 1 2 3 1o"}
source "$(dirname "$0")/train_lib.sh"
mkdir "$work/offload"
off=$work/offload

# args VARIANT: its flags; label VARIANT: its name in the table.
args() {
    case $1 in
    [0-3]) echo "--zero $1" ;;
    1o) echo "--zero 1 --offload optimizer=disk:$off" ;;
    3p) echo "--zero 3 --offload params=disk:$off" ;;
    3pd) echo "--zero 3 --offload params=direct:$off" ;;
    3po) echo "--zero 3 --offload params=disk:$off,optimizer=disk:$off" ;;
    0h | 3h) echo "--zero ${1%h} --precision bf16" ;;
    3h4) echo "--zero 3 --precision bf16 --bucket-size 4M" ;;
    0i8 | 2i8) echo "--zero ${1%i8} --compress int8" ;;
    0bf | 1bf) echo "--zero ${1%bf} --grad-dtype bf16" ;;
    *) echo "bench/zero.sh: unknown variant $1" >&2 && exit 2 ;;
    esac
}
label() {
    case $1 in
    [0-3]) echo "zero $1" ;;
    1o) echo "zero 1 + optimizer=disk" ;;
    3p) echo "zero 3 + params=disk" ;;
    3pd) echo "zero 3 + params=direct" ;;
    3po) echo "zero 3 + params,optimizer" ;;
    0h | 3h) echo "zero ${1%h} bf16" ;;
    3h4) echo "zero 3 bf16 4M buckets" ;;
    0i8 | 2i8) echo "zero ${1%i8} int8" ;;
    0bf | 1bf) echo "zero ${1%bf} grad bf16" ;;
    esac
}

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
line = re.search(r"memory plan/rank \(dtrain plan memory; rank 0\): (.*)", log).group(1)
state = sum(size(m.group(2)) for m in re.finditer(
    r"(params|grads|optimizer|16-bit weights) ([0-9.]+ \w+)", line))
m = re.search(r"planned ([0-9.]+ \w+) per rank \(rank 0\).*, measured peak resident ([0-9.]+ \w+) "
              r"of which ([0-9.]+ \w+) before", log)
print(tps, state, size(m.group(1)), size(m.group(2)) - size(m.group(3)))
EOF
}

printf '%-22s %-26s %10s %8s %13s %11s %11s %8s\n' "model B x T" variant tokens/s ratio \
    "model state" "plan/rank" measured error
for cfg in $configs; do
    IFS=: read -r model b t <<<"$cfg"
    common=(--model "$model" --batch "$b" --seq "$t" --steps 6 --lr 1e-4 --nproc 2 --no-save)
    [[ $model == gpt2-* ]] && common+=(--tokenizer byte --vocab 50257)
    declare -A tps=() st=() plan=() meas=()
    for ((r = 0; r < rounds; r++)); do
        for v in $variants; do
            # shellcheck disable=SC2046
            read -r a s p m < <(run "z$v" "${common[@]}" $(args "$v"))
            tps[$v]+="$a "
            st[$v]=$s
            plan[$v]=$p
            meas[$v]+="$m "
        done
    done
    first=${variants%% *}
    base=$(med "${tps[$first]}")
    for v in $variants; do
        x=$(med "${tps[$v]}")
        mm=$(med "${meas[$v]}")
        printf '%-22s %-26s %10.0f %7.2fx %12.2fx %7.0f MiB %7.0f MiB %+7.1f%%\n' "$model $b x $t" \
            "$(label "$v")" "$x" "$(echo "$x / $base" | bc -l)" \
            "$(echo "${st[$v]} / ${st[$first]}" | bc -l)" \
            "$(echo "${plan[$v]} / 1048576" | bc -l)" "$(echo "$mm / 1048576" | bc -l)" \
            "$(echo "100 * ($mm - ${plan[$v]}) / ${plan[$v]}" | bc -l)"
    done
    unset tps st plan meas
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $rounds rounds, medians; 2 ranks x 1 thread;" \
    "ratios to the first variant; measured = rank 0's peak resident memory less what it held" \
    "before the model"
