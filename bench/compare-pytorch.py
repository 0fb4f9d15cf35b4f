#!/usr/bin/python3
"""Training-step throughput of dtrain against PyTorch on the same work.

Run with Debian's interpreter (PyTorch 1.13 CPU):
    /usr/bin/python3 bench/compare-pytorch.py [--dtrain build/dtrain]
        [--config gpt2-124m:4:64 --config shakespeare-char:8:256] [--threads 1,2]
        [--steps 10] [--warmup 2] [--repeats 3] [--precision fp32|bf16]

For every (model, batch, seq, threads) both sides run the same GPT (tied LM
head, pre-LN, GELU(tanh), causal attention), fp32, one fixed random batch,
and the same step: zero grads, forward, backward, AdamW over all parameters.
dtrain is run as `dtrain bench train --json`; PyTorch in this process with
torch.set_num_threads(threads) and OpenBLAS's pool set to the same count
(torch's own setting does not reach it). The two alternate `repeats` times and the
medians are compared, so both see the same (possibly shared) machine.
PyTorch 1.13 has no fused attention on CPU: it uses the standard masked
softmax formulation (as nanoGPT does without flash support).

--precision bf16: PyTorch runs the forward under
torch.autocast("cpu", dtype=torch.bfloat16) (its mixed precision: linear
layers and matmuls in bf16 through oneDNN, fp32 master weights, backward
outside the autocast region as documented), dtrain runs
`bench train --precision bf16`; dtrain's fp32 step is timed in the same
rounds, so the table gives both "bf16 vs PyTorch autocast" and "bf16 vs
fp32" from one run on the same (possibly shared) machine.
"""
import argparse
import ctypes
import json
import math
import statistics
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "gpt2-124m": (12, 768, 12, 1024, 50257),
    "gpt2-350m": (24, 1024, 16, 1024, 50257),
    "shakespeare-char": (6, 384, 6, 256, 65),
    "tiny": (2, 64, 4, 64, 97),
}


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        hs = C // self.NH
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH, T) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        # GPT-2 initialisation, the same as dt_gpt_init_params. (PyTorch's
        # default N(0,1) embedding with a tied head gives logits of std ~sqrt(C),
        # a saturated softmax and denormal gradients that slow sgemm ~10x.)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if "proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, tgt):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head, as nanoGPT
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def set_blas_threads(threads):
    """Debian's torch calls OpenBLAS (libblas.so.3 -> libopenblas.so.0), whose
    own thread pool torch.set_num_threads() does not limit: without this a
    "1-thread" PyTorch run multiplies matrices on every core."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_set_num_threads(ctypes.c_int(threads))
        return lib.openblas_get_num_threads()
    except OSError:
        return None


def torch_run(model, B, T, threads, steps, warmup, precision="fp32"):
    L, C, NH, Tm, V = PRESETS[model]
    torch.set_num_threads(threads)
    got = set_blas_threads(threads)
    assert got in (None, threads), f"OpenBLAS threads {got}, wanted {threads}"
    torch.manual_seed(1)
    m = GPT(L, C, NH, Tm, V)
    decay = [p for p in m.parameters() if p.dim() == 2]
    other = [p for p in m.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(idx, tgt)
        else:
            loss = m(idx, tgt)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times[warmup:]) * 1e3
    return {"ms_per_step": ms, "tokens_per_s": B * T / (ms * 1e-3)}


def dtrain_run(binary, model, B, T, threads, steps, warmup, precision="fp32"):
    cmd = [binary, "bench", "train", "--model", model, "--batch", str(B), "--seq", str(T),
           "--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup),
           "--precision", precision, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r.get("precision", "fp32") == precision, r
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtrain", default="build/dtrain")
    ap.add_argument("--config", action="append",
                    help="MODEL:B:T (default gpt2-124m:4:64 and shakespeare-char:8:256)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: PyTorch autocast(bfloat16) vs dtrain --precision bf16, "
                    "with dtrain fp32 in the same rounds")
    a = ap.parse_args()
    configs = a.config or ["gpt2-124m:4:64", "shakespeare-char:8:256"]
    if a.precision == "fp32":
        fp32_table(a, configs)
    else:
        bf16_table(a, configs)


def fp32_table(a, configs):
    print(f"# torch {torch.__version__}, fp32, AdamW; median ms/step of {a.steps} steps after "
          f"{a.warmup} warm-up, median over {a.repeats} alternating repeats")
    print(f"{'model':<18} {'B':>3} {'T':>5} {'thr':>4} {'dtrain ms':>10} {'torch ms':>10} "
          f"{'dtrain tok/s':>13} {'torch tok/s':>12} {'ratio':>6} {'dtrain MFU':>10}")
    for cfg in configs:
        model, B, T = cfg.split(":")
        B, T = int(B), int(T)
        for threads in [int(t) for t in a.threads.split(",")]:
            d, p, mfu = [], [], []
            for _ in range(a.repeats):
                r = dtrain_run(a.dtrain, model, B, T, threads, a.steps, a.warmup)
                d.append(r["ms_per_step"])
                mfu.append(r["mfu"])
                p.append(torch_run(model, B, T, threads, a.steps, a.warmup)["ms_per_step"])
            dm, pm = statistics.median(d), statistics.median(p)
            print(f"{model:<18} {B:>3} {T:>5} {threads:>4} {dm:>10.1f} {pm:>10.1f} "
                  f"{B * T / dm * 1e3:>13.1f} {B * T / pm * 1e3:>12.1f} {pm / dm:>5.2f}x "
                  f"{statistics.median(mfu) * 100:>9.1f}%", flush=True)


def bf16_table(a, configs):
    """Per round: dtrain bf16, PyTorch autocast bf16, dtrain fp32; medians of
    each, and the two ratios of tokens/s the targets are stated in."""
    print(f"# torch {torch.__version__}, bf16: dtrain --precision bf16 vs torch.autocast(cpu, "
          f"bfloat16), and dtrain fp32; AdamW; median ms/step of {a.steps} steps after "
          f"{a.warmup} warm-up, median over {a.repeats} alternating rounds")
    print(f"{'model':<18} {'B':>3} {'T':>5} {'thr':>4} {'bf16 ms':>9} {'torch ms':>9} "
          f"{'fp32 ms':>9} {'bf16 tok/s':>11} {'torch tok/s':>12} {'fp32 tok/s':>11} "
          f"{'vs torch':>9} {'vs fp32':>8}")
    for cfg in configs:
        model, B, T = cfg.split(":")
        B, T = int(B), int(T)
        for threads in [int(t) for t in a.threads.split(",")]:
            h, p, f = [], [], []
            for _ in range(a.repeats):
                h.append(dtrain_run(a.dtrain, model, B, T, threads, a.steps, a.warmup,
                                    "bf16")["ms_per_step"])
                p.append(torch_run(model, B, T, threads, a.steps, a.warmup,
                                   "bf16")["ms_per_step"])
                f.append(dtrain_run(a.dtrain, model, B, T, threads, a.steps, a.warmup,
                                    "fp32")["ms_per_step"])
            hm, pm, fm = statistics.median(h), statistics.median(p), statistics.median(f)
            tok = [B * T / x * 1e3 for x in (hm, pm, fm)]
            print(f"{model:<18} {B:>3} {T:>5} {threads:>4} {hm:>9.1f} {pm:>9.1f} {fm:>9.1f} "
                  f"{tok[0]:>11.1f} {tok[1]:>12.1f} {tok[2]:>11.1f} {pm / hm:>8.2f}x "
                  f"{fm / hm:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
