#!/usr/bin/python3
"""Generate tests/data/compress_ref.bin: PyTorch's results for the compress
layer's unit test (test_compress.c, test_pytorch_reference).

  1. fp32 -> fp16 and fp32 -> bf16 with torch's converters (round to nearest
     even) for 8192 values spanning both formats' ranges, ties, subnormals,
     overflow and specials.
  2. Two PowerSGD steps (rank 3, 40 x 30, no error feedback) computed with
     the functions of torch's own powerSGD_hook: P = M Q, _orthogonalize(P),
     Q = M^T P, out = P Q^T; the second step warm-starts from the first's Q.

Run with the system Python that has torch (python3-torch):
    /usr/bin/python3 tests/reference/gen_compress_reference.py
Layout (little-endian): b"DTCZREF1", u32 n, f32 x[n], u16 fp16[n],
u16 bf16[n], u32 rows, cols, rank, f32 Q0[cols*rank], f32 M1[rows*cols],
f32 out1[rows*cols], f32 M2[rows*cols], f32 out2[rows*cols].
"""
import os
import struct

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

rng = np.random.default_rng(20261122)

# --- casts -----------------------------------------------------------------
n = 8192
sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
x = np.empty(n, dtype=np.float32)
x[:2048] = sign[:2048] * np.exp2(rng.uniform(-27, 17, 2048))      # fp16 range and beyond
x[2048:4096] = sign[2048:4096] * np.exp2(rng.uniform(-130, 127, 2048))  # bf16 range
bits = rng.integers(0, 2**32, 2048, dtype=np.uint64).astype(np.uint32)
# exact ties for fp16 (13 dropped bits = 1 followed by zeros) and for bf16 (16 bits)
t16 = (bits[:1024] & np.uint32(0xffffe000)) | np.uint32(0x1000)
t16 = (t16 & np.uint32(0x807fffff)) | (rng.integers(100, 143, 1024).astype(np.uint32) << 23)
tbf = (bits[1024:] & np.uint32(0xffff0000)) | np.uint32(0x8000)
tbf = (tbf & np.uint32(0x807fffff)) | (rng.integers(1, 254, 1024).astype(np.uint32) << 23)
x[4096:5120] = t16.view(np.float32)
x[5120:6144] = tbf.view(np.float32)
x[6144:8192] = rng.standard_normal(2048).astype(np.float32) * 1e-3
x[8180:8192] = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.99, 65520.0, -65520.0,
                         np.finfo(np.float32).max, 2.0**-24, 2.0**-25, 3 * 2.0**-26],
                        dtype=np.float32)
xt = torch.from_numpy(x)
f16 = xt.half().view(torch.int16).numpy().view(np.uint16)
bf16 = xt.bfloat16().view(torch.int16).numpy().view(np.uint16)

# --- PowerSGD --------------------------------------------------------------
rows, cols, rank = 40, 30, 3


def spectrum_matrix(seed):
    g = np.random.default_rng(seed)
    u, _ = np.linalg.qr(g.standard_normal((rows, rows)))
    v, _ = np.linalg.qr(g.standard_normal((cols, cols)))
    s = 5.0 * 0.7 ** np.arange(cols)
    return (u[:, :cols] * s) @ v.T


def step(m, q):
    m = torch.from_numpy(m.astype(np.float32))
    p = m @ q
    _orthogonalize(p[None])  # in place, as the hook does
    q = m.t() @ p
    return (p @ q.t()).numpy(), q


q0 = torch.from_numpy(rng.standard_normal((cols, rank)).astype(np.float32))
m1 = spectrum_matrix(1).astype(np.float32)
m2 = (m1 + 0.05 * spectrum_matrix(2)).astype(np.float32)
out1, q1 = step(m1, q0.clone())
out2, _ = step(m2, q1)

here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "..", "data", "compress_ref.bin")
with open(path, "wb") as f:
    f.write(b"DTCZREF1")
    f.write(struct.pack("<I", n))
    f.write(x.astype("<f4").tobytes())
    f.write(f16.astype("<u2").tobytes())
    f.write(bf16.astype("<u2").tobytes())
    f.write(struct.pack("<III", rows, cols, rank))
    for a in (q0.numpy(), m1, out1, m2, out2):
        f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
print("wrote", os.path.normpath(path), os.path.getsize(path), "bytes; torch", torch.__version__)
