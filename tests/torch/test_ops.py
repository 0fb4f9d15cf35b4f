"""test_ops.py — every torch.distributed operation on the dtrain backend
against gloo's result on the same inputs, for every dtype dtrain supports,
contiguous and not, at world sizes 1 to 4 (one case each).

Inputs are small integers, so every sum, product, minimum and maximum is
exact in every dtype and results must be equal bit for bit; only AVG
(a division) is compared within rounding. gloo in torch 1.13 lacks some of
what is tested; its reference is then composed from what it has, on the
same inputs:
  - bfloat16: gloo runs on the float32 copy and the result is rounded back;
  - AVG: gloo's SUM divided by the world size (truncated for integers);
  - reduce_scatter, reduce_scatter_tensor: gloo's all_reduce of the
    concatenated inputs, this rank's block;
  - all_gather_into_tensor: gloo's all_gather into a list, concatenated;
  - all_to_all (lists): gloo's all_to_all_single with the same splits.
gloo always gets contiguous tensors holding the same values: its
all_to_all_single reads a strided input in storage order.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
# (rows, cols); the last only for a few dtypes: it crosses the transports'
# single-copy and chunking thresholds (>= 256 KiB per rank).
SHAPES = [(1, 1), (3, 5), (40, 25)]
LARGE = (512, 515)
LARGE_DTYPES = ["float32", "bfloat16", "int64"]


def run(rank, size, store_path):
    import warnings
    warnings.filterwarnings("ignore", message=".*will be deprecated")
    import torch
    import torch.distributed as dist
    R = dist.ReduceOp
    harness.init(rank, size, store_path)
    gloo = dist.new_group(backend="gloo")
    world = dist.group.WORLD
    n = size

    def maker(dt, contig, cast):
        """mk(salt, shape, positive) -> the same tensor on every call, in dtype
        dt (cast for gloo), non-contiguous (a transposed view) if asked."""
        def mk(salt, shape, positive=False, r=None):
            g = torch.Generator().manual_seed(7919 * salt + 101 * (rank if r is None else r) + 3)
            lo, hi = (1, 3) if positive else ((0, 4) if dt == torch.uint8 else (-3, 4))
            rows, cols = shape
            t = torch.randint(lo, hi, (cols, rows), generator=g).to(dt).t()
            return cast(t.contiguous() if contig else t)
        return mk

    def empty(shape, dtype, contig):
        """An output to be overwritten (filled with 99), laid out like mk's."""
        rows, cols = shape
        if contig:
            return torch.full((rows, cols), 99, dtype=dtype)
        return torch.full((cols, rows), 99, dtype=dtype).t()

    # Each op: fn(pg, mk, dt, shape, contig, reference) -> list of tensors.
    def all_reduce(op):
        def f(pg, mk, dt, shape, contig, ref):
            t = mk(0, shape, positive=op == R.PRODUCT)
            if ref and op == R.AVG:
                dist.all_reduce(t, group=pg)
                return [t / n if t.is_floating_point() else torch.div(t, n, rounding_mode="trunc")]
            dist.all_reduce(t, op=op, group=pg)
            return [t]
        return f

    def all_reduce_coalesced(pg, mk, dt, shape, contig, ref):
        ts = [mk(0, shape), mk(1, (2, 3)), mk(2, (1, 1))]
        dist.all_reduce_coalesced(ts, group=pg)
        return ts

    def broadcast(pg, mk, dt, shape, contig, ref):
        t = mk(0, shape)
        dist.broadcast(t, src=n - 1, group=pg)
        return [t]

    def reduce(op):
        def f(pg, mk, dt, shape, contig, ref):
            t, dst = mk(0, shape), n // 2
            dist.reduce(t, dst=dst, op=op, group=pg)
            if rank == dst:
                return [t]
            if not ref:  # dtrain leaves the other ranks' tensors alone
                assert torch.equal(t, mk(0, shape)), "reduce changed a non-root tensor"
            return []
        return f

    def all_gather(pg, mk, dt, shape, contig, ref):
        x = mk(0, shape)
        outs = [empty(shape, x.dtype, contig) for _ in range(n)]
        dist.all_gather(outs, x, group=pg)
        return outs

    def all_gather_into_tensor(in_place):
        def f(pg, mk, dt, shape, contig, ref):
            x = mk(0, shape)
            if ref:
                outs = [torch.empty_like(x) for _ in range(n)]
                dist.all_gather(outs, x, group=pg)
                return [torch.cat(outs)]
            out = torch.full((n * shape[0], shape[1]), 99, dtype=x.dtype)
            if in_place:  # FSDP's layout: the input is this rank's block
                inp = out.narrow(0, rank * shape[0], shape[0])
                inp.copy_(x)
                x = inp
            dist.all_gather_into_tensor(out, x, group=pg)
            return [out]
        return f

    def reduce_scatter(op, as_tensor):
        def f(pg, mk, dt, shape, contig, ref):
            ins = [mk(i, shape) for i in range(n)]
            if ref:
                t = torch.cat([x.reshape(-1) for x in ins])
                dist.all_reduce(t, op=op, group=pg)
                k = shape[0] * shape[1]
                return [t.narrow(0, rank * k, k).view(shape)]
            out = empty(shape, ins[0].dtype, contig)
            if as_tensor:
                dist.reduce_scatter_tensor(out, torch.cat(ins), op=op, group=pg)
            else:
                dist.reduce_scatter(out, ins, op=op, group=pg)
            return [out]
        return f

    def all_to_all_single(uneven):
        def f(pg, mk, dt, shape, contig, ref):
            rows, cols = shape
            if uneven:  # rank i sends (i + j) % 3 + 1 blocks of rows to rank j
                ins = [(rank + j) % 3 + 1 for j in range(n)]
                outs = [(i + rank) % 3 + 1 for i in range(n)]
                x = mk(0, (sum(ins) * rows, cols))
                out = empty((sum(outs) * rows, cols), x.dtype, contig)
                dist.all_to_all_single(out, x, [s * rows for s in outs], [s * rows for s in ins],
                                       group=pg)
            else:
                x = mk(0, (n * rows, cols))
                out = empty((n * rows, cols), x.dtype, contig)
                dist.all_to_all_single(out, x, group=pg)
            return [out]
        return f

    def all_to_all(pg, mk, dt, shape, contig, ref):
        rows, cols = shape
        ins = [mk(j, ((rank + j) % 3 * rows, cols)) for j in range(n)]
        outs = [empty(((i + rank) % 3 * rows, cols), ins[0].dtype, contig) for i in range(n)]
        if ref:
            flat = torch.empty(sum(o.shape[0] for o in outs), cols, dtype=ins[0].dtype)
            dist.all_to_all_single(flat, torch.cat(ins), [o.shape[0] for o in outs],
                                   [x.shape[0] for x in ins], group=pg)
            return list(flat.split([o.shape[0] for o in outs]))
        dist.all_to_all(outs, ins, group=pg)
        return outs

    def gather(pg, mk, dt, shape, contig, ref):
        x = mk(0, shape)
        outs = [empty(shape, x.dtype, contig) for _ in range(n)] if rank == 0 else None
        dist.gather(x, outs, dst=0, group=pg)
        return outs or []

    def scatter(pg, mk, dt, shape, contig, ref):
        src = n - 1
        ins = [mk(i, shape) for i in range(n)] if rank == src else None
        out = empty(shape, mk(0, shape).dtype, contig)
        dist.scatter(out, ins, src=src, group=pg)
        return [out]

    def send_recv(pg, mk, dt, shape, contig, ref):
        if n == 1:
            return []
        got = []
        # a ring in one batch: every rank sends before it receives
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        x, y = mk(0, shape), empty(shape, mk(0, shape).dtype, contig)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt, pg, tag=3),
                                       dist.P2POp(dist.irecv, y, prv, pg, tag=3)])
        for q in reqs:
            q.wait()
        got.append(y)
        # blocking, tagged, first to last rank
        if rank == 0:
            dist.send(mk(5, shape), n - 1, group=pg, tag=7)
        elif rank == n - 1:
            z = empty(shape, y.dtype, contig)
            dist.recv(z, 0, group=pg, tag=7)
            got.append(z)
        return got

    def barrier(pg, mk, dt, shape, contig, ref):
        dist.barrier(group=pg)
        return []

    OPS = {
        "all_reduce_sum": all_reduce(R.SUM), "all_reduce_avg": all_reduce(R.AVG),
        "all_reduce_product": all_reduce(R.PRODUCT), "all_reduce_min": all_reduce(R.MIN),
        "all_reduce_max": all_reduce(R.MAX), "all_reduce_coalesced": all_reduce_coalesced,
        "broadcast": broadcast, "reduce_sum": reduce(R.SUM), "reduce_max": reduce(R.MAX),
        "all_gather": all_gather, "all_gather_into_tensor": all_gather_into_tensor(False),
        "all_gather_into_tensor_in_place": all_gather_into_tensor(True),
        "reduce_scatter_sum": reduce_scatter(R.SUM, False),
        "reduce_scatter_min": reduce_scatter(R.MIN, False),
        "reduce_scatter_tensor_sum": reduce_scatter(R.SUM, True),
        "reduce_scatter_tensor_max": reduce_scatter(R.MAX, True),
        "all_to_all_single": all_to_all_single(False),
        "all_to_all_single_uneven": all_to_all_single(True), "all_to_all": all_to_all,
        "gather": gather, "scatter": scatter, "send_recv": send_recv, "barrier": barrier,
    }

    checked = 0
    for dname in DTYPES:
        dt = getattr(torch, dname)
        shapes = SHAPES + ([LARGE] if dname in LARGE_DTYPES else [])
        # gloo has no bfloat16: it computes on float32 copies.
        to_gloo = (lambda t: t.float()) if dt == torch.bfloat16 else (lambda t: t)
        for shape in shapes:
            for contig in (True, False):
                for name, f in OPS.items():
                    what = f"{name} {dname} {shape} {'contiguous' if contig else 'strided'}"
                    got = f(world, maker(dt, contig, lambda t: t), dt, shape, contig, False)
                    want = f(gloo, maker(dt, True, to_gloo), dt, shape, True, True)
                    assert len(got) == len(want), f"{what}: {len(got)} results, gloo {len(want)}"
                    for i, (a, b) in enumerate(zip(got, want)):
                        b = b.to(dt)
                        assert a.dtype == dt and a.shape == b.shape, \
                            f"{what}: result {i} is {a.dtype} {tuple(a.shape)}, want {tuple(b.shape)}"
                        if name.endswith("avg") and dt.is_floating_point:
                            torch.testing.assert_close(a, b, msg=lambda m: f"{what}: {m}")
                        elif not torch.equal(a, b):
                            bad = (a != b).nonzero()[0].tolist()
                            raise AssertionError(f"rank {rank}: {what}: result {i} differs from "
                                                 f"gloo at {bad}: {a[tuple(bad)]} != {b[tuple(bad)]}")
                    checked += 1
    async_and_futures(rank, size)
    empty_tensors(rank, size)
    large_exchange(rank, size)
    dist.destroy_process_group()
    if rank == 0:
        print(f"{checked} op x dtype x shape x layout cases equal to gloo at {size} ranks")


def async_and_futures(rank, n):
    """async_op=True: wait() in any order, is_completed(), get_future() with
    a chained then(), which DDP's comm hooks rely on."""
    import torch
    import torch.distributed as dist
    ts = [torch.full((1000,), float(rank + i)) for i in range(40)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    for i, t in enumerate(ts):
        assert torch.all(t == sum(r + i for r in range(n))), f"async all_reduce {i}: {t[0]}"
    t = torch.ones(10)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(fut.wait(), torch.full((10,), 2.0 * n))
    w = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    while not w.is_completed():
        pass
    w.wait()


def large_exchange(rank, n):
    """batch_isend_irecv where every rank sends 8 MiB to both neighbours
    before receiving: far more than the transports buffer, so it completes
    only because the batch is posted at once."""
    import torch
    import torch.distributed as dist
    if n == 1:
        return
    k = 2 << 20
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    a, b = torch.full((k,), float(rank)), torch.full((k,), float(rank) + 0.5)
    ra, rb = torch.empty(k), torch.empty(k)
    ops = [dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.isend, b, prv),
           dist.P2POp(dist.irecv, ra, prv), dist.P2POp(dist.irecv, rb, nxt)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    assert torch.all(ra == prv), f"rank {rank}: received {ra[0]} from {prv}"
    assert torch.all(rb == nxt + 0.5), f"rank {rank}: received {rb[0]} from {nxt}"


def empty_tensors(rank, n):
    """Zero elements go through every form without error."""
    import torch
    import torch.distributed as dist
    e = torch.empty(0)
    dist.all_reduce(e)
    dist.broadcast(e, 0)
    dist.all_gather_into_tensor(torch.empty(0), e)
    dist.reduce_scatter_tensor(e, torch.empty(0))
    dist.all_to_all_single(torch.empty(0), torch.empty(0))
    outs = [torch.empty(0) for _ in range(n)]
    dist.all_gather(outs, e)


CASES = {f"ops_{n}": harness.Case(n, run, 600) for n in (1, 2, 3, 4)}

if __name__ == "__main__":
    harness.main(CASES)
