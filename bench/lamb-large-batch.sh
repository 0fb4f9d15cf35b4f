#!/usr/bin/env bash
# bench/lamb-large-batch.sh — LAMB's large-batch claim, measured: AdamW at
# the base batch B against LAMB (and, as the control, AdamW) at K x B with
# the learning rate scaled by sqrt(K) (You et al. 2020), the same number of
# steps and schedule. Prints, per run, the validation loss every E steps and
# the first step at which it reaches the base run's final validation loss.
#
#   bench/lamb-large-batch.sh [DTRAIN] [STEPS] [K]
#
# Defaults: build/dtrain, 300 steps, K = 8. Model, data and schedule as
# bench/optimizers.sh (shakespeare-char shape --layers 4 --dim 64 --heads 4
# --seq 64 on tinyshakespeare, cosine with 30 warm-up steps); B = 16; the
# base learning rates are bench/optimizers.sh's (AdamW 1e-2, LAMB 2e-2).
# Validation: the same 2048 sequences for every run (eval batches x batch).
# Wrap in `flock -x /tmp/dtrain-cpu.lock` on a shared machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain=${1:-$here/build/dtrain}
steps=${2:-300}
k=${3:-8}
every=20
batch=16
data=$here/../shared/data/tinyshakespeare.txt
[[ -f $data ]] || { echo "bench/lamb-large-batch.sh: $data not found" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
scale=$(/usr/bin/python3 -c "import math; print(math.sqrt($k))")

# run NAME BATCH OPTIMIZER LR
run() {
    local name=$1 b=$2 opt=$3 lr=$4
    "$dtrain" train --data "$data" --model shakespeare-char --layers 4 --dim 64 --heads 4 \
        --seq 64 --global-batch "$b" --steps "$steps" --threads 2 --peak-flops 1e9 \
        --sample-tokens 0 --progress plain --val-split 0.1 --eval-every "$every" \
        --eval-batches $((2048 / b)) --warmup 30 --schedule cosine --optimizer "$opt" \
        --lr "$lr" --run-dir "$work/$name" >"$work/$name.log" 2>&1 || {
        echo "bench/lamb-large-batch.sh: $name failed:" >&2
        tail -n 5 "$work/$name.log" >&2
        exit 1
    }
}

lr_adamw=1e-2
lr_lamb=2e-2
big=$((batch * k))
run base $batch adamw $lr_adamw
run lamb $big lamb "$(/usr/bin/python3 -c "print($lr_lamb * $scale)")"
run adamw_big $big adamw "$(/usr/bin/python3 -c "print($lr_adamw * $scale)")"
run lamb_base $batch lamb $lr_lamb

/usr/bin/python3 - "$work" "$batch" "$big" "$steps" "$k" <<'EOF'
import json, sys
work, b, big, steps, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def vals(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if l.startswith("{")]
    return [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
cfg = {n: json.load(open(f"{work}/{n}/config.json")) for n in ("base", "lamb", "adamw_big", "lamb_base")}
target = vals("base")[-1][1]
print(f"target: AdamW at batch {b}, {steps} steps: validation loss {target:.4f}")
print("%-28s %8s %10s %14s %22s" % ("run", "batch", "lr", "final val", "first step <= target"))
for name, label in (("base", "adamw"), ("lamb_base", "lamb"), ("lamb", f"lamb, {k}x batch"),
                    ("adamw_big", f"adamw, {k}x batch")):
    v = vals(name)
    first = next((s for s, l in v if l <= target), None)
    print("%-28s %8d %10.4g %14.4f %22s" % (label, cfg[name]["global_batch"] if "global_batch" in cfg[name] else 0,
                                            cfg[name]["lr"], v[-1][1], first if first else "not reached"))
print("validation loss by step:")
names = ("base", "lamb_base", "lamb", "adamw_big")
print("%6s" % "step" + "".join("%12s" % n for n in names))
curves = {n: dict(vals(n)) for n in names}
for s in sorted(curves["base"]):
    print("%6d" % s + "".join("%12.4f" % curves[n].get(s, float("nan")) for n in names))
EOF
