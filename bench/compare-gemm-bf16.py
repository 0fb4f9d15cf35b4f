#!/usr/bin/python3
"""bf16 GEMM: dtrain's backends against PyTorch on the same shapes and threads.

Runs `dtrain bench gemm-bf16 --json` and then times torch.matmul on bf16 and
fp32 tensors of the same shapes and transpositions (C = A x B, fp32
accumulation in both), and prints GFLOP/s side by side with the ratio of
dtrain's default backend to PyTorch bf16. Medians of --runs runs of at least
--min-time seconds each. The two halves run one after the other, so on a
shared machine compare numbers measured close together, or rerun.

    /usr/bin/python3 bench/compare-gemm-bf16.py --dtrain build/dtrain --threads 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

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
    env.setdefault("OMP_WAIT_POLICY", "passive")
    cmd = [args.dtrain, "bench", "gemm-bf16", "--json", "--shapes", args.shapes, "--op", args.op,
           "--runs", str(args.runs), "--min-time", str(args.min_time),
           "--threads", str(args.threads), "--backends", "onednn,amx"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    dt = {}
    for line in out.splitlines():
        r = json.loads(line)
        dt[(r["M"], r["N"], r["K"], r["op"], r["backend"])] = r["gflops"]

    torch.set_num_threads(args.threads)
    ops = ["nt", "nn", "tn"] if args.op == "all" else [args.op]
    print(f"# GFLOP/s, {args.threads} threads, median of {args.runs}; torch {torch.__version__}")
    print(f"{'M':>6} {'N':>6} {'K':>6} {'op':>3} {'torch f32':>10} {'torch bf16':>10} "
          f"{'dt onednn':>10} {'dt amx':>10} {'dt/torch bf16':>14}")
    for s in args.shapes.split(","):
        M, N, K = (int(v) for v in s.split("x"))
        for op in ops:
            t32 = torch_gflops(M, N, K, op, torch.float32, args.runs, args.min_time)
            t16 = torch_gflops(M, N, K, op, torch.bfloat16, args.runs, args.min_time)
            d1 = dt.get((M, N, K, op, "onednn"), float("nan"))
            d2 = dt.get((M, N, K, op, "amx"), float("nan"))
            print(f"{M:>6} {N:>6} {K:>6} {op:>3} {t32:>10.1f} {t16:>10.1f} {d1:>10.1f} "
                  f"{d2:>10.1f} {d1 / t16:>13.1f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
