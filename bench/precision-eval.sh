#!/bin/sh
# bench/precision-eval.sh — the full form of issue 7's check: bf16 and fp16
# training reach a validation loss within 2% of the fp32 run after the same
# number of steps (test_train_amp_precision is the short form in ctest).
#
#   bench/precision-eval.sh [BUILD_DIR] [DATA]        (defaults: build, see below)
#
# Trains the same model from the same seed on the same data three times,
# --precision fp32, bf16 and fp16 (fp16 with dynamic loss scaling, the
# default), and prints a table: precision, steps, final validation loss,
# its difference to fp32, skipped steps, loss scale at the end, median
# tokens/s. Every run is `dtrain train` with all else equal; the runs go one
# after another, so on a shared machine tokens/s carries the noise of the
# moment (the losses do not: they are deterministic).
#
# DATA: the shakespeare-char corpus ../shared/data/tinyshakespeare.txt (next
# to the repository) when present, else any text file given, else the
# licence texts of /usr/share/common-licenses concatenated.
#
# Knobs (environment): MODEL (shakespeare-char), STEPS (2000), BATCH (8 per
# rank), SEQ (the preset's 256), NPROC (1), THREADS (0: all CPUs / ranks),
# LR (1e-3), EVAL_EVERY (STEPS/10), EVAL_BATCHES (20), EXTRA (more flags),
# OUT (a directory kept for the run dirs; default: a temporary one).
# The full default run takes hours on a 2-core machine; e.g.
#   STEPS=200 SEQ=128 BATCH=4 bench/precision-eval.sh
# is a few minutes.
set -eu
BUILD=${1:-build}
REPO=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN="$BUILD/dtrain"
[ -x "$DTRAIN" ] || { echo "error: $DTRAIN not found (build first)" >&2; exit 2; }

DATA=${2:-}
if [ -z "$DATA" ]; then
    for f in "$REPO/../shared/data/tinyshakespeare.txt" "$REPO/../../shared/data/tinyshakespeare.txt"; do
        if [ -f "$f" ]; then DATA=$f; break; fi
    done
fi
OUT=${OUT:-}
KEEP=1
if [ -z "$OUT" ]; then
    OUT=$(mktemp -d)
    KEEP=0
fi
mkdir -p "$OUT"
cleanup() { [ "$KEEP" = 1 ] || rm -rf "$OUT"; }
trap cleanup EXIT
if [ -z "$DATA" ]; then
    DATA="$OUT/licenses.txt"
    cat /usr/share/common-licenses/* >"$DATA" 2>/dev/null || true
    [ -s "$DATA" ] || { echo "error: no text to train on (give DATA)" >&2; exit 2; }
    echo "note: tinyshakespeare.txt not found; training on $DATA" >&2
fi
[ -f "$DATA" ] || { echo "error: data file $DATA not found" >&2; exit 2; }

MODEL=${MODEL:-shakespeare-char}
STEPS=${STEPS:-2000}
BATCH=${BATCH:-8}
SEQ=${SEQ:-0}
NPROC=${NPROC:-1}
THREADS=${THREADS:-0}
LR=${LR:-1e-3}
EVAL_EVERY=${EVAL_EVERY:-$((STEPS / 10 > 0 ? STEPS / 10 : 1))}
EVAL_BATCHES=${EVAL_BATCHES:-20}
EXTRA=${EXTRA:-}

echo "model $MODEL, data $DATA, $STEPS steps, batch $BATCH x $NPROC rank(s), seq ${SEQ} (0: preset), lr $LR" >&2
for p in fp32 bf16 fp16; do
    echo "== $p" >&2
    # shellcheck disable=SC2086  # EXTRA is a list of flags
    "$DTRAIN" train --model "$MODEL" --data "$DATA" --steps "$STEPS" --batch "$BATCH" \
        --seq "$SEQ" --nproc "$NPROC" --threads "$THREADS" --lr "$LR" \
        --eval-every "$EVAL_EVERY" --eval-batches "$EVAL_BATCHES" --sample-tokens 0 \
        --progress plain --precision "$p" --run-dir "$OUT/$p" $EXTRA >"$OUT/$p.log" 2>&1 || {
        echo "error: the $p run failed:" >&2
        tail -5 "$OUT/$p.log" >&2
        exit 1
    }
    grep -E '^(done|  precision|  memory)' "$OUT/$p.log" >&2 || true
done

/usr/bin/python3 - "$OUT" <<'PYEOF'
import json, re, sys
out = sys.argv[1]
rows = []
for p in ("fp32", "bf16", "fp16"):
    steps = [json.loads(l) for l in open(f"{out}/{p}/metrics.jsonl")]
    last = steps[-1]
    val = [s["val_loss"] for s in steps if s["val_loss"] is not None]
    done = [l for l in open(f"{out}/{p}.log") if l.startswith("done:")][-1]
    tps = float(re.search(r"([0-9.]+) tokens/s \(median\)", done).group(1))
    rows.append((p, last["step"], val[-1], last["skipped_steps"], last["loss_scale"], tps))
ref = rows[0][2]
print("| precision | steps | final val loss | vs fp32 | skipped steps | loss scale | tokens/s |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for p, n, v, sk, sc, tps in rows:
    scale = "-" if sc is None else "%g" % sc
    print(f"| {p} | {n} | {v:.4f} | {100 * (v / ref - 1):+.2f}% | {sk} | {scale} | {tps:.0f} |")
worst = max(abs(r[2] / ref - 1) for r in rows[1:])
print(f"\nlargest difference to fp32: {100 * worst:.2f}% ({'within' if worst <= 0.02 else 'NOT within'} 2%)")
PYEOF
