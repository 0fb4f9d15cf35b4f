#!/usr/bin/python3
"""Write tests/reference/kfac_reference.txt: K-FAC for one linear layer and
a bias, in float64 numpy from the equations of Martens & Grosse (2015) with
the factored Tikhonov damping of their section 6.3, the KL clip of Ba et al.
(2017) and SGD with momentum as torch.optim.SGD (not from the C code);
used by tests/unit/test_optim2.c.

    /usr/bin/python3 tests/reference/gen_kfac_reference.py

Per step: A = E[x x^T], G = E[g g^T] (g = dy / scale, each token's
gradient), running averages with decay `ema` (the first step takes the
step's own), inverses every `inv_every` updates of A + pi sqrt(damping) I
and G + sqrt(damping) / pi I, pi = sqrt((tr A / in) / (tr G / out));
U = Ginv dW Ainv scaled by nu = min(1, sqrt(kl_clip / (lr^2 <U, dW>)));
then d = U + wd p, buf = momentum buf + d, p -= lr buf (the bias: its own
gradient, no decay).

Format as optim2_reference.txt: `name count v0 v1 ...`.
"""
import os

import numpy as np

rng = np.random.default_rng(2605)
OUT, IN, N, STEPS = 6, 5, 7, 5
LR, DAMP, INV_EVERY, EMA, KL, MOM, WD, SCALE = 0.1, 0.01, 2, 0.8, 0.05, 0.9, 0.01, 0.5


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


W = f32(rng.standard_normal((OUT, IN)) * 0.5)
b = f32(rng.standard_normal(OUT) * 0.1)
xs = [f32(rng.standard_normal((N, IN))) for _ in range(STEPS)]
dys = [f32(rng.standard_normal((N, OUT)) * SCALE / N) for _ in range(STEPS)]
gWs = [f32(rng.standard_normal((OUT, IN)) * 0.1) for _ in range(STEPS)]
gbs = [f32(rng.standard_normal(OUT) * 0.1) for _ in range(STEPS)]

lines = []


def put(name, a):
    a = np.asarray(a, dtype=np.float64).ravel()
    lines.append("%s %d %s" % (name, a.size, " ".join("%.17g" % v for v in a)))


put("kfac_config", [OUT, IN, N, STEPS, LR, DAMP, INV_EVERY, EMA, KL, MOM, WD, SCALE])
put("kfac_w0", W)
put("kfac_b0", b)
for k in range(STEPS):
    put("kfac_x%d" % k, xs[k])
    put("kfac_dy%d" % k, dys[k])
    put("kfac_gw%d" % k, gWs[k])
    put("kfac_gb%d" % k, gbs[k])

A = G = Ainv = Ginv = None
bufW = np.zeros_like(W)
bufb = np.zeros_like(b)
nus = []
for k in range(STEPS):
    x, g = xs[k], dys[k] / SCALE
    As, Gs = x.T @ x / N, g.T @ g / N
    A = As if k == 0 else EMA * A + (1 - EMA) * As
    G = Gs if k == 0 else EMA * G + (1 - EMA) * Gs
    if k % INV_EVERY == 0:
        pi = np.sqrt((np.trace(A) / IN) / (np.trace(G) / OUT))
        Ainv = np.linalg.inv(A + pi * np.sqrt(DAMP) * np.eye(IN))
        Ginv = np.linalg.inv(G + np.sqrt(DAMP) / pi * np.eye(OUT))
    U = Ginv @ gWs[k] @ Ainv
    vg = LR * LR * np.sum(U * gWs[k])
    nu = min(1.0, np.sqrt(KL / vg)) if vg > 0 else 1.0
    nus.append(nu)
    U = nu * U
    d = U + WD * W
    bufW = MOM * bufW + d
    W = W - LR * bufW
    bufb = MOM * bufb + gbs[k]
    b = b - LR * bufb
put("kfac_nu", nus)
put("kfac_w", W)
put("kfac_b", b)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kfac_reference.txt")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
print("wrote", path, "nu per step:", ["%.4f" % v for v in nus])
