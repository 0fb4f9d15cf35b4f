#!/usr/bin/python3
"""Write the PyTorch reference fixtures for tests/unit/test_gpt_reference.c.

Run with Debian's interpreter (PyTorch 1.13 CPU):
    /usr/bin/python3 tests/reference/gen_gpt_reference.py [OUTDIR]
OUTDIR defaults to tests/data. The C test needs no Python.

The model is written out functionally here (not taken from dtrain) so that it
is an independent reference: token + position embedding, L pre-LN blocks of
causal self-attention (naive, masked softmax) and a 4x GELU(tanh) MLP, final
LayerNorm, LM head tied to wte, mean cross-entropy. Everything is computed in
float64 and stored as float32, so the C side is compared against the exact
answer rather than against another float32 summation order.

AdamW (torch.optim.AdamW, decoupled weight decay, bias correction) runs 3
steps on the same batch with lr=1e-3, betas=(0.9, 0.95), eps=1e-4 and
weight_decay=0.1 applied only to 2-D tensors (wte, wpe and the linear
weights); biases and LayerNorm parameters get weight_decay=0. This is what
dt_param_info.decay says on the C side.

Why eps=1e-4 and not PyTorch's default 1e-8: some gradients are zero in
exact arithmetic (the key bias: softmax ignores a score shift common to all
keys, so sum_j dk_j = 0) and their float32 value is pure rounding noise
~1e-9. Adam turns a gradient g near zero into the step lr*g/(|g|+eps), which
amplifies that noise by lr/eps; the same holds for any gradient that is
small through cancellation. With lr/eps = 10 the amplified noise stays
~1e-8, well below the 1e-5 relative tolerance, while most gradients
(~1e-3) are still far above eps, so the steps are genuinely Adam-normalised
and move parameters by ~10% of their size. With eps=1e-8 any float32
implementation (PyTorch's own included) misses the float64 answer by orders
of magnitude on those elements.

File layout (little-endian):
  u32 magic "DTGR" (0x52475444), u32 version 1
  i32 layers, dim, heads, max_seq, vocab, B, T
  f32 lr, beta1, beta2, eps, weight_decay; i32 adam_steps
  i32 inputs[B*T], i32 targets[B*T]
  f32 params[N]           dtrain's layer-major layout (see include/dtrain/nn.h)
  f32 logits[B*T*V], f32 loss
  f32 grads[N]            d(mean loss)/d(params)
  f32 params_after[N]     after adam_steps AdamW steps
"""
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = 0x52475444
VERSION = 1
LR, BETA1, BETA2, EPS, WD, STEPS = 1e-3, 0.9, 0.95, 1e-4, 0.1, 3

BLOCK = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def make_params(L, C, T, V, gen):
    """Parameters in dtrain's buffer order: list of (name, tensor)."""
    def randn(*shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std
    p = [("wte", randn(V, C, std=0.1)), ("wpe", randn(T, C, std=0.05))]
    shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (3 * C, C),
              "attn.c_attn.bias": (3 * C,), "attn.c_proj.weight": (C, C),
              "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
              "mlp.c_fc.weight": (4 * C, C), "mlp.c_fc.bias": (4 * C,),
              "mlp.c_proj.weight": (C, 4 * C), "mlp.c_proj.bias": (C,)}
    for l in range(L):
        for n in BLOCK:
            shp = shapes[n]
            if n.startswith("ln") and n.endswith("weight"):
                t = 1.0 + randn(*shp, std=0.1)
            elif n.endswith("bias"):
                t = randn(*shp, std=0.02)
            else:
                t = randn(*shp, std=0.5 / shp[1] ** 0.5)
            p.append((f"h.{l}.{n}", t))
    p.append(("ln_f.weight", 1.0 + randn(C, std=0.1)))
    p.append(("ln_f.bias", randn(C, std=0.02)))
    return p


def forward(P, idx, tgt, L, C, NH):
    B, T = idx.shape
    HS = C // NH
    x = P["wte"][idx] + P["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        g = lambda n: P[f"h.{l}.{n}"]
        h = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), eps=1e-5)
        qkv = F.linear(h, g("attn.c_attn.weight"), g("attn.c_attn.bias"))
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, HS).transpose(1, 2)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / HS ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, g("attn.c_proj.weight"), g("attn.c_proj.bias"))
        h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), eps=1e-5)
        h = F.gelu(F.linear(h, g("mlp.c_fc.weight"), g("mlp.c_fc.bias")), approximate="tanh")
        x = x + F.linear(h, g("mlp.c_proj.weight"), g("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    logits = x @ P["wte"].t()
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
    return logits, loss


def flat(ts):
    return np.concatenate([t.detach().numpy().astype(np.float32).ravel() for t in ts])


def generate(path, L, C, NH, T_max, V, B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    plist = make_params(L, C, T_max, V, gen)
    names = [n for n, _ in plist]
    tensors = [t.clone().requires_grad_(True) for _, t in plist]
    P = dict(zip(names, tensors))
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    params0 = flat(tensors)

    logits, loss = forward(P, idx, tgt, L, C, NH)
    loss.backward()
    grads = flat([t.grad for t in tensors])

    decay = [t for t in tensors if t.dim() == 2]
    no_decay = [t for t in tensors if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    # Step 1 uses the gradients computed above; steps 2..3 recompute them.
    for s in range(STEPS):
        if s > 0:
            opt.zero_grad()
            _, l2 = forward(P, idx, tgt, L, C, NH)
            l2.backward()
        opt.step()
    after = flat(tensors)

    with open(path, "wb") as f:
        f.write(struct.pack("<IIiiiiiii", MAGIC, VERSION, L, C, NH, T_max, V, B, T))
        f.write(struct.pack("<fffffi", LR, BETA1, BETA2, EPS, WD, STEPS))
        f.write(idx.numpy().astype("<i4").tobytes())
        f.write(tgt.numpy().astype("<i4").tobytes())
        f.write(params0.astype("<f4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", float(loss)))
        f.write(grads.astype("<f4").tobytes())
        f.write(after.astype("<f4").tobytes())
    print(f"{path}: L={L} C={C} NH={NH} maxT={T_max} V={V} B={B} T={T} "
          f"params={params0.size} loss={float(loss):.6f} bytes={os.path.getsize(path)}")


def main():
    torch.set_default_dtype(torch.float64)
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "data")
    os.makedirs(out, exist_ok=True)
    # A: T a multiple of the attention block (64); B: T = 77 crosses a block
    # boundary and leaves a partial block.
    generate(os.path.join(out, "gpt_ref_a.bin"), L=2, C=32, NH=2, T_max=80, V=53, B=2, T=64,
             seed=1234)
    generate(os.path.join(out, "gpt_ref_b.bin"), L=2, C=48, NH=4, T_max=90, V=67, B=2, T=77,
             seed=5678)


if __name__ == "__main__":
    main()
