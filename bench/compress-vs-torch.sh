#!/bin/sh
# bench/compress-vs-torch.sh — dtrain's codecs next to the same operations in
# PyTorch, measured in the same run on the same data size, one thread each.
#
#   bench/compress-vs-torch.sh [BUILD_DIR] [COUNT] [wall|cpu]   (defaults: build 4M wall)
#
# "cpu" times both sides with the process CPU clock instead of the wall
# clock, which is steadier when other jobs share the machine.
#
# Peers (torch, CPU, torch.set_num_threads(1)):
#   fp16 / bf16   x.half() / x.bfloat16() and back with .float()
#   topk:0.01     torch.topk(x.abs(), k, sorted=False) + gather  /  zeros + index_put
#   powersgd:4    P = M Q, powerSGD_hook's _orthogonalize(P), Q = M^T P  /  P Q^T
# Throughput is fp32 input bytes / time, median of 7 runs after a warm-up.
# OPENBLAS_NUM_THREADS=1 keeps dtrain's PowerSGD sgemm on one thread too.
set -eu
BUILD=${1:-build}
COUNT=${2:-4M}
CLOCK=${3:-wall}
case "$CLOCK" in
    wall) CLOCKFLAG= ;;
    cpu) CLOCKFLAG=--cpu-time ;;
    *) echo "error: clock must be wall or cpu, not '$CLOCK'" >&2; exit 2 ;;
esac
DTRAIN="$BUILD/dtrain"
[ -x "$DTRAIN" ] || { echo "error: $DTRAIN not found (build first)" >&2; exit 2; }
PY=/usr/bin/python3
"$PY" -c 'import torch' 2>/dev/null || { echo "error: $PY has no torch (apt-get install python3-torch)" >&2; exit 2; }

TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
for codec in fp16 bf16 topk:0.01 powersgd:4; do
    OPENBLAS_NUM_THREADS=1 "$DTRAIN" bench compress --codec "$codec" --count "$COUNT" --iters 7 \
        --json $CLOCKFLAG >>"$TMP"
done

"$PY" - "$TMP" "$CLOCK" <<'PYEOF'
import json, statistics, sys, time
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

torch.set_num_threads(1)
clock = time.process_time if sys.argv[2] == "cpu" else time.perf_counter
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
n = rows[0]["count"]
g = torch.Generator().manual_seed(1)
x = torch.randn(n, generator=g)

def med(fn, reps=7):
    fn()
    t = []
    for _ in range(reps):
        t0 = clock(); fn(); t.append(clock() - t0)
    return statistics.median(t)

def side(codec):
    if codec == "fp16":
        h = x.half()
        return med(lambda: x.half()), med(lambda: h.float())
    if codec == "bf16":
        b = x.bfloat16()
        return med(lambda: x.bfloat16()), med(lambda: b.float())
    if codec.startswith("topk"):
        k = max(1, -(-n // 100))
        def enc():
            _, i = torch.topk(x.abs(), k, sorted=False)
            return i, x[i]
        i, v = enc()
        def dec():
            out = torch.zeros(n)
            out[i] = v
            return out
        return med(enc), med(dec)
    if codec.startswith("powersgd"):
        r = int(codec.split(":")[1])
        rws = max(d for d in range(1, int(n ** 0.5) + 1) if n % d == 0)
        M = x.view(rws, n // rws)
        Q = torch.randn(n // rws, r, generator=g)
        def enc():
            P = M @ Q
            _orthogonalize(P[None])
            return P, M.t() @ P
        P, Q2 = enc()
        return med(enc), med(lambda: P @ Q2.t())
    raise ValueError(codec)

print(f"# {n} fp32 values, one thread each; GB/s of fp32 input (median of 7, {sys.argv[2]} clock); torch {torch.__version__}")
print(f"{'codec':<12} {'dtrain enc':>10} {'torch enc':>10} {'ratio':>6}   {'dtrain dec':>10} {'torch dec':>10} {'ratio':>6}")
for r in rows:
    te, td = side(r["codec"])
    tge, tgd = 4 * n / te * 1e-9, 4 * n / td * 1e-9
    print(f"{r['codec']:<12} {r['encode_gbps']:>10.2f} {tge:>10.2f} {r['encode_gbps'] / tge:>6.2f}   "
          f"{r['decode_gbps']:>10.2f} {tgd:>10.2f} {r['decode_gbps'] / tgd:>6.2f}")
PYEOF
