#!/usr/bin/python3
"""The PyTorch side of tests/interop_safetensors.sh: GPT-2 as Hugging Face
lays it out, read from a safetensors file by a reader of its own.

    safetensors_gpt2.py logits FILE.safetensors OURS.bin ID...
        compute the logits of the ids with the reference model and compare
        with dtrain's (T x V float32 in OURS.bin); exit 1 on a difference
    safetensors_gpt2.py llmc FILE.safetensors OUT.bin
        write the same weights in llm.c's gpt2_124M.bin format (version 3)
    safetensors_gpt2.py same A.safetensors B.safetensors
        every tensor of A equals B's, bit for bit

The model is written out here, independent of dtrain: Conv1D layers
(y = x W + b, W stored (in, out)), pre-LN blocks with causal attention and
a tanh-GELU MLP, final LayerNorm, the head tied to wte; float64 throughout.
The head count comes from the file's metadata (dtrain.heads), else dim/64.
"""
import json
import struct
import sys

import numpy as np
import torch


def read_safetensors(path):
    """A safetensors file: u64 header length, a JSON header, raw tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16}
    tensors = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        a = np.frombuffer(data[base + b:base + e], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
        tensors[name.removeprefix("transformer.")] = torch.from_numpy(a.astype(np.float64))
    return tensors, meta


def forward(P, ids, n_head):
    L = sum(1 for k in P if k.endswith(".ln_1.weight"))
    T = len(ids)
    C = P["wte.weight"].shape[1]
    hs = C // n_head
    x = P["wte.weight"][ids] + P["wpe.weight"][:T]
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (C,), P[p + ".weight"], P[p + ".bias"], 1e-5)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = f"h.{l}."
        qkv = ln(x, h + "ln_1") @ P[h + "attn.c_attn.weight"] + P[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(T, n_head, hs).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / hs ** 0.5
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ P[h + "attn.c_proj.weight"] + P[h + "attn.c_proj.bias"]
        m = ln(x, h + "ln_2") @ P[h + "mlp.c_fc.weight"] + P[h + "mlp.c_fc.bias"]
        m = torch.nn.functional.gelu(m, approximate="tanh")
        x = x + m @ P[h + "mlp.c_proj.weight"] + P[h + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ P["wte.weight"].T


def logits(path, ours_path, ids):
    P, meta = read_safetensors(path)
    C = P["wte.weight"].shape[1]
    n_head = int(meta.get("dtrain.heads", C // 64))
    ref = forward(P, torch.tensor(ids), n_head).numpy()
    ours = np.fromfile(ours_path, dtype=np.float32).reshape(ref.shape)
    err = np.abs(ours - ref).max()
    scale = np.abs(ref).max()
    print(f"logits {ref.shape}: max |dtrain - reference| = {err:.3g} (max |logit| {scale:.3g})")
    if not err <= 1e-4 * max(1.0, scale):
        sys.exit(1)


def llmc(path, out):
    """llm.c's write_model: a 256-int header, then the parameters in
    nn.Linear layout (out, in), each kind over all layers, wte padded."""
    P, meta = read_safetensors(path)
    V, C = P["wte.weight"].shape
    T = P["wpe.weight"].shape[0]
    L = sum(1 for k in P if k.endswith(".ln_1.weight"))
    NH = int(meta.get("dtrain.heads", C // 64))
    Vp = (V + 127) // 128 * 128
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, T, V, L, NH, C, Vp]
    wte = np.zeros((Vp, C))
    wte[:V] = P["wte.weight"].numpy()
    kinds = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
             ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
             ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
             ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    parts = [wte, P["wpe.weight"].numpy()]
    for k, transposed in kinds:
        for l in range(L):
            t = P[f"h.{l}.{k}"].numpy()
            parts.append(t.T if transposed else t)
    parts += [P["ln_f.weight"].numpy(), P["ln_f.bias"].numpy()]
    with open(out, "wb") as f:
        f.write(header.tobytes())
        for p in parts:
            f.write(np.ascontiguousarray(p, dtype=np.float32).tobytes())


def same(a, b):
    A, _ = read_safetensors(a)
    B, _ = read_safetensors(b)
    assert A.keys() == B.keys(), (sorted(A), sorted(B))
    for k in A:
        assert torch.equal(A[k], B[k]), k
    print(f"same: {len(A)} tensors")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "logits":
        logits(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4:]])
    elif cmd == "llmc":
        llmc(sys.argv[2], sys.argv[3])
    elif cmd == "same":
        same(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: safetensors_gpt2.py logits|llmc|same ...")
