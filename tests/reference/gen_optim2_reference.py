#!/usr/bin/python3
"""Write tests/reference/optim2_reference.txt: independent references for the
optimizers beyond AdamW and SGD, used by tests/unit/test_optim2.c.

Run with Debian's python3-torch (PyTorch 1.13 CPU) and numpy:
    /usr/bin/python3 tests/reference/gen_optim2_reference.py

Where PyTorch 1.13 has the optimizer, it is the reference: RAdam (its decay
made decoupled by decaying p before each step, as PyTorch 2's
decoupled_weight_decay does), L-BFGS with and without the strong-Wolfe line
search, and AdamW for Lookahead and gradient centralisation (wrapped here in
a few lines). LAMB, LARS and Adafactor are written in numpy, in float64,
from the papers' equations (You et al. 2020 algorithm 2; You et al. 2017 as
timm's Lars; Shazeer & Stern 2018 as transformers.Adafactor), not from the
C code.

Format: one array per line, `name count v0 v1 ...` (9 significant digits for
float32 data, 17 for float64 results).
"""
import math
import os
import sys

import numpy as np
import torch

torch.manual_seed(4321)
torch.set_num_threads(1)

STEPS = 8
# The tensor table: a 7 x 9 matrix (decayed), a 13-vector (no decay), a
# 5 x 16 matrix (decayed). Odd sizes exercise the vector tails.
TENSORS = [(0, 7, 9, True), (63, 1, 13, False), (76, 5, 16, True)]
N = 156

out_lines = []


def put(name, values, fmt="%.9g"):
    vals = [float(v) for v in values]
    out_lines.append("%s %d %s" % (name, len(vals), " ".join(fmt % v for v in vals)))


params0 = torch.randn(N, dtype=torch.float32)
grads = [torch.randn(N, dtype=torch.float32) * (0.5 + 0.25 * k) for k in range(STEPS)]
put("params0", params0.tolist())
for k in range(STEPS):
    put("grads%d" % k, grads[k].tolist())
put("tensors", [v for t in TENSORS for v in t])

LR, B1, B2, EPS, WD = 1e-2, 0.9, 0.95, 1e-8, 0.1
put("hparams", [LR, B1, B2, EPS, WD], fmt="%.17g")


def views(x):
    return [x[o:o + r * c] for (o, r, c, _) in TENSORS]


def torch_run(make_opt, pre_step=None, grad_fn=None):
    ps = [t.clone().requires_grad_(True) for t in views(params0)]
    opt = make_opt(ps)
    for k in range(STEPS):
        for p, g in zip(ps, views(grads[k])):
            p.grad = g.clone()
        if grad_fn:
            grad_fn(ps)
        if pre_step:
            pre_step(ps, k)
        opt.step()
    return torch.cat([p.detach() for p in ps]).tolist()


def groups(ps):
    return [{"params": [p], "weight_decay": WD if d else 0.0} for p, (_, _, _, d) in
            zip(ps, TENSORS)]


# RAdam with decoupled decay.
def radam_decay(ps, k):
    with torch.no_grad():
        for p, (_, _, _, d) in zip(ps, TENSORS):
            if d:
                p.mul_(1 - LR * WD)


put("radam_out", torch_run(lambda ps: torch.optim.RAdam(ps, lr=LR, betas=(B1, B2), eps=EPS,
                                                          foreach=False), pre_step=radam_decay))


# Lookahead around AdamW: k = 3, alpha = 0.5.
LA_K, LA_ALPHA = 3, 0.5
put("lookahead_hparams", [LA_K, LA_ALPHA], fmt="%.17g")


def lookahead_run():
    ps = [t.clone().requires_grad_(True) for t in views(params0)]
    slow = [p.detach().clone() for p in ps]
    opt = torch.optim.AdamW(groups(ps), lr=LR, betas=(B1, B2), eps=EPS, foreach=False)
    for k in range(STEPS):
        for p, g in zip(ps, views(grads[k])):
            p.grad = g.clone()
        opt.step()
        if (k + 1) % LA_K == 0:
            with torch.no_grad():
                for p, s in zip(ps, slow):
                    s.add_(p - s, alpha=LA_ALPHA)
                    p.copy_(s)
    return torch.cat([p.detach() for p in ps]).tolist()


put("lookahead_out", lookahead_run())


# Gradient centralisation, then AdamW: each matrix row's gradient minus its mean.
def centralize(ps):
    for p, (_, r, c, _) in zip(ps, TENSORS):
        if r > 1:
            g = p.grad.view(r, c)
            g.sub_(g.mean(dim=1, keepdim=True))


put("gc_adamw_out", torch_run(lambda ps: torch.optim.AdamW(groups(ps), lr=LR, betas=(B1, B2),
                                                             eps=EPS, foreach=False),
                              grad_fn=centralize))

# ---- numpy references (float64) -------------------------------------------

P0 = params0.double().numpy()
G = [g.double().numpy() for g in grads]


def np_views(x):
    return [x[o:o + r * c] for (o, r, c, _) in TENSORS]


def lamb_run():
    p = P0.copy()
    m = np.zeros(N)
    v = np.zeros(N)
    for k in range(STEPS):
        t = k + 1
        for (o, r, c, d), pv, gv, mv, vv in zip(TENSORS, np_views(p), np_views(G[k]),
                                              np_views(m), np_views(v)):
            mv[:] = B1 * mv + (1 - B1) * gv
            vv[:] = B2 * vv + (1 - B2) * gv * gv
            mh = mv / (1 - B1 ** t)
            vh = vv / (1 - B2 ** t)
            u = mh / (np.sqrt(vh) + EPS) + (WD if d else 0.0) * pv
            pn, un = np.linalg.norm(pv), np.linalg.norm(u)
            ratio = pn / un if d and pn > 0 and un > 0 else 1.0
            pv -= LR * ratio * u
    return p


put("lamb_out", lamb_run(), fmt="%.17g")

LARS_LR, LARS_MOM, LARS_ETA, LARS_EPS = 0.5, 0.9, 1e-3, 1e-8
put("lars_hparams", [LARS_LR, LARS_MOM, LARS_ETA, LARS_EPS], fmt="%.17g")


def lars_run(nesterov):
    p = P0.copy()
    b = np.zeros(N)
    for k in range(STEPS):
        for (o, r, c, d), pv, gv, bv in zip(TENSORS, np_views(p), np_views(G[k]), np_views(b)):
            wd = WD if d else 0.0
            wn, gn = np.linalg.norm(pv), np.linalg.norm(gv)
            trust = LARS_ETA * wn / (gn + wd * wn + LARS_EPS) if d and wn > 0 and gn > 0 else 1.0
            dv = (gv + wd * pv) * trust
            bv[:] = LARS_MOM * bv + dv
            dv = dv + LARS_MOM * bv if nesterov else bv.copy()
            pv -= LARS_LR * dv
    return p


put("lars_out", lars_run(False), fmt="%.17g")
put("lars_nesterov_out", lars_run(True), fmt="%.17g")

AF_DECAY, AF_EPS1, AF_EPS2, AF_CLIP = -0.8, 1e-30, 1e-3, 1.0
put("adafactor_hparams", [AF_DECAY, AF_EPS1, AF_EPS2, AF_CLIP], fmt="%.17g")


def rms(x):
    return np.sqrt(np.mean(x * x))


def adafactor_run(beta1, relative_step, scale_parameter, lr):
    p = P0.copy()
    state = {}
    for k in range(STEPS):
        t = k + 1
        for i, ((o, r, c, d), pv, gv) in enumerate(zip(TENSORS, np_views(p), np_views(G[k]))):
            s = state.setdefault(i, {})
            rel = min(1e-2, 1 / math.sqrt(t)) if relative_step else lr
            lr_t = rel * (max(AF_EPS2, rms(pv)) if scale_parameter else 1.0)
            b2t = 1.0 - t ** AF_DECAY
            upd = gv * gv + AF_EPS1
            if r > 1:
                g2 = upd.reshape(r, c)
                s["R"] = s.get("R", np.zeros(r)) * b2t + (1 - b2t) * g2.mean(axis=1)
                s["C"] = s.get("C", np.zeros(c)) * b2t + (1 - b2t) * g2.mean(axis=0)
                rf = 1 / np.sqrt(s["R"] / s["R"].mean())
                cf = 1 / np.sqrt(s["C"])
                u = (np.outer(rf, cf) * gv.reshape(r, c)).reshape(-1)
            else:
                s["V"] = s.get("V", np.zeros(r * c)) * b2t + (1 - b2t) * upd
                u = gv / np.sqrt(s["V"])
            u = u / max(1.0, rms(u) / AF_CLIP) * lr_t
            if beta1 > 0:
                s["m"] = s.get("m", np.zeros(r * c)) * beta1 + (1 - beta1) * u
                u = s["m"]
            if d:
                pv -= WD * lr_t * pv
            pv -= u
    return p


put("adafactor_out", adafactor_run(0.0, True, True, None), fmt="%.17g")
put("adafactor_m_out", adafactor_run(0.9, False, False, 0.05), fmt="%.17g")

# ---- L-BFGS on f(x) = sum(a/2 (x - c)^2 + (x - c)^4 / 10) -------------------

LB_N = 37
lb_a = torch.rand(LB_N, dtype=torch.float32) * 2.5 + 0.5
lb_c = torch.randn(LB_N, dtype=torch.float32)
lb_x0 = torch.randn(LB_N, dtype=torch.float32) * 2
put("lbfgs_a", lb_a.tolist())
put("lbfgs_c", lb_c.tolist())
put("lbfgs_x0", lb_x0.tolist())


def lbfgs_run(name, steps, **kw):
    x = lb_x0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([x], **kw)

    def closure():
        opt.zero_grad()
        d = x - lb_c
        f = (0.5 * lb_a * d * d + 0.1 * d ** 4).sum()
        f.backward()
        return f

    evals = []
    for s in range(steps):
        opt.step(closure)
        evals.append(opt.state[x]["func_evals"])
        put("%s_x%d" % (name, s), x.detach().tolist())
    put("%s_evals" % name, evals)


LB_LS = dict(lr=1.0, history_size=5, max_iter=6, line_search_fn="strong_wolfe")
put("lbfgs_ls_hparams", [1.0, 5, 6, 3], fmt="%.17g")
lbfgs_run("lbfgs_ls", 3, **LB_LS)
LB_FIXED = dict(lr=0.2, history_size=3, max_iter=4)
put("lbfgs_fixed_hparams", [0.2, 3, 4, 2], fmt="%.17g")
lbfgs_run("lbfgs_fixed", 2, **LB_FIXED)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim2_reference.txt")
with open(path, "w") as f:
    f.write("# written by gen_optim2_reference.py with torch %s, numpy %s; do not edit\n" %
            (torch.__version__, np.__version__))
    f.write("\n".join(out_lines) + "\n")
print("wrote %s (%d bytes)" % (path, os.path.getsize(path)), file=sys.stderr)
