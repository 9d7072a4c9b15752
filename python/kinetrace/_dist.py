"""What a distributed PyTorch job says of itself, for kinetrace's traces: the ``distributedInfo``
torch.profiler writes (``backend``, ``rank``, ``world_size``, ``pg_count``, ``pg_config`` and, for
NCCL, ``nccl_version``), built the way torch.profiler builds it, and each process group's global
ranks for the args of c10d collectives (the compiled recorder's ``Process Group Ranks``).

Checked at every step boundary before the shim hears of it (so a window that opens there has it
in its head), and sent again only when the number of process groups changes. Costs one dictionary
lookup per step in a job that does not use ``torch.distributed``. Never imports torch.
"""

import json
import sys

from kinetrace import _torch

# The pg_count last sent (None: nothing sent yet).
_sent = None
_failed = False


def note(lib, log):
    """Sends the job's distributedInfo to the shim if it changed. ``log`` says a failure once."""
    global _sent, _failed
    if _failed:
        return
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if not dist.is_available() or not dist.is_initialized():
            return
        count = dist.get_pg_count()
        if count == _sent or not lib.kinetrace_is_active():
            return
        info = distributed_info(dist)
        said = lib.kinetrace_set_distributed_info(json.dumps(info).encode("utf-8"))
        if said == 0:
            return  # the shim is not profiling yet: again at the next step
        _sent = count
        groups_text = "".join(
            "%s\t%s\n" % (g["pg_name"], ",".join(str(int(r)) for r in g["ranks"]))
            for g in info.get("pg_config") or [])
        _torch.set_groups(groups_text)
    except Exception as e:  # a torch.distributed without these: traces keep the env's rank
        _failed = True
        log("cannot read torch.distributed's setup (%s: %s); traces keep the rank and world size "
            "from the environment" % (type(e).__name__, e))


def distributed_info(dist):
    """torch.profiler's distributedInfo (``torch.profiler.profiler._KinetoProfile
    ._get_distributed_info``), from the same functions."""
    backend = dist.get_backend()
    info = {
        "backend": backend,
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "pg_count": dist.get_pg_count(),
        "pg_config": dist.distributed_c10d._get_all_pg_configs(),
    }
    if backend == "nccl":
        torch = sys.modules["torch"]
        info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    return info
