#!/bin/sh
# train_layout_auto.sh DTRAIN SRC — `dtrain train --layout auto`:
#  1. with --nproc 2 the launcher plans once and the ranks run what
#     `dtrain plan` ranks first for the same model, ranks and samples per
#     step on the same cluster file (config.json records it);
#  2. a layout flag given by hand stays fixed (--tp 2);
#  3. under an external launcher every rank plans, from a cluster file, and
#     the run's layout is the plan's again; with --cluster this it is
#     refused, naming the fix;
#  4. a cluster on which nothing fits is refused (exit 2) with the reasons.
set -eu
DTRAIN=$1 SRC=$2
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
# A text of 48 distinct characters (vocabulary 48), long enough for 2 x 8 x 64.
python3 -c '
import random
r = random.Random(7)
a = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
print("".join(r.choice(a) for _ in range(60000)))' > "$w/text.txt"
# A CPU box: a node of 2 devices sharing 8 GiB, figures fixed so the choice
# does not depend on this machine's mood.
cat > "$w/box.json" <<'EOF'
{"name": "test-box", "source": "tests/train_layout_auto.sh", "devices_per_node": 2, "nodes": 1,
 "device": {"memory_gib": 8, "memory_bw_gbs": 20, "peak_tflops": {"fp32": 0.2, "bf16": 0.4},
            "efficiency": {"max": 0.9, "half_width": 64}, "shared_compute": true},
 "intra": {"bw_gbs": 10, "latency_us": 2, "topology": "shm"},
 "inter": {"bw_gbs": 1, "latency_us": 50}}
EOF
model="--model shakespeare-char --layers 2 --dim 64 --heads 2 --seq 64"
common="$model --data $w/text.txt --steps 2 --sample-tokens 0 --progress plain --val-split 0"

# What the run's config.json says about the layout, as the plan's flags.
layout_of() {
    python3 - "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
print("--dp %s --tp %s --pp %s --cp %s --batch %s --accum %s --zero %s --recompute %s" % tuple(
    c[k] for k in ("dp", "tp", "pp", "cp", "batch", "accum", "zero", "recompute")))
PY
}
# The same fields of a plan's first candidate (its train_args).
plan_first() {
    "$DTRAIN" plan $model --vocab 48 --devices 2 --global-batch "$1" --precision fp32 \
        --cluster "$w/box.json" --json --top 1 $2 | python3 -c '
import json, sys
a = json.load(sys.stdin)["candidates"][0]["layout"]["train_args"].split()
v = dict(zip(a[0::2], a[1::2]))
print(" ".join("%s %s" % (k, v[k]) for k in
      ("--dp", "--tp", "--pp", "--cp", "--batch", "--accum", "--zero", "--recompute")))'
}

# 1. --nproc 2: batch 8 x 2 replicas = 16 samples per step.
"$DTRAIN" train $common --nproc 2 --batch 8 --layout auto --cluster "$w/box.json" \
    --run-dir "$w/r1" > "$w/log1" 2>&1 || { cat "$w/log1"; exit 1; }
grep -q "^layout auto: .*dtrain plan on test-box" "$w/log1" || { cat "$w/log1"; exit 1; }
ran=$(layout_of "$w/r1/config.json")
planned=$(plan_first 16 "")
[ "$ran" = "$planned" ] || { echo "FAIL 1: ran '$ran', planned '$planned'"; exit 1; }
echo "1 ok: $ran"

# 2. --tp 2 given by hand stays (and the flags then give 8 x 1 replica = 8
# samples per step).
"$DTRAIN" train $common --nproc 2 --batch 8 --tp 2 --layout auto --cluster "$w/box.json" \
    --run-dir "$w/r2" > "$w/log2" 2>&1 || { cat "$w/log2"; exit 1; }
ran=$(layout_of "$w/r2/config.json")
planned=$(plan_first 8 "--tp 2")
case "$ran" in *"--tp 2 "*) ;; *) echo "FAIL 2: tp not kept: $ran"; exit 1 ;; esac
[ "$ran" = "$planned" ] || { echo "FAIL 2: ran '$ran', planned '$planned'"; exit 1; }
echo "2 ok: $ran"

# 3. dtrain launch: each rank plans from the file; 'this' is refused.
"$DTRAIN" launch --nproc 2 -- "$DTRAIN" train $common --batch 8 --layout auto \
    --cluster "$w/box.json" --run-dir "$w/r3" > "$w/log3" 2>&1 || { cat "$w/log3"; exit 1; }
[ "$(grep -c '^layout auto:' "$w/log3")" = 1 ] || { echo "FAIL 3: rank 0 alone reports"; cat "$w/log3"; exit 1; }
ran=$(layout_of "$w/r3/config.json")
[ "$ran" = "$(plan_first 16 "")" ] || { echo "FAIL 3: ran '$ran'"; exit 1; }
if "$DTRAIN" launch --nproc 2 -- "$DTRAIN" train $common --batch 8 --layout auto \
    --run-dir "$w/r4" > "$w/log4" 2>&1; then
    echo "FAIL 3: --cluster this under a launcher ran"; exit 1
fi
grep -q "needs --cluster FILE" "$w/log4" || { cat "$w/log4"; exit 1; }
echo "3 ok: $ran"

# 4. Nothing fits in 1 MiB per device.
sed 's/"memory_gib": 8/"memory_gib": 0.001/' "$w/box.json" > "$w/tiny.json"
set +e
"$DTRAIN" train $common --nproc 2 --batch 8 --layout auto --cluster "$w/tiny.json" \
    --run-dir "$w/r5" > "$w/log5" 2>&1
rc=$?
set -e
[ $rc = 2 ] && grep -q "no layout of 2 rank(s) fits 16 samples" "$w/log5" &&
    grep -q "MiB per device" "$w/log5" || { echo "FAIL 4: exit $rc"; cat "$w/log5"; exit 1; }
[ ! -e "$w/r5" ] || { echo "FAIL 4: a run directory was made"; exit 1; }
echo "4 ok"
echo "all passed"
