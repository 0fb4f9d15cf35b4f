"""harness.py — run a PyTorch-backend test as N processes on loopback (the
Python twin of tests/comm/harness.h).

A test script ends with `harness.main(CASES)`, CASES mapping a case name to
Case(nranks, fn, timeout, killed, launch). Without --child the script is the parent:
it checks that torch and dtrain_torch import (a missing python3-torch skips
with exit code 77 and the reason; a missing dtrain_torch fails), then starts
the script once per rank as `--child NAME --rank R --size N --store FILE`,
waits with a deadline (killing every rank when it expires) and checks the
exit codes. A child runs fn(rank, size, store_path); a failed assert exits 1
with its traceback. Ranks meet through a FileStore in a fresh directory, so
no TCP port is ever guessed.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import namedtuple

# launch(script, name, store) -> the commands to run instead of one process
# per rank (a launcher: torchrun, dtrain launch, mpirun); fn then gets rank
# and size None and finds them itself.
Case = namedtuple("Case", "nranks fn timeout killed launch", defaults=(120, -1, None))

SKIP = 77


def _check_imports():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"skipped: python3-torch is not installed ({e}); scripts/install-deps.sh --torch")
        sys.exit(SKIP)
    try:
        import dtrain_torch  # noqa: F401
    except ImportError as e:
        why = os.environ.get("DT_TORCH_STATUS", "")
        print(f"FAIL: python3-torch is installed but dtrain_torch cannot be imported ({e}). {why}")
        sys.exit(1)


def child_env():
    """The environment of a rank: one thread each (2 cores, up to 4 ranks),
    gloo on loopback."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # torch's BLAS ignores set_num_threads
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env.setdefault("DT_TIMEOUT", "60")
    return env


def run_ranks(cmds, timeout, killed=-1, name="", nranks=None):
    """Start one process per command, wait at most `timeout` seconds; True
    when every rank exited 0 (the `killed` rank by SIGKILL instead)."""
    t0 = time.time()
    procs = [subprocess.Popen(c, env=child_env()) for c in cmds]
    ok = True
    for r, p in enumerate(procs):
        try:
            code = p.wait(timeout=max(0.1, timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            print(f"case {name}: timed out after {timeout} s, killing every rank")
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            return False
        want = -9 if r == killed else 0
        if code != want:
            print(f"case {name}: rank {r} exited with {code}, expected {want}")
            ok = False
    print(f"{'ok' if ok else 'FAIL'} {name} ({nranks or len(cmds)} ranks, {time.time() - t0:.2f} s)")
    sys.stdout.flush()
    return ok


def main(cases):
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="cases to run (default: all)")
    ap.add_argument("--child")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--size", type=int)
    ap.add_argument("--store")
    a = ap.parse_args()
    if a.child:
        import torch
        torch.set_num_threads(1)
        import dtrain_torch  # noqa: F401 — registers the backend
        cases[a.child].fn(a.rank, a.size, a.store)
        sys.stdout.flush()
        return
    _check_imports()
    names = a.names or list(cases)
    failed = 0
    for name in names:
        c = cases[name]
        with tempfile.TemporaryDirectory(prefix="dtrain-torch-") as d:
            store = os.path.join(d, "store")
            script = os.path.abspath(sys.argv[0])
            if c.launch:
                cmds = c.launch(script, name, store)
            else:
                cmds = [[sys.executable, script, "--child", name, "--rank", str(r), "--size",
                         str(c.nranks), "--store", store] for r in range(c.nranks)]
            failed += not run_ranks(cmds, c.timeout, c.killed, name, c.nranks)
    print(f"{len(names)} cases, {failed} failed")
    sys.exit(1 if failed else 0)


def init(rank, size, store_path, backend="dtrain", **kw):
    """The default process group over a FileStore at store_path."""
    import torch.distributed as dist
    store = dist.FileStore(store_path, size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, **kw)
    return store
