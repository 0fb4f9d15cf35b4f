#!/usr/bin/python3
"""Write tests/reference/onebit_reference.txt: 1-bit Adam (Tang et al. 2021,
algorithm 1, with one stage of compression as dtrain's allgather of sign
encodings does) and 1-bit LAMB (Li et al. 2021, with the trust ratios frozen
at the end of the warm-up) for two workers, in float64 numpy from the
equations (not from the C code); used by tests/unit/test_optim2.c. Two
tensors: a matrix of DECAYED values (weight decay; LAMB's trust ratio) and
a vector (no decay, ratio 1).

    /usr/bin/python3 tests/reference/gen_onebit_reference.py

Warm-up (steps before FREEZE): AdamW on the workers' mean gradient
(decoupled decay, bias corrections). At FREEZE, v becomes v / (1 - beta2^t)
and stays. Compression stage: each worker's momentum m_r = beta1 m +
(1 - beta1) g_r is compressed with error feedback, c_r = C(m_r + e_r),
e_r <- m_r + e_r - c_r, where C is the scaled sign: per block of 256 values,
sign(x) (+ for 0) times the block's mean |x|; m = mean_r c_r; then
p *= 1 - lr wd; p -= (lr / (1 - beta1^t)) m / (sqrt(v) + eps).

Format as optim2_reference.txt: `name count v0 v1 ...`.
"""
import os

import numpy as np

rng = np.random.default_rng(261)
N, STEPS, FREEZE, W = 300, 9, 3, 2
LR, B1, B2, EPS, WD, BLOCK = 1e-2, 0.9, 0.999, 1e-8, 0.01, 256


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


DECAYED = 200
decay = np.array([1.0] * DECAYED + [0.0] * (N - DECAYED))
p = f32(rng.standard_normal(N))
p0 = p.copy()
grads = [[f32(rng.standard_normal(N) * 0.1 + 0.02 * r) for r in range(W)] for _ in range(STEPS)]
lines = []


def put(name, a):
    a = np.asarray(a, dtype=np.float64).ravel()
    lines.append("%s %d %s" % (name, a.size, " ".join("%.17g" % v for v in a)))


def scaled_sign(x):
    out = np.empty_like(x)
    for b in range(0, len(x), BLOCK):
        blk = x[b:b + BLOCK]
        out[b:b + BLOCK] = np.where(blk < 0, -1.0, 1.0) * np.mean(np.abs(blk))
    return out


put("onebit_config", [N, STEPS, FREEZE, W, LR, B1, B2, EPS, WD, DECAYED])
put("onebit_p0", p)
for k in range(STEPS):
    for r in range(W):
        put("onebit_g%d_%d" % (k, r), grads[k][r])
m = np.zeros(N)
v = np.zeros(N)
err = [np.zeros(N) for _ in range(W)]
for k in range(STEPS):
    t = k + 1
    bc1 = 1 - B1 ** t
    if k < FREEZE:
        g = np.mean(grads[k], axis=0)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        denom = np.sqrt(v) / np.sqrt(1 - B2 ** t) + EPS
    else:
        if k == FREEZE:
            v = v / (1 - B2 ** k)
        cs = []
        for r in range(W):
            mr = B1 * m + (1 - B1) * grads[k][r]
            c = scaled_sign(mr + err[r])
            err[r] = mr + err[r] - c
            cs.append(c)
        m = np.mean(cs, axis=0)
        denom = np.sqrt(v) + EPS
    p = p * (1 - LR * WD * decay)
    p = p - (LR / bc1) * m / denom
put("onebit_p", p)

# 1-bit LAMB: LAMB in the warm-up, u = (m / bc1) / (sqrt(v / bc2) + eps) +
# wd p, p -= lr * (|p| / |u|) * u per tensor (ratio 1 without decay); then
# v and the ratios frozen, m from the compressed momenta as above.
p = p0.copy()
m = np.zeros(N)
v = np.zeros(N)
err = [np.zeros(N) for _ in range(W)]
ratio = np.ones(N)
for k in range(STEPS):
    t = k + 1
    bc1 = 1 - B1 ** t
    if k < FREEZE:
        g = np.mean(grads[k], axis=0)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        u = (m / bc1) / (np.sqrt(v / (1 - B2 ** t)) + EPS) + WD * decay * p
        for lo, hi, dec in ((0, DECAYED, True), (DECAYED, N, False)):
            pn, un = np.linalg.norm(p[lo:hi]), np.linalg.norm(u[lo:hi])
            ratio[lo:hi] = pn / un if dec and pn > 0 and un > 0 else 1.0
    else:
        if k == FREEZE:
            v = v / (1 - B2 ** k)
        cs = []
        for r in range(W):
            mr = B1 * m + (1 - B1) * grads[k][r]
            c = scaled_sign(mr + err[r])
            err[r] = mr + err[r] - c
            cs.append(c)
        m = np.mean(cs, axis=0)
        u = (m / bc1) / (np.sqrt(v) + EPS) + WD * decay * p
    p = p - LR * ratio * u
put("onebit_lamb_p", p)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onebit_reference.txt")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
print("wrote", path)
