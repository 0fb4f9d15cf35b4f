#!/usr/bin/python3
"""dtrain DDP vs PyTorch DistributedDataParallel, same model, same batch, same run.

    /usr/bin/python3 bench/compare-pytorch-ddp.py [--dtrain build/dtrain] [--data FILE]
        [--layers 4 --dim 128 --heads 4 --seq 128 --batch 8 --steps 30] [--bucket-size 1M]
        [--repeats 3]

Runs, one after another on this machine, each --repeats times:
  1. dtrain train, 1 rank x 1 thread         (the weak-scaling baseline)
  2. dtrain train --nproc 2, 2 ranks x 1 thread
  3. PyTorch 1.13 DDP (gloo), 2 processes x 1 thread, the same GPT (pre-LN
     blocks, GELU(tanh) MLP, tied LM head), AdamW, the same per-rank batch and
     sequence length, bucket_cap_mb equal to --bucket-size.
Tokens/s are per run the median over steps after the first 3 (all ranks'
tokens); the table shows the median of the repeats and the ratios. dtrain's
exposed-communication fraction is the median over steps of exposed_comm_ms /
comm_ms from its metrics.jsonl. The machine may be shared: ratios measured
in the same run are what to quote.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.NH) ** 0.5)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def torch_worker(rank, world, a, tokens, V, port, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = GPT(a.layers, a.dim, a.heads, a.seq, V)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(rank)
    n = tokens.numel() - a.seq - 1
    times = []
    cpu0 = None
    for step in range(a.steps):
        if step == 3:
            cpu0 = time.process_time()
        ix = torch.randint(n, (a.batch,), generator=g)
        x = torch.stack([tokens[i:i + a.seq] for i in ix])
        y = torch.stack([tokens[i + 1:i + 1 + a.seq] for i in ix])
        t0 = time.perf_counter()
        loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        dist.all_reduce(loss.detach())
        times.append(time.perf_counter() - t0)
    cpu = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
    dist.all_reduce(cpu)  # CPU seconds of both ranks
    if rank == 0:
        out.put(([world * a.batch * a.seq / t for t in times[3:]], cpu.item()))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(a, tokens, V):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_worker, args=(r, 2, a, tokens, V, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = None
    deadline = time.time() + 1800
    while res is None:
        try:
            res = q.get(timeout=2)
        except Exception:  # queue.Empty: check that no worker died
            if any(p.exitcode is not None for p in procs) or time.time() > deadline:
                for p in procs:
                    p.terminate()
                raise RuntimeError(f"torch worker failed (exit codes "
                                   f"{[p.exitcode for p in procs]})")
    for p in procs:
        p.join(timeout=60)
        if p.exitcode is None:
            p.terminate()
    tokens = 2 * a.batch * a.seq * (a.steps - 3)
    return statistics.median(res[0]), res[1] / tokens * 1e3  # tokens/s, CPU ms per token


def run_dtrain(a, nproc, tmp):
    run = os.path.join(tmp, f"run{nproc}")
    cmd = [a.dtrain, "train", "--data", a.data, "--layers", str(a.layers), "--dim", str(a.dim),
           "--heads", str(a.heads), "--seq", str(a.seq), "--model", "shakespeare-char",
           "--batch", str(a.batch), "--steps", str(a.steps), "--nproc", str(nproc),
           "--threads", "1", "--bucket-size", a.bucket_size, "--run-dir", run,
           "--val-split", "0", "--sample-tokens", "0", "--progress", "plain",
           "--log-every", "1000000", "--peak-flops", "1e9"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    cpu_ms_per_token = cpu / (nproc * a.batch * a.seq * a.steps) * 1e3  # all steps + startup
    rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))][3:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    frac = [r["exposed_comm_ms"] / r["comm_ms"] for r in rows if r["comm_ms"] > 0]
    return tps, (statistics.median(frac) if frac else float("nan")), cpu_ms_per_token


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtrain", default="build/dtrain")
    p.add_argument("--data", default=None,
                   help="text file (default: ../shared/data/tinyshakespeare.txt next to the "
                        "checkout, else the fortunes package's text)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--bucket-size", default="1M")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    if a.data is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for cand in (os.path.join(root, "..", "shared", "data", "tinyshakespeare.txt"),
                     os.path.join(root, "..", "..", "shared", "data", "tinyshakespeare.txt"),
                     "/usr/share/games/fortunes/fortunes"):
            if os.path.exists(cand):
                a.data = os.path.normpath(cand)
                break
    s = a.bucket_size.upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    a.bucket_mb = float(s.rstrip("KMG")) * mult / (1 << 20)
    text = open(a.data, "rb").read()
    vocab = sorted(set(text))
    lut = {b: i for i, b in enumerate(vocab)}
    tokens = torch.tensor([lut[b] for b in text], dtype=torch.long)
    print(f"model L{a.layers} C{a.dim} NH{a.heads} T{a.seq} V{len(vocab)}, batch {a.batch}/rank, "
          f"{a.steps} steps, bucket {a.bucket_size}, data {a.data}; {a.repeats} repeats "
          f"(machine may be shared)")
    one, two, frac, pt = [], [], [], []
    c1, c2, cpt = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            t, _, c = run_dtrain(a, 1, tmp)
            one.append(t)
            c1.append(c)
            t, f, c = run_dtrain(a, 2, tmp)
            two.append(t)
            frac.append(f)
            c2.append(c)
            t, c = run_torch(a, tokens, len(vocab))
            pt.append(t)
            cpt.append(c)
            print(f"  repeat {r + 1}: dtrain 1 rank {one[-1]:.0f} tok/s, 2 ranks {two[-1]:.0f} "
                  f"(exposed/comm {f:.2f}), torch DDP 2 ranks {pt[-1]:.0f}", flush=True)
    m1, m2, mp_, mf = (statistics.median(x) for x in (one, two, pt, frac))
    k1, k2, kp = (statistics.median(x) for x in (c1, c2, cpt))
    print(f"{'run':32} {'tokens/s':>10} {'CPU ms/token':>13}")
    print(f"{'dtrain 1 rank x 1 thread':32} {m1:10.0f} {k1:13.4f}")
    print(f"{'dtrain 2 ranks x 1 thread':32} {m2:10.0f} {k2:13.4f}   weak scaling {m2 / m1:.2f}x "
          f"(by CPU per token: {2 * k1 / k2:.2f}x), exposed comm {100 * mf:.0f}% of comm")
    print(f"{'torch DDP gloo 2 x 1 thread':32} {mp_:10.0f} {kp:13.4f}   dtrain / torch = "
          f"{m2 / mp_:.2f}x (by CPU per token: {kp / k2:.2f}x)")
    print("CPU ms/token: all CPU time of the job's processes per token processed (dtrain: the "
          "whole run incl. start-up; torch: the timed steps only); on a shared machine it shows "
          "what wall-clock ratios would be on an idle one.")


if __name__ == "__main__":
    main()
