"""The cost per PyTorch op of kinetrace's framework view, against torch.profiler's.

Times N tiny ops (`torch.add` on 1-element tensors, the worst case: the op itself is ~1 µs) in
one process, best of 5 runs, and prints ns per op: wall time, and the CPU time of the timing
thread (which a busy machine disturbs less; it leaves out work kinetrace's own threads do, such as
draining its rings, which the wall time includes when the cores are shared). The mode says how the process runs
(`scripts/bench-torch-ops.sh` runs every mode side by side):

- `plain`: no profiler at all;
- `torch.profiler`: inside `torch.profiler.profile(activities=[CPU])` (export not timed);
- `dormant`: under `kinetrace record --on-demand` (shim loaded, optimizer hook and NVTX injection
  set up, no window open: PyTorch's NVTX state stays off);
- `inside` / `inside-shapes`: under `kinetrace record` recording the whole run (with
  `--record-shapes`): every op a span in kinetrace's rings, through the compiled RecordFunction
  recorder when it is built (the default route);
- `inside-nvtx` / `inside-shapes-nvtx`: the same with `KINETRACE_TORCH_OPS_ROUTE=nvtx` set by the
  caller: PyTorch's NVTX state on, every op an NVTX range (the fallback route);
- `kinetrace.profile` / `kinetrace.profile-shapes`: inside `kinetrace.profile(activities=[CPU])`
  (with `record_shapes=True`), the in-process API: the shim loaded with ctypes, the same recorder
  route (the caller puts the package on PYTHONPATH and names the shim in KINETRACE_PRELOAD_PATH).

The mode is a label except for `torch.profiler` and `kinetrace.profile*`: how the process runs is
up to the caller.
"""
import sys
import time

import torch

N = 200_000
MODE = sys.argv[1]

a = torch.ones(1)
b = torch.ones(1)


def ops():
    for _ in range(N):
        torch.add(a, b)


try:
    import kinetrace

    # Under record: starts profiling here (no CUDA) and turns PyTorch's ops on if a window is open.
    kinetrace.step()
except ImportError:
    kinetrace = None


def once():
    """(wall, CPU time of this thread) of one run of `ops`, in seconds."""
    if MODE == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as p:
            t, c = time.perf_counter(), time.thread_time()
            ops()
            dt = time.perf_counter() - t, time.thread_time() - c
        del p
        return dt
    if MODE.startswith("kinetrace.profile"):
        from torch.profiler import ProfilerActivity

        with kinetrace.profile(activities=[ProfilerActivity.CPU],
                               record_shapes=MODE.endswith("-shapes")):
            t, c = time.perf_counter(), time.thread_time()
            ops()
            return time.perf_counter() - t, time.thread_time() - c
    t, c = time.perf_counter(), time.thread_time()
    ops()
    return time.perf_counter() - t, time.thread_time() - c


runs = [once() for _ in range(5)]
wall = min(r[0] for r in runs)
cpu = min(r[1] for r in runs)
active = bool(kinetrace and kinetrace.is_active())
print(f"{MODE:19} {wall / N * 1e9:8.1f} ns/op wall {cpu / N * 1e9:8.1f} ns/op CPU   "
      f"(kinetrace profiling: {active})")
