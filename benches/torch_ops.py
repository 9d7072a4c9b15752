"""The cost per PyTorch op of kinetrace's framework view, against torch.profiler's.

Times N tiny ops (`torch.add` on 1-element tensors, the worst case: the op itself is ~1 µs) in
one process, best of 5 runs, and prints ns per op. The mode says how the process runs
(`scripts/bench-torch-ops.sh` runs every mode side by side):

- `plain`: no profiler at all;
- `torch.profiler`: inside `torch.profiler.profile(activities=[CPU])` (export not timed);
- `dormant`: under `kinetrace record --on-demand` (shim loaded, optimizer hook and NVTX injection
  set up, no window open: PyTorch's NVTX state stays off);
- `inside` / `inside-shapes`: under `kinetrace record` recording the whole run (with
  `--record-shapes`): PyTorch's NVTX state on, every op a span in kinetrace's rings.
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
    if MODE == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as p:
            t = time.perf_counter()
            ops()
            dt = time.perf_counter() - t
        del p
        return dt
    t = time.perf_counter()
    ops()
    return time.perf_counter() - t


best = min(once() for _ in range(5))
active = bool(kinetrace and kinetrace.is_active())
print(f"{MODE:15} {best / N * 1e9:8.1f} ns/op   (kinetrace profiling: {active})")
