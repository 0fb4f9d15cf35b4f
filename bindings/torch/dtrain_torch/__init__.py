"""dtrain_torch: dtrain's collectives as a torch.distributed backend (docs/torch.md).

    import dtrain_torch                                   # registers "dtrain" and dtrain://
    import torch.distributed as dist
    dist.init_process_group("dtrain")                     # torchrun: env://
    dist.init_process_group("dtrain", init_method="dtrain://")  # dtrain launch, mpirun, srun

Importing registers the backend with torch.distributed.Backend.register_backend
and the dtrain:// init method, which takes rank, size and the meeting place
from whichever launcher started the process.
"""
from torch import distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.distributed.rendezvous import register_rendezvous_handler

from . import _C

__all__ = ["transport", "job_info"]

transport = _C.transport
job_info = _C.job_info


def _timeout_seconds(timeout):
    # torch hands over its 30-minute default when the caller gave no
    # timeout=; dtrain then keeps DT_TIMEOUT (300 s unless set). A dead peer
    # is reported within seconds either way: this bounds a rank that hangs.
    if timeout is None or timeout == default_pg_timeout:
        return 0.0
    return timeout.total_seconds()


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, _timeout_seconds(timeout))


def _dtrain_rendezvous(url, timeout=default_pg_timeout, **kwargs):
    """dtrain:// : rank, size and rank 0's address and port from `dtrain launch`
    (DT_*), mpirun or srun; rank 0 serves torch's TCPStore there (the dtrain
    group itself listens on another, free port)."""
    info = _C.job_info()
    rank, size = info["rank"], info["size"]
    if size == 1 and not info["master_port"]:
        store = dist.HashStore()
    else:
        store = dist.TCPStore(info["master_addr"], info["master_port"], size, rank == 0, timeout,
                              multi_tenant=True)
    yield store, rank, size
    raise RuntimeError("dtrain:// rendezvous cannot be repeated")


dist.Backend.register_backend("dtrain", _create)
register_rendezvous_handler("dtrain", _dtrain_rendezvous)
