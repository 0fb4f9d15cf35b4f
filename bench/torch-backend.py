#!/usr/bin/python3
"""torch.distributed over gloo and over dtrain (dtrain_torch), side by side in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch-backend.py
        [--ranks 2,4] [--ops all_reduce,all_gather,broadcast] [--sizes 8:64M]
        [--repeats 3] [--ddp-steps 8] [--no-sweep] [--no-ddp] [--json FILE]

1. Collective sweep: for each rank count, op and size (float32 buffers,
   bytes per rank), gloo and dtrain are timed in alternation, --repeats
   times; each timing is a batch of back-to-back blocking calls after a
   warm-up, the slowest rank's mean. Columns as nccl-tests: time (us), algbw
   and busbw (GB/s; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for
   all_gather, x 1 for broadcast), medians of the repeats, and dtrain's
   busbw over gloo's (for the smallest sizes read the times).
2. DDP training step: the GPT of bench/compare-pytorch-ddp.py (pre-LN blocks,
   tied head), --layers x --dim, batch --batch x --seq, AdamW, 2 ranks x 1
   thread, DistributedDataParallel over each backend in alternation with the
   same two ranks training without any gradient exchange (the bound a free
   network would give); tokens/s (all ranks) is the median over steps after 2
   warm-up steps, then the median of the repeats. One process without DDP
   gives the scaling baseline.

Ranks meet through a FileStore; gloo runs on loopback (GLOO_SOCKET_IFNAME=lo).
Run it alone on the machine (flock -x /tmp/dtrain-cpu.lock ...).
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "broadcast": lambda n: 1.0}


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def human(b):
    for u, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f}{u}"
    return f"{b}"


def gpt_class():
    spec = importlib.util.spec_from_file_location(
        "compare_pytorch_ddp", os.path.join(HERE, "compare-pytorch-ddp.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GPT


# --------------------------------------------------------------------------
# Ranks
# --------------------------------------------------------------------------

def timed(dist, fn, pg, min_time):
    """Mean seconds per call of fn over a batch lasting about min_time, the
    slowest rank's (every rank runs the same number of calls)."""
    import torch
    fn()
    t0 = time.perf_counter()
    fn()
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX, group=pg)  # every rank agrees on the count
    iters = max(3, min(2000, int(min_time / max(one.item(), 1e-7))))
    for _ in range(min(iters, 20)):
        fn()
    dist.barrier(group=pg)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
    return t.item()


def sweep(a, rank, n, pgs):
    import torch
    import torch.distributed as dist
    rows = []
    for op in a.ops:
        for size in a.sizes:
            k = max(1, size // 4)
            x = torch.ones(k)
            outs = [torch.empty(k) for _ in range(n)]
            call = {"all_reduce": lambda pg: dist.all_reduce(x, group=pg),
                    "all_gather": lambda pg: dist.all_gather(outs, x, group=pg),
                    "broadcast": lambda pg: dist.broadcast(x, src=0, group=pg)}[op]
            times = {name: [] for name in pgs}
            for _ in range(a.repeats):
                for name, pg in pgs.items():
                    times[name].append(timed(dist, lambda: call(pg), pg, a.min_time))
            row = {"op": op, "ranks": n, "bytes": 4 * k}
            for name in pgs:
                t = statistics.median(times[name])
                algbw = (4 * k * (n if op == "all_gather" else 1)) / t / 1e9
                row[name] = {"us": t * 1e6, "algbw": algbw, "busbw": algbw * BUSBW[op](n),
                             "all_us": [x * 1e6 for x in times[name]]}
            rows.append(row)
            if rank == 0:
                print_row(row, file=sys.stderr)
    return rows


def ddp(a, rank, n, pgs):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    GPT = gpt_class()
    V = 65
    # "none": the same ranks training without any gradient exchange, the
    # bound DDP could reach with free communication.
    runs = dict(pgs, none=None)
    res = {name: [] for name in runs}
    for _ in range(a.repeats):
        for name, pg in runs.items():
            torch.manual_seed(1)
            model = GPT(a.layers, a.dim, a.heads, a.seq, V)
            net = model if pg is None else DDP(model, process_group=pg, bucket_cap_mb=a.bucket_mb)
            pg = pg or pgs["gloo"]  # for the barrier and the timing exchange
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
            g = torch.Generator().manual_seed(rank)
            times = []
            for step in range(a.ddp_steps + 2):
                x = torch.randint(V, (a.batch, a.seq + 1), generator=g)
                dist.barrier(group=pg)
                t0 = time.perf_counter()
                loss = net(x[:, :-1].contiguous(), x[:, 1:].contiguous())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t0)
            t = torch.tensor([statistics.median(times[2:])], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
            res[name].append(n * a.batch * a.seq / t.item())
            if rank == 0:
                print(f"  DDP {name}: {res[name][-1]:.0f} tokens/s", file=sys.stderr)
            del net, model, opt
    return {name: {"tokens_s": statistics.median(v), "all": v} for name, v in res.items()}


def rank_main(a):
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401 — registers "dtrain"
    torch.set_num_threads(1)
    rank, n = a.rank, a.world
    store = dist.FileStore(a.store, n)
    dist.init_process_group("dtrain", store=store, rank=rank, world_size=n)
    pgs = {"gloo": dist.new_group(backend="gloo"), "dtrain": dist.group.WORLD}
    out = {}
    if a.mode == "sweep":
        out["sweep"] = sweep(a, rank, n, pgs)
    else:
        out["ddp"] = ddp(a, rank, n, pgs)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def baseline(a):
    """Tokens/s of one process, one thread, no DDP: the scaling reference."""
    import torch
    torch.set_num_threads(1)
    GPT = gpt_class()
    torch.manual_seed(1)
    model = GPT(a.layers, a.dim, a.heads, a.seq, 65)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(a.ddp_steps + 2):
        x = torch.randint(65, (a.batch, a.seq + 1), generator=g)
        t0 = time.perf_counter()
        loss = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return a.batch * a.seq / statistics.median(times[2:])


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def print_row(r, file=sys.stdout):
    g, d = r["gloo"], r["dtrain"]
    print(f"| {r['op']} | {r['ranks']} | {human(r['bytes'])} | {g['us']:.1f} | {g['busbw']:.2f} | "
          f"{d['us']:.1f} | {d['busbw']:.2f} | {d['busbw'] / g['busbw']:.2f}x |", file=file)
    file.flush()


def rank_env():
    # One thread per rank: Debian's torch multiplies through OpenBLAS, whose
    # thread pool torch.set_num_threads() does not limit.
    return dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1")


def run_ranks(a, n, mode):
    with tempfile.TemporaryDirectory(prefix="dtrain-torch-bench-") as tmp:
        out = os.path.join(tmp, "out.json")
        env = rank_env()
        args = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--world", str(n),
                "--store", os.path.join(tmp, "store"), "--out", out] + a.passthrough
        procs = [subprocess.Popen(args + ["--rank", str(r)], env=env) for r in range(n)]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"torch-backend: a rank failed (exit codes {codes})")
        with open(out) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    p.add_argument("--sizes", default="8:64M", help="MIN:MAX bytes per rank; x8 steps to 1 MiB, then x4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.1, help="seconds per timed batch")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--ddp-steps", type=int, default=8)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--json")
    # internal: one rank
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.ops = a.ops.split(",")
    lo, hi = (parse_size(s) for s in a.sizes.split(":"))
    a.sizes = []
    s = lo
    while s <= hi:  # x8 steps below 1 MiB, x4 from there
        a.sizes.append(s)
        s *= 8 if s < (1 << 20) // 8 else 4 if s >= 1 << 20 else (1 << 20) // s
    if a.mode == "baseline":
        print(json.dumps(baseline(a)))
        return
    if a.mode:
        rank_main(a)
        return
    a.passthrough = ["--ops", ",".join(a.ops), "--sizes", f"{lo}:{hi}", "--repeats",
                     str(a.repeats), "--min-time", str(a.min_time), "--layers", str(a.layers),
                     "--dim", str(a.dim), "--heads", str(a.heads), "--seq", str(a.seq),
                     "--batch", str(a.batch), "--bucket-mb", str(a.bucket_mb), "--ddp-steps",
                     str(a.ddp_steps)]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    result = {"cpu": cpu, "cores": os.cpu_count(), "sweep": [], "ddp": {}}
    print(f"CPU: {cpu}, {os.cpu_count()} cores; medians of {a.repeats} alternating runs\n")
    if not a.no_sweep:
        for n in (int(x) for x in a.ranks.split(",")):
            result["sweep"] += run_ranks(a, n, "sweep")["sweep"]
        print("| Op | Ranks | Bytes | gloo us | gloo busbw | dtrain us | dtrain busbw | busbw ratio |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in result["sweep"]:
            print_row(r)
        print()
    if not a.no_ddp:
        base = float(subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--mode", "baseline"] + a.passthrough,
            env=rank_env(), check=True, capture_output=True, text=True).stdout)
        d = run_ranks(a, 2, "ddp")["ddp"]
        result["ddp"] = dict(d, baseline_1rank=base)
        print(f"DDP step, GPT {a.layers}x{a.dim}, batch {a.batch}x{a.seq}, 2 ranks x 1 thread:\n")
        print("| Run | tokens/s | |")
        print("| --- | --- | --- |")
        print(f"| 1 process, no DDP | {base:.0f} | |")
        g, t, f = (d[k]["tokens_s"] for k in ("gloo", "dtrain", "none"))
        print(f"| 2 ranks, no gradient exchange (the bound) | {f:.0f} | {f / base:.2f}x 1 process |")
        print(f"| DDP over gloo, 2 ranks | {g:.0f} | {g / base:.2f}x 1 process, {g / f:.0%} of the bound |")
        print(f"| DDP over dtrain, 2 ranks | {t:.0f} | {t / base:.2f}x 1 process, {t / f:.0%} of the bound; "
              f"**{t / g:.2f}x gloo** |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
