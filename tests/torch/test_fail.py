"""test_fail.py — what goes wrong is said, quickly, in a Python exception:

  unsupported:  every call dtrain cannot serve raises at once, naming the
                call and the value; the group works on afterwards.
  mismatch:     ranks calling different collectives raise (DT_ERR_MISMATCH)
                instead of hanging.
  killed:       a rank killed in the middle of an allreduce: the others raise
                within 10 s, naming the lost rank.
  timeout:      init_process_group(timeout=2 s) bounds a wait for a rank that
                never calls (DT_TIMEOUT), instead of torch's 30 minutes.
"""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def expect_error(what, fn, *needles):
    t0 = time.time()
    try:
        fn()
    except Exception as e:  # RuntimeError or ValueError from torch's checks
        msg = str(e)
        for needle in needles:
            assert needle in msg, f"{what}: error {msg!r} does not mention {needle!r}"
        assert time.time() - t0 < 5, f"{what}: took {time.time() - t0:.1f} s to fail"
        return msg
    raise AssertionError(f"{what}: no error")


def unsupported(rank, size, store_path):
    import torch
    import torch.distributed as dist
    harness.init(rank, size, store_path)
    other = 1 - rank
    expect_error("bool", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)), "dtype bool")
    expect_error("complex", lambda: dist.broadcast(torch.ones(3, dtype=torch.complex64), 0),
                 "broadcast", "complex")
    expect_error("BAND", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                                 op=dist.ReduceOp.BAND), "ReduceOp.BAND")
    expect_error("sparse", lambda: dist.all_reduce(torch.eye(3).to_sparse()), "dense")
    expect_error("any source", lambda: dist.recv(torch.ones(3)), "recvAnysource")
    expect_error("monitored", lambda: dist.monitored_barrier(), "monitored_barrier")
    expect_error("all_gather_coalesced",
                 lambda: dist.all_gather_coalesced([[torch.ones(2)] * size], [torch.ones(2)]),
                 "allgather_coalesced")
    expect_error("list length", lambda: dist.all_gather([torch.ones(2)], torch.ones(2)),
                 "needs 2 output")
    expect_error("list sizes", lambda: dist.all_gather([torch.ones(2), torch.ones(3)],
                                                       torch.ones(2)), "output tensor 1")
    expect_error("splits", lambda: dist.all_to_all_single(torch.ones(4), torch.ones(4), [1, 2],
                                                          [2, 2]), "splits add up to 3")
    expect_error("send to self", lambda: dist.send(torch.ones(2), rank), "another rank")
    expect_error("root", lambda: dist.reduce(torch.ones(2), 5), "root 5")
    # Nothing was issued: the group is fine.
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), 2.0))
    dist.send(t, other) if rank == 0 else dist.recv(t, other)
    dist.destroy_process_group()


def mismatch(rank, size, store_path):
    import torch
    import torch.distributed as dist
    harness.init(rank, size, store_path)
    dist.all_reduce(torch.ones(5))
    # rank 1 reduces 6 elements where rank 0 reduces 5
    expect_error("mismatch", lambda: dist.all_reduce(torch.ones(5 + rank)), "all_reduce failed",
                 "count 5", "count 6")


def killed(rank, size, store_path):
    """Rank 2 dies by SIGKILL while every rank is in an allreduce of 8 MiB;
    before that it writes the time, for the others to measure from."""
    import torch
    import torch.distributed as dist
    harness.init(rank, size, store_path)
    stamp = store_path + ".killed"
    t = torch.ones(2 << 20)
    dist.all_reduce(t)
    if rank == 2:
        def die():
            time.sleep(0.3)
            with open(stamp + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(stamp + ".tmp", stamp)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=die, daemon=True).start()
    try:
        for _ in range(100000):
            dist.all_reduce(t)
    except RuntimeError as e:
        caught = time.time()
        msg = str(e)
        assert "rank 2" in msg, f"rank {rank}: the error does not name rank 2: {msg}"
        for _ in range(100):  # rank 2 wrote the stamp just before dying
            if os.path.exists(stamp):
                break
            time.sleep(0.05)
        took = caught - float(open(stamp).read())
        assert took < 10, f"rank {rank}: raised {took:.1f} s after rank 2 died"
        print(f"rank {rank}: raised {took:.2f} s after rank 2 was killed: {msg}")
        os._exit(0)  # the group is failed; nothing to tear down cleanly
    raise AssertionError(f"rank {rank}: allreduces went on without rank 2")


def timeout(rank, size, store_path):
    import datetime
    import torch
    import torch.distributed as dist
    harness.init(rank, size, store_path, timeout=datetime.timedelta(seconds=2))
    if rank == 1:
        time.sleep(4)  # never joins the allreduce rank 0 waits in
        os._exit(0)
    t0 = time.time()
    msg = expect_error("timeout", lambda: dist.all_reduce(torch.ones(3)), "")
    took = time.time() - t0
    assert 1.5 < took < 10, f"the 2 s timeout fired after {took:.1f} s: {msg}"
    assert "timed out" in msg or "no progress" in msg or "timeout" in msg.lower(), msg
    print(f"rank 0: timed out after {took:.1f} s: {msg}")
    os._exit(0)


CASES = {
    "unsupported": harness.Case(2, unsupported, 60),
    "mismatch": harness.Case(2, mismatch, 60),
    "killed": harness.Case(3, killed, 60, killed=2),
    "timeout": harness.Case(2, timeout, 60),
}

if __name__ == "__main__":
    harness.main(CASES)
