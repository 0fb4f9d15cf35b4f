#!/usr/bin/python3
"""Write tests/data/amp_convert.bin: fp32 values and PyTorch's bf16 and fp16
conversions of them, the independent reference for test_amp_convert.

Format (little-endian): magic b"DTAMPCNV", u32 version (1), u32 count n,
then n u32 fp32 bit patterns, n u16 bf16 (torch .to(torch.bfloat16)),
n u16 fp16 (torch .half()).

Run with Debian's python3-torch: /usr/bin/python3 tests/data/gen_amp_convert.py
"""
import os
import struct

import numpy as np
import torch

rng = np.random.default_rng(20261122)
special = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,
           0x00008000, 0x00018000, 0x00800000, 0x3F800000, 0x3F808000, 0x3F818000,
           0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000,
           0x477FE000, 0x477FF000, 0x477FEFFF, 0x38800000, 0x387FC000, 0x33000000,
           0x33000001, 0x33800000, 0x337FFFFF, 0x38000000, 0x47800000, 0xC77FF000]
# Near every rounding tie of both formats, over the whole exponent range.
ties = []
for e in range(0, 255):
    base = e << 23
    for low in (0x8000, 0x18000, 0x7FFF, 0x8001, 0x1000, 0x3000, 0x0FFF, 0x1001):
        ties.append(base | low)
        ties.append(base | low | 0x80000000)
randbits = rng.integers(0, 2**32, size=4096, dtype=np.uint64).tolist()
normals = (rng.standard_normal(2048).astype(np.float32) *
           np.float32(2.0) ** rng.integers(-30, 30, size=2048)).astype(np.float32)
bits = np.array(special + ties + randbits, dtype=np.uint32)
bits = np.concatenate([bits, normals.view(np.uint32)])
x = torch.from_numpy(bits.view(np.float32).copy())
bf = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
hf = x.half().view(torch.int16).numpy().view(np.uint16)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "amp_convert.bin")
with open(out, "wb") as f:
    f.write(b"DTAMPCNV")
    f.write(struct.pack("<II", 1, len(bits)))
    f.write(bits.astype("<u4").tobytes())
    f.write(bf.astype("<u2").tobytes())
    f.write(hf.astype("<u2").tobytes())
print(f"wrote {out}: {len(bits)} values (torch {torch.__version__})")
