#!/bin/sh
# plan_memory.sh DTRAIN SRC — the planner's memory per device for a layout
# is the trainer's own plan (`dtrain plan memory`) of the same layout, for
# DDP and each ZeRO stage (within the 3 significant digits plan memory
# prints).
set -eu
DTRAIN=$1 SRC=$2
for z in 0 1 2 3; do
    p=$("$DTRAIN" plan --model shakespeare-char --layers 4 --devices 2 --global-batch 8 \
        --cluster "$SRC/examples/clusters/dgx-a100.json" --precision fp32 --dp 2 --micro-batch 4 \
        --zero $z --recompute none --json --top 1)
    m=$("$DTRAIN" plan memory --model shakespeare-char --layers 4 --nproc 2 --zero $z --batch 4 \
        --precision fp32 | sed -n '2p')
    python3 - "$p" "$m" "$z" <<'PY'
import json, re, sys
p = json.loads(sys.argv[1])["candidates"][0]["memory_per_device"]
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
# the peak, before any note in parentheses (stage 3: what the end adds)
v, u = re.search(r": ([0-9.]+) (\w+)(?: \(.*\))?$", sys.argv[2].strip()).groups()
m = float(v) * unit[u]
ok = abs(p - m) <= 0.006 * m
print("zero %s: planner %d bytes, plan memory %s %s: %s" % (sys.argv[3], p, v, u, "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
done
echo "all passed"
