#!/usr/bin/python3
"""Compare dtrain's AdamW, SGD and RAdam kernels with PyTorch's on the same
flat buffer, thread count and number of steps, in the same run.

    /usr/bin/python3 bench/compare-pytorch-optim.py [--params 16M] [--threads 1]
                     [--steps 10] [--dtrain build/dtrain] [--repeat 3]

PyTorch runs torch.optim.AdamW / SGD(momentum 0.9, nesterov) / RAdam on one
fp32 parameter tensor with foreach=False and foreach=True (1.13 has no fused
CPU optimizer). dtrain's AdamW and SGD are the range kernels; its RAdam and
the AdamW optimizer object ("adamw-object", the path `dtrain train` takes)
run through dt_optimizer_step over 8 tensors of the same buffer. The other
optimizers of docs/optim.md have no PyTorch 1.13 implementation (Adafactor,
8-bit AdamW, LAMB, LARS, 1-bit Adam live in other libraries); their times
are in `dtrain bench optim`. Each side reports the median time per step; the table shows both and
dtrain's speed-up. --repeat runs the whole comparison several times and
prints the median of the medians (the machine may be shared).
"""
import argparse
import json
import statistics
import subprocess
import time

import torch


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def torch_ms(kind, n, steps, foreach):
    p = torch.nn.Parameter(torch.linspace(-1, 1, n))
    p.grad = torch.linspace(-0.05, 0.05, n)
    if kind == "adamw":
        opt = torch.optim.AdamW([p], lr=1e-4, foreach=foreach)
    elif kind == "radam":
        opt = torch.optim.RAdam([p], lr=1e-4, foreach=foreach)
    else:
        opt = torch.optim.SGD([p], lr=1e-4, momentum=0.9, nesterov=True, foreach=foreach)
    opt.step()  # warm-up: allocates the state
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def dtrain_ms(exe, n, threads, steps):
    out = subprocess.run([exe, "bench", "optim", "--params", str(n), "--threads", str(threads),
                          "--steps", str(steps), "--kernels", "adamw,sgd-nesterov,radam,adamw-object",
                          "--json"], check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["kernel"]: r["ms"] for r in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="16M")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtrain", default="build/dtrain")
    a = ap.parse_args()
    n = parse_size(a.params)
    torch.set_num_threads(a.threads)
    res = {k: [] for k in ("dt_adamw", "dt_adamw_obj", "pt_adamw", "pt_adamw_fe", "dt_sgd",
                           "pt_sgd", "pt_sgd_fe", "dt_radam", "pt_radam", "pt_radam_fe")}
    for _ in range(a.repeat):
        d = dtrain_ms(a.dtrain, n, a.threads, a.steps)
        res["dt_adamw"].append(d["adamw"])
        res["dt_adamw_obj"].append(d["adamw-object"])
        res["dt_sgd"].append(d["sgd-nesterov"])
        res["dt_radam"].append(d["radam"])
        res["pt_adamw"].append(torch_ms("adamw", n, a.steps, False))
        res["pt_adamw_fe"].append(torch_ms("adamw", n, a.steps, True))
        res["pt_sgd"].append(torch_ms("sgd", n, a.steps, False))
        res["pt_sgd_fe"].append(torch_ms("sgd", n, a.steps, True))
        res["pt_radam"].append(torch_ms("radam", n, a.steps, False))
        res["pt_radam_fe"].append(torch_ms("radam", n, a.steps, True))
    med = {k: statistics.median(v) for k, v in res.items()}
    print("params %d, threads %d, %d steps, median of %d runs (torch %s)"
          % (n, a.threads, a.steps, a.repeat, torch.__version__))
    print("%-24s %12s %12s %12s" % ("optimizer", "dtrain ms", "pytorch ms", "speed-up"))
    for name, dk, pk in (("adamw", "dt_adamw", "pt_adamw"),
                         ("adamw (foreach)", "dt_adamw", "pt_adamw_fe"),
                         ("adamw object (foreach)", "dt_adamw_obj", "pt_adamw_fe"),
                         ("sgd nesterov", "dt_sgd", "pt_sgd"),
                         ("sgd nesterov (foreach)", "dt_sgd", "pt_sgd_fe"),
                         ("radam", "dt_radam", "pt_radam"),
                         ("radam (foreach)", "dt_radam", "pt_radam_fe")):
        print("%-24s %12.3f %12.3f %11.2fx" % (name, med[dk], med[pk], med[pk] / med[dk]))


if __name__ == "__main__":
    main()
