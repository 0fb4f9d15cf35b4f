#!/usr/bin/python3
"""bf16 GEMM: dtrain's backends against PyTorch on the same shapes and threads.

For each shape and transposition, runs `dtrain bench gemm-bf16 --json` and
right after it times torch.matmul on bf16 and fp32 tensors of the same
shape (C = A x B, fp32 accumulation, bf16 result in both), so the two sides are measured
close together; prints GFLOP/s side by side with the ratio of dtrain's
default backend (oneDNN) to PyTorch bf16. Medians of --runs runs of at
least --min-time seconds each.

    /usr/bin/python3 bench/compare-gemm-bf16.py --dtrain build/dtrain --threads 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Idle OpenMP workers sleep instead of spinning, in PyTorch's libgomp as in
# dtrain's (it is read when libgomp loads, so before torch is imported): on a
# shared machine spinning workers turn small multiplies into 10 ms stalls.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402

DEFAULT_SHAPES = "256x2304x768,256x768x768,256x3072x768,256x768x3072,256x50257x768"


def torch_gflops(M, N, K, op, dtype, runs, min_time):
    """Median GFLOP/s of C = op(A) op(B) with torch.matmul."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(K, M, generator=g) if op == "tn" else torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g) if op == "nt" else torch.randn(K, N, generator=g)
    a, b = a.to(dtype), (b * 0.02).to(dtype)

    def once():
        x = a.t() if op == "tn" else a
        y = b.t() if op == "nt" else b
        return torch.matmul(x, y)

    once()  # warm-up
    rates = []
    for _ in range(runs):
        n, t0 = 0, time.perf_counter()
        while True:
            once()
            n += 1
            t = time.perf_counter() - t0
            if t >= min_time:
                break
        rates.append(2.0 * M * N * K * n / t * 1e-9)
    return statistics.median(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtrain", default="build/dtrain")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.2)
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--op", default="all", choices=["nt", "nn", "tn", "all"])
    args = p.parse_args()

    env = dict(os.environ)

    def dtrain_gflops(shape, op):
        cmd = [args.dtrain, "bench", "gemm-bf16", "--json", "--shapes", shape, "--op", op,
               "--runs", str(args.runs), "--min-time", str(args.min_time),
               "--threads", str(args.threads), "--backends", "onednn,amx",
               "--out", "bf16"]  # torch.matmul of bf16 tensors returns bf16
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        return {json.loads(l)["backend"]: json.loads(l)["gflops"] for l in out.splitlines()}

    torch.set_num_threads(args.threads)
    ops = ["nt", "nn", "tn"] if args.op == "all" else [args.op]
    print(f"# GFLOP/s, {args.threads} threads, median of {args.runs}; torch {torch.__version__}")
    print(f"{'M':>6} {'N':>6} {'K':>6} {'op':>3} {'torch f32':>10} {'torch bf16':>10} "
          f"{'dt onednn':>10} {'dt amx':>10} {'dt/torch bf16':>14}")
    for s in args.shapes.split(","):
        M, N, K = (int(v) for v in s.split("x"))
        for op in ops:
            dt = dtrain_gflops(s, op)
            t32 = torch_gflops(M, N, K, op, torch.float32, args.runs, args.min_time)
            t16 = torch_gflops(M, N, K, op, torch.bfloat16, args.runs, args.min_time)
            d1, d2 = dt.get("onednn", float("nan")), dt.get("amx", float("nan"))
            print(f"{M:>6} {N:>6} {K:>6} {op:>3} {t32:>10.1f} {t16:>10.1f} {d1:>10.1f} "
                  f"{d2:>10.1f} {d1 / t16:>13.1f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
