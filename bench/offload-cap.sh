#!/usr/bin/env bash
# bench/offload-cap.sh [DTRAIN] [CAP_MIB] [MODE] — a job whose state does
# not fit in its memory trains when its state is offloaded to disk.
#
# Runs `dtrain train` (gpt2-124m, B4 T64, 2 ranks x 1 thread, 4 steps)
# inside a memory cgroup capped at CAP_MIB for the whole job (both ranks
# and the page cache they use), first with the state in memory (the job
# does not fit and must fail with a clear message, not hang), then
# offloaded. MODE optimizer (the default; CAP 2800): ZeRO 1 (each rank
# needs about 1.6 GiB), then --offload optimizer=disk:DIR (about 1.2 GiB
# per rank). MODE params (CAP 1400): ZeRO 3 (about 1.1 GiB per rank; the
# model state, 16 bytes per parameter, is 2 GB in all), then --offload
# params=disk:DIR,optimizer=disk:DIR (this rank's gradient pieces and the
# units in use stay in memory). Prints each outcome, tokens/s and rank 0's
# measured peak. Needs root (it creates the cgroup, v1 or v2); exits 77
# without.
set -uo pipefail
dtrain=$(realpath "${1:-build/dtrain}")
mode=${3:-optimizer}
case $mode in
optimizer) zero=1 cap=${2:-2800} ;;
params) zero=3 cap=${2:-1400} ;;
*) echo "bench/offload-cap.sh: MODE is optimizer or params, not $mode" >&2 && exit 2 ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
data=$here/../shared/data/tinyshakespeare.txt
[[ -f $data ]] || data=$here/README.md
[[ $(id -u) == 0 ]] || { echo "bench/offload-cap.sh: needs root for a memory cgroup"; exit 77; }
work=$(mktemp -d)
name=dtrain-offload-cap-$$
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    cg=/sys/fs/cgroup/$name
    mkdir "$cg" && echo $((cap << 20)) >"$cg/memory.max" && echo 0 >"$cg/memory.swap.max" 2>/dev/null
else
    cg=/sys/fs/cgroup/memory/$name
    mkdir "$cg" && echo $((cap << 20)) >"$cg/memory.limit_in_bytes"
fi
trap 'rmdir "$cg" 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/offload"

# run NAME ARGS...: dtrain train in the cgroup; prints the outcome.
run() {
    local name=$1
    shift
    sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
        "$dtrain" train --data "$data" --model gpt2-124m --tokenizer byte --vocab 50257 \
        --batch 4 --seq 64 --steps 4 --lr 1e-4 --nproc 2 --threads 1 --zero $zero --no-save \
        --peak-flops 1e9 --sample-tokens 0 --progress plain --val-split 0 \
        --run-dir "$work/$name" "$@" >"$work/$name.log" 2>&1
    local rc=$?
    printf '%-26s exit %d: ' "$name" "$rc"
    if [[ $rc == 0 ]]; then
        grep -oE '[0-9.]+ tokens/s \(median\)' "$work/$name.log" | tr '\n' ' '
        grep -oE 'measured peak resident [0-9.]+ [A-Za-z]+' "$work/$name.log"
    else
        grep -m1 -E 'error|killed' "$work/$name.log" | cut -c1-160
    fi
}

echo "# memory cgroup of $cap MiB for the whole job (2 ranks); gpt2-124m B4 T64, ZeRO $zero"
run in-memory
if [[ $mode == params ]]; then
    run offloaded --offload "params=disk:$work/offload,optimizer=disk:$work/offload"
else
    run offloaded --offload "optimizer=disk:$work/offload"
fi
echo "# $(lscpu | sed -n 's/^Model name: *//p')"
