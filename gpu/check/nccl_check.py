"""The NCCL half of the collectives check (docs/record.md, "Collectives and ranks"): a one-rank NCCL
job on the GPU under `kinetrace record --record-shapes`, and what its trace must hold.

- `distributedInfo` with `"backend": "nccl"`, the rank, and an `nccl_version`;
- `record_param_comms` ranges (what ProcessGroupNCCL records around each collective) with torch's
  args: `Collective name`, `dtype`, `In msg nelems`, `Out msg nelems`, `Group size`,
  `Process Group Name`, `Process Group Ranks`; the job's own all_reduce of NELEMS floats among
  them;
- NCCL kernels that carry the collective args of the range that launched them (as Kineto copies
  them);
- `c10d::allreduce_` ops with the args kinetrace derives on every backend;
- with `--with-stack --profile-memory` too: the CUDA caching allocator's `[memory]` events
  (`Device Type` 1, `Device Id` 0, `Total Reserved` at least `Total Allocated` and above 0), and
  GPU kernels that reach a line of the job through their op's `External id` and the
  `python_function` frames around that op.

Used by gpu_check.py (`all` runs it, `selftest` checks the checks on a synthetic trace). No torch
import here: the job is a separate process.
"""

import copy

# The elements of the all_reduce the job does itself each step (besides DDP's buckets).
NELEMS = 4096
# Steps the job runs; `record --iterations 3 --start-iteration 2` keeps 2..4.
STEPS = 7

JOB = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", sys.argv[1])
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16)).cuda(), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256, device="cuda")
extra = torch.ones(%(nelems)d, device="cuda")
for step in range(%(steps)d):
    opt.zero_grad()
    model(x).sum().backward()
    dist.all_reduce(extra)
    opt.step()
torch.cuda.synchronize()
print(json.dumps({"params": sum(p.numel() for p in model.parameters()),
                  "nccl": ".".join(str(v) for v in torch.cuda.nccl.version())}), flush=True)
dist.destroy_process_group()
""" % {"nelems": NELEMS, "steps": STEPS}

COLLECTIVE_ARGS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size",
                   "Process Group Name", "Process Group Ranks")


def checks(doc):
    """(name, ok, detail) for one trace document (parsed JSON)."""
    out = []
    info = doc.get("distributedInfo") or {}
    out.append(("distributedInfo: nccl, rank, nccl_version",
                info.get("backend") == "nccl" and info.get("rank") == 0 and bool(info.get("nccl_version")),
                str(info)[:150]))
    evs = doc.get("traceEvents") or []
    rpc = [e for e in evs if e.get("cat") == "cpu_op" and e.get("name") == "record_param_comms"]
    full = [e for e in rpc if all(k in (e.get("args") or {}) for k in COLLECTIVE_ARGS)]
    # torch writes fewer args on its `wait` and `barrier` ranges; every other one has them all.
    collectives = [e for e in rpc if (e.get("args") or {}).get("Collective name") not in ("wait", "barrier")]
    out.append(("record_param_comms with torch's args", bool(collectives) and len(full) == len(collectives),
                "%d ranges, %d with every arg of %s" % (len(rpc), len(full), ", ".join(COLLECTIVE_ARGS))))
    mine = [e for e in full if e["args"].get("Collective name") == "allreduce"
            and e["args"].get("In msg nelems") == NELEMS and e["args"].get("Group size") == 1]
    out.append(("the job's all_reduce of %d floats" % NELEMS, len(mine) >= 3,
                "%d allreduce ranges of %d elements in the 3 recorded steps" % (len(mine), NELEMS)))
    kernels = [e for e in evs if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
    labelled = [e for e in kernels if (e.get("args") or {}).get("Collective name")]
    out.append(("NCCL kernels carry the collective's args", bool(kernels) and bool(labelled),
                "%d NCCL kernels, %d with Collective name" % (len(kernels), len(labelled))))
    c10d = [e for e in evs if e.get("cat") == "cpu_op" and e.get("name") == "c10d::allreduce_"]
    derived = [e for e in c10d if (e.get("args") or {}).get("Collective name") == "allreduce"]
    out.append(("c10d::allreduce_ with derived args", bool(c10d) and len(derived) == len(c10d),
                "%d ops, %d with args" % (len(c10d), len(derived))))
    mem = [e for e in evs if e.get("name") == "[memory]"]
    gpu = [e for e in mem if (e.get("args") or {}).get("Device Type") == 1
           and e["args"].get("Device Id") == 0]
    reserved = [e for e in gpu if e["args"].get("Total Reserved", 0) > 0
                and e["args"].get("Total Reserved", 0) >= e["args"].get("Total Allocated", 0)]
    out.append(("CUDA caching allocator [memory] with Total Reserved",
                bool(gpu) and len(reserved) == len(gpu),
                "%d [memory] events, %d on cuda:0, %d with 0 < Total Allocated <= Total Reserved"
                % (len(mem), len(gpu), len(reserved))))
    reached, linked = kernels_reaching_the_job(evs)
    out.append(("kernels reach a line of the job (External id, python_function)",
                linked > 0 and reached >= 0.9 * linked,
                "%d of %d kernels with an op reach %s:<line>" % (reached, linked, JOB_FILE)))
    return out


# The job's file name as the trace shows it (relative to its directory, sys.path[0]).
JOB_FILE = "nccl_job.py"


def kernels_reaching_the_job(evs):
    """(kernels whose op has a python_function ancestor called from the job's file, kernels whose
    External id names a cpu_op)."""
    ops = {}
    frames = {}
    for e in evs:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "cpu_op" and "External id" in (e.get("args") or {}):
            ops[e["args"]["External id"]] = e
        elif e.get("cat") == "python_function":
            frames.setdefault(e.get("tid"), []).append(e)
    reached = linked = 0
    for k in evs:
        if k.get("cat") != "kernel":
            continue
        op = ops.get((k.get("args") or {}).get("External id"))
        if op is None:
            continue
        linked += 1
        t0, t1 = op["ts"], op["ts"] + op.get("dur", 0)
        if any(f["ts"] <= t0 and t1 <= f["ts"] + f.get("dur", 0)
               and str((f.get("args") or {}).get("CallFrom", "")).startswith(JOB_FILE + ":")
               for f in frames.get(op.get("tid"), [])):
            reached += 1
    return reached, linked


def synthetic():
    """A trace that passes every check."""
    evs = []
    for step in range(3):
        t = 1000.0 * step
        evs.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": t, "dur": 50,
                    "args": {"External id": 10 * step + 1, "Collective name": "allreduce", "In msg nelems": NELEMS}})
        args = {"External id": 10 * step + 2, "Collective name": "allreduce", "dtype": "Float",
                "In msg nelems": NELEMS, "Out msg nelems": NELEMS, "Group size": 1, "Process Group Name": "0",
                "Process Group Ranks": "[0]"}
        evs.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": t + 1,
                    "dur": 40, "args": args})
        evs.append({"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": t + 20, "dur": 10,
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    "args": {"External id": 10 * step + 2, "Collective name": "allreduce"}})
        evs.append({"ph": "X", "cat": "python_function", "name": "torch/distributed/c10d_logger.py(79): wrapper",
                    "pid": 1, "tid": 1, "ts": t - 5, "dur": 60,
                    "args": {"CallFrom": JOB_FILE + ":19", "Python id": 100 + step}})
        evs.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                    "ts": t + 2, "args": {"Total Reserved": 2 << 20, "Total Allocated": 16384, "Bytes": 16384,
                                          "Device Id": 0, "Device Type": 1, "Addr": 1 << 40}})
    return {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1, "nccl_version": "2.27.5"},
            "traceEvents": evs}


def selftest(report):
    """Checks the checks: the synthetic trace passes, damaged copies fail the right check. Returns the
    number of problems; `report(line)` prints."""
    problems = 0
    bad = [r for r in checks(synthetic()) if not r[1]]
    report("selftest: nccl synthetic trace: %d failed" % len(bad))
    problems += len(bad)

    def kernels(t):
        return [e for e in t["traceEvents"] if e["cat"] == "kernel"]

    def ranges(t):
        return [e for e in t["traceEvents"] if e["name"] == "record_param_comms"]

    for what, mutate, expect in [
        ("gloo, not nccl", lambda t: t["distributedInfo"].update(backend="gloo"), "distributedInfo: nccl, rank, nccl_version"),
        ("a range without its args", lambda t: ranges(t)[0]["args"].pop("Group size"), "record_param_comms with torch's args"),
        ("the wrong element count", lambda t: [e["args"].update({"In msg nelems": 1}) for e in ranges(t)],
         "the job's all_reduce of %d floats" % NELEMS),
        ("kernels without args", lambda t: [e["args"].pop("Collective name") for e in kernels(t)],
         "NCCL kernels carry the collective's args"),
        ("a c10d op without args", lambda t: t["traceEvents"][0]["args"].pop("Collective name"),
         "c10d::allreduce_ with derived args"),
        ("CPU-only [memory] events", lambda t: [e["args"].update({"Device Type": 0, "Device Id": -1})
                                               for e in t["traceEvents"] if e["name"] == "[memory]"],
         "CUDA caching allocator [memory] with Total Reserved"),
        ("no Total Reserved", lambda t: [e["args"].update({"Total Reserved": 0})
                                        for e in t["traceEvents"] if e["name"] == "[memory]"],
         "CUDA caching allocator [memory] with Total Reserved"),
        ("frames from elsewhere", lambda t: [e["args"].update({"CallFrom": "other.py:3"})
                                            for e in t["traceEvents"] if e["cat"] == "python_function"],
         "kernels reach a line of the job (External id, python_function)"),
    ]:
        t = copy.deepcopy(synthetic())
        mutate(t)
        failed = {r[0] for r in checks(t) if not r[1]}
        caught = expect in failed
        report("selftest: %-42s -> %s" % (what, "caught" if caught else "NOT caught (failed: %s)" % sorted(failed)))
        problems += 0 if caught else 1
    return problems
