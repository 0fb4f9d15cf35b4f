#!/usr/bin/python3
"""Write tests/reference/optim_reference.txt: PyTorch's AdamW, SGD and
clip_grad_norm_ results and PyTorch-scheduler learning-rate curves, used by
tests/unit/test_optim.c as an independent reference.

Run with Debian's python3-torch (PyTorch 1.13 CPU):
    /usr/bin/python3 tests/reference/gen_optim_reference.py

Format: one array per line, `name count v0 v1 ...`; float32 arrays are
printed with 9 significant digits (exact round trip), learning rates (Python
doubles) with 17.
"""
import math
import os
import sys

import torch

torch.manual_seed(1234)
torch.set_num_threads(1)

STEPS = 5
N_DECAY, N_NODECAY = 67, 33  # odd sizes: exercise the vector tails
N = N_DECAY + N_NODECAY

out_lines = []


def put(name, values, fmt="%.9g"):
    vals = [float(v) for v in values]
    out_lines.append("%s %d %s" % (name, len(vals), " ".join(fmt % v for v in vals)))


params0 = torch.randn(N, dtype=torch.float32)
grads = [torch.randn(N, dtype=torch.float32) * (0.5 + k) for k in range(STEPS)]
put("params0", params0.tolist())
for k in range(STEPS):
    put("grads%d" % k, grads[k].tolist())


def run(make_opt):
    a = params0[:N_DECAY].clone().requires_grad_(True)
    b = params0[N_DECAY:].clone().requires_grad_(True)
    opt = make_opt(a, b)
    for k in range(STEPS):
        a.grad = grads[k][:N_DECAY].clone()
        b.grad = grads[k][N_DECAY:].clone()
        opt.step()
    return torch.cat([a.detach(), b.detach()]).tolist()


# AdamW: decayed group and a no-decay group (biases, norms).
ADAM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
WD = 0.1
put("adamw_hparams", [ADAM["lr"], ADAM["betas"][0], ADAM["betas"][1], ADAM["eps"], WD])
put("adamw_out", run(lambda a, b: torch.optim.AdamW(
    [{"params": [a], "weight_decay": WD}, {"params": [b], "weight_decay": 0.0}],
    foreach=False, **ADAM)))

# SGD variants: (momentum, nesterov, weight_decay)
SGD_LR = 5e-2
SGD_CASES = [(0.0, False, 0.0), (0.9, False, 0.01), (0.9, True, 0.01)]
put("sgd_lr", [SGD_LR])
for i, (mom, nest, wd) in enumerate(SGD_CASES):
    put("sgd%d_hparams" % i, [mom, 1.0 if nest else 0.0, wd])
    put("sgd%d_out" % i, run(lambda a, b: torch.optim.SGD(
        [a, b], lr=SGD_LR, momentum=mom, nesterov=nest, weight_decay=wd, foreach=False)))

# Global-norm clipping of the first gradient to a norm below its own.
g = grads[0].clone().requires_grad_(False)
p = torch.zeros(N, requires_grad=True)
p.grad = g.clone()
MAX_NORM = 2.0
total = torch.nn.utils.clip_grad_norm_([p], MAX_NORM)
put("clip_max_norm", [MAX_NORM])
put("clip_total_norm", [total.item()])
put("clip_out", p.grad.tolist())

# Learning-rate curves from PyTorch's own schedulers, stepped piecewise:
# warmup with LinearLR, then ConstantLR / LinearLR / CosineAnnealingLR; the
# inverse square root (no PyTorch class) through LambdaLR.
BASE, MIN, WARM, TOTAL, LEN = 3e-3, 3e-4, 10, 100, 120
put("sched_hparams", [BASE, MIN, WARM, TOTAL, LEN], fmt="%.17g")


def curve(after_warmup, stops_at_total=True):
    lrs = []
    w = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE)
    sw = torch.optim.lr_scheduler.LinearLR(w, start_factor=1.0 / WARM, end_factor=1.0,
                                           total_iters=WARM - 1)
    for _ in range(WARM):
        lrs.append(w.param_groups[0]["lr"])
        w.step()
        sw.step()
    d = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE)
    sd = after_warmup(d)
    for step in range(WARM, LEN):
        lrs.append(d.param_groups[0]["lr"])
        d.step()
        if not stops_at_total or step < TOTAL:
            sd.step()  # linear/cosine stay at the floor past `total`
    return lrs


put("sched_constant", curve(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0)),
    fmt="%.17g")
put("sched_linear", curve(lambda o: torch.optim.lr_scheduler.LinearLR(
    o, start_factor=1.0, end_factor=MIN / BASE, total_iters=TOTAL - WARM)), fmt="%.17g")
put("sched_cosine", curve(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
    o, T_max=TOTAL - WARM, eta_min=MIN)), fmt="%.17g")
put("sched_invsqrt", curve(lambda o: torch.optim.lr_scheduler.LambdaLR(
    o, lambda s: max(MIN / BASE, math.sqrt(WARM / (s + WARM + 1)))), False), fmt="%.17g")

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_reference.txt")
with open(path, "w") as f:
    f.write("# written by gen_optim_reference.py with torch %s; do not edit\n" % torch.__version__)
    f.write("\n".join(out_lines) + "\n")
print("wrote %s (%d bytes)" % (path, os.path.getsize(path)), file=sys.stderr)
