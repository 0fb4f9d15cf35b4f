#!/usr/bin/env bash
# bench/optimizers.sh — every optimizer of docs/optim.md trains the same
# character-level GPT on tinyshakespeare for the same number of steps; prints
# per optimizer the state bytes per parameter (what the trainer allocated,
# from its config.json), the median step time, the validation loss at the
# last step and its difference from AdamW's.
#
#   bench/optimizers.sh [OPTIONS] [-- MORE DTRAIN TRAIN FLAGS]
#
#   --dtrain PATH   the dtrain binary (default build/dtrain)
#   --steps N       optimizer steps per run (default 300)
#   --warmup W      warm-up steps of the cosine schedule (default 30)
#   --repeat R      run every entry R times, round robin (default 3); the
#                   table shows the median over the runs of each run's
#                   median step time, and the median validation loss
#                   (every run is deterministic: the R losses agree)
#   --entries LIST  space-separated entries NAME[:FLAGS with commas for
#                   spaces] (default: the list below)
#   --model ARGS    model flags (default "--model shakespeare-char --layers 4
#                   --dim 64 --heads 4 --seq 64")
#   --batch B       global batch (default 16)
#   --out DIR       keep the runs here (default: a temporary directory)
#
# One process, 2 threads per run (1-bit Adam: 2 ranks x 1 thread, it needs
# a data-parallel exchange to compress); the same seed, data, model,
# schedule (cosine, 30 warm-up steps, min-lr lr/10) and batch for every
# entry; each entry's learning rate as listed. Wrap in
# `flock -x /tmp/dtrain-cpu.lock` on a shared machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain=$here/build/dtrain
steps=300
warmup=30
repeat=3
model="--model shakespeare-char --layers 4 --dim 64 --heads 4 --seq 64"
batch=16
out=""
# NAME:FLAGS (commas for spaces). Learning rates from a sweep at this size
# (300 steps; docs/optim.md): 1e-2 for the Adam family; LAMB's trust ratio
# makes lr a relative step per tensor (2e-2); LARS with eta 0.02 and lr 0.3;
# Nesterov SGD 0.3; Adafactor with the lr schedule (6e-3, no first moment:
# the factored state alone) and with its own relative step; 1-bit Adam and
# LAMB compress from step 61 (LAMB's trust ratios, frozen there, must be
# past its slow first ~50 steps: frozen at step 30 it stalls near 3.3);
# L-BFGS step 1 with its line search, 4 iterations per batch; K-FAC with
# lr 0.3, damping 0.1 and KL clip 1e-3 (the best of a small sweep), momentum
# 0.9, inverses every 10 steps.
entries="adamw:--optimizer,adamw,--lr,1e-2
adamw8bit:--optimizer,adamw8bit,--lr,1e-2
radam:--optimizer,radam,--lr,1e-2
lamb:--optimizer,lamb,--lr,2e-2
lars:--optimizer,lars,--lr,0.3,--trust-coeff,0.02,--weight-decay,0
sgd:--optimizer,sgd,--lr,0.3,--nesterov,--weight-decay,0
adafactor:--optimizer,adafactor,--adafactor-relative-step,off,--adafactor-scale-parameter,off,--lr,6e-3
adafactor-rel:--optimizer,adafactor
lookahead-adamw:--optimizer,lookahead,--lookahead-inner,adamw,--lr,1e-2
adamw+gc:--optimizer,adamw,--lr,1e-2,--grad-centralization
onebit-adam:--optimizer,onebit-adam,--lr,1e-2,--nproc,2,--threads,1,--compress-start,60
onebit-lamb:--optimizer,onebit-lamb,--lr,2e-2,--nproc,2,--threads,1,--compress-start,60
lbfgs:--optimizer,lbfgs,--lr,1,--lbfgs-max-iter,4,--lbfgs-history,10
kfac:--optimizer,kfac,--lr,0.3,--kfac-damping,0.1,--kfac-kl-clip,1e-3,--weight-decay,0"
more=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --dtrain) dtrain=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --entries) entries=$(tr ' ' '\n' <<<"$2"); shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; more=("$@"); break ;;
    *) echo "bench/optimizers.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
data=$here/../shared/data/tinyshakespeare.txt
[[ -f $data ]] || { echo "bench/optimizers.sh: $data not found" >&2; exit 1; }
[[ -x $dtrain ]] || { echo "bench/optimizers.sh: $dtrain not built" >&2; exit 1; }
if [[ -z $out ]]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
results=$out/results.tsv
: >"$results"

for ((r = 0; r < repeat; r++)); do
    while IFS= read -r entry; do
        [[ -n $entry ]] || continue
        name=${entry%%:*}
        IFS=',' read -r -a flags <<<"${entry#*:}"
        dir=$out/$name.$r
        rm -rf "$dir"
        # shellcheck disable=SC2086
        if ! "$dtrain" train --data "$data" $model --global-batch "$batch" --steps "$steps" \
            --threads 2 --peak-flops 1e9 --sample-tokens 0 --progress plain --val-split 0.1 \
            --eval-every "$steps" --eval-batches 16 --warmup "$warmup" --schedule cosine \
            --run-dir "$dir" "${flags[@]}" "${more[@]}" >"$dir.log" 2>&1; then
            echo "bench/optimizers.sh: $name failed:" >&2
            tail -n 5 "$dir.log" >&2
            printf '%s\tfailed\n' "$name" >>"$results"
            continue
        fi
        /usr/bin/python3 - "$dir" "$name" "${entry#*:}" >>"$results" <<'EOF'
import json, statistics, sys
d, name, flags = sys.argv[1:4]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if l.startswith("{")]
cfg = json.load(open(d + "/config.json"))
steps = [r for r in rows if "step_ms" in r]
# The first steps warm caches and (1-bit) run the dense stage; the median
# over the second half is the steady state.
half = steps[len(steps) // 2:]
val = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
print("\t".join(map(str, [name, "ok", cfg["info"].get("optimizer-state-bytes-per-param", 0),
                          statistics.median(r["step_ms"] for r in half), val[-1],
                          flags.replace(",", " ")])))
EOF
    done <<<"$entries"
done

/usr/bin/python3 - "$results" "$steps" "$repeat" <<'EOF'
import statistics, sys
path, steps, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {}
order = []
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if f[0] not in runs:
        runs[f[0]] = []
        order.append(f[0])
    if f[1] == "ok":
        runs[f[0]].append((float(f[2]), float(f[3]), float(f[4]), f[5]))
base = statistics.median(r[2] for r in runs["adamw"]) if runs.get("adamw") else None
base_ms = statistics.median(r[1] for r in runs["adamw"]) if runs.get("adamw") else None
print(f"{steps} steps, median of {repeat} runs")
print("%-16s %12s %10s %8s %12s %9s  %s" % ("optimizer", "state B/par", "step ms", "x adamw",
                                            "val loss", "vs adamw", "flags"))
for name in order:
    rs = runs[name]
    if not rs:
        print("%-16s failed" % name)
        continue
    ms = statistics.median(r[1] for r in rs)
    loss = statistics.median(r[2] for r in rs)
    print("%-16s %12.4f %10.2f %8.2f %12.4f %+8.2f%%  %s"
          % (name, rs[0][0], ms, ms / base_ms if base_ms else float("nan"), loss,
             100 * (loss - base) / base if base else float("nan"), rs[0][3]))
EOF
