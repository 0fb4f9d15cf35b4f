"""test_init.py — every way to start a dtrain process group:

  env        init_process_group("dtrain") under torchrun (env://)
  tcpstore   an explicit TCPStore (store=, rank=, world_size=)
  filestore  init_method="file://..."
  launch     init_method="dtrain://" under `dtrain launch -n 3` (DT_CLI)
  mpirun     init_method="dtrain://" under mpirun -np 2 (DT_MPIRUN)
  subgroup   new_group([0, 2], backend="dtrain") beside a gloo default group

Each rank then checks an allreduce, a broadcast, the object collectives
(all_gather_object, broadcast_object_list) and a barrier.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def check(group=None, ranks=None):
    import torch
    import torch.distributed as dist
    import dtrain_torch
    me, n = dist.get_rank(group), dist.get_world_size(group)
    t = torch.full((1000,), float(me + 1))
    dist.all_reduce(t, group=group)
    assert torch.all(t == n * (n + 1) / 2), f"rank {me}: allreduce gave {t[0]}"
    b = torch.arange(5) * (me + 1)
    dist.broadcast(b, src=ranks[-1] if ranks else 0, group=group)
    want = torch.arange(5) * (n if ranks else 1)
    assert torch.equal(b, want), f"rank {me}: broadcast gave {b}"
    objs = [None] * n  # pickled objects travel as uint8 all_gather / broadcast
    dist.all_gather_object(objs, {"rank": me}, group=group)
    assert objs == [{"rank": r} for r in range(n)], f"rank {me}: all_gather_object gave {objs}"
    box = [f"from {me}"]
    dist.broadcast_object_list(box, src=ranks[0] if ranks else 0, group=group)
    assert box == ["from 0"], f"rank {me}: broadcast_object_list gave {box}"
    dist.barrier(group=group)
    print(f"rank {me} of {n}: ok over {dtrain_torch.transport(group or dist.group.WORLD)}")


def env(rank, size, store):
    import torch.distributed as dist
    dist.init_process_group("dtrain")
    check()
    dist.destroy_process_group()


def tcpstore(rank, size, store):
    import torch.distributed as dist
    port_file = store + ".port"
    if rank == 0:
        s = dist.TCPStore("127.0.0.1", 0, size, True, wait_for_workers=False)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(s.port))
        os.rename(port_file + ".tmp", port_file)
    else:
        while not os.path.exists(port_file):
            time.sleep(0.02)
        s = dist.TCPStore("127.0.0.1", int(open(port_file).read()), size, False)
    dist.init_process_group("dtrain", store=s, rank=rank, world_size=size)
    check()
    dist.destroy_process_group()


def filestore(rank, size, store):
    import torch.distributed as dist
    dist.init_process_group("dtrain", init_method="file://" + store, rank=rank, world_size=size)
    check()
    dist.destroy_process_group()


def dtrain_url(rank, size, store):
    import torch.distributed as dist
    dist.init_process_group("dtrain", init_method="dtrain://")
    check()
    dist.destroy_process_group()


def subgroup(rank, size, store):
    import torch.distributed as dist
    harness.init(rank, size, store, backend="gloo")
    sub = dist.new_group([0, 2], backend="dtrain")
    if rank in (0, 2):
        check(sub, [0, 2])
    dist.barrier()
    dist.destroy_process_group()


def torchrun(script, name, store):
    # Debian's torch 1.13 under Python 3.11 cannot parse torchrun's default
    # --redirects/--tee of 0 (IntFlag no longer iterates a zero member):
    # redirect stdout to files in a log directory and tee it back.
    return [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
             "--nproc_per_node=2", "--redirects=1", "--tee=1", "--log_dir=" + store + ".logs",
             script, "--child", name, "--store", store]]


def dtrain_launch(script, name, store):
    return [[os.environ["DT_CLI"], "launch", "-n", "3", "--tag-output", "--", sys.executable,
             script, "--child", name, "--store", store]]


def mpirun(script, name, store):
    return [[os.environ["DT_MPIRUN"], "--oversubscribe", "--allow-run-as-root", "-np", "2",
             "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", sys.executable, script, "--child", name,
             "--store", store]]


CASES = {
    "env": harness.Case(2, env, 120, launch=torchrun),
    "tcpstore": harness.Case(2, tcpstore),
    "filestore": harness.Case(2, filestore),
    "launch": harness.Case(3, dtrain_url, 120, launch=dtrain_launch),
    "mpirun": harness.Case(2, dtrain_url, 120, launch=mpirun),
    "subgroup": harness.Case(3, subgroup),
}

if __name__ == "__main__":
    harness.main(CASES)
