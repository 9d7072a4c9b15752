"""The cost of kinetrace's framework view in a PyTorch process, against torch.profiler's.

Two workloads (the second argument; `ops` by default):

- `ops`: N tiny ops (`torch.add` on 1-element tensors, the worst case: the op itself is ~1 µs);
  prints ns per op;
- `steps`: the guide's training step (an MLP with LayerNorm, AdamW, cross-entropy on a 64-row
  batch: about 150 ops forward, backward and optimizer); prints µs per step.

Each is timed in one process, best of 5 runs: wall time, and the CPU time of the timing thread
(which a busy machine disturbs less; it leaves out work kinetrace's own threads do, such as
draining its rings, which the wall time includes when the cores are shared). The mode says how
the process runs (`scripts/bench-torch-ops.sh` runs every mode side by side):

- `plain`: no profiler at all;
- `torch.profiler` / `torch.profiler-shapes` / `torch.profiler-stack` / `torch.profiler-memory`:
  inside `torch.profiler.profile(activities=[CPU])` (with `record_shapes=True`, `with_stack=True`,
  `profile_memory=True`; export not timed);
- `dormant`: under `kinetrace record --on-demand` (shim loaded, optimizer hook and NVTX injection
  set up, no window open: PyTorch's NVTX state stays off);
- `inside` / `inside-shapes` / `inside-stack` / `inside-memory`: under `kinetrace record`
  recording the whole run (with `--record-shapes`, `--with-stack`, `--profile-memory`): every op a span in kinetrace's rings, through the compiled RecordFunction
  recorder when it is built (the default route);
- `inside-nvtx` / `inside-shapes-nvtx`: the same with `KINETRACE_TORCH_OPS_ROUTE=nvtx` set by the
  caller: PyTorch's NVTX state on, every op an NVTX range (the fallback route);
- `kinetrace.profile` / `kinetrace.profile-shapes`: inside `kinetrace.profile(activities=[CPU])`
  (with `record_shapes=True`), the in-process API: the shim loaded with ctypes, the same recorder
  route (the caller puts the package on PYTHONPATH and names the shim in KINETRACE_PRELOAD_PATH).

The mode is a label except for `torch.profiler*` and `kinetrace.profile*`: how the process runs is
up to the caller.
"""
import sys
import time

import torch

MODE = sys.argv[1]
WORKLOAD = sys.argv[2] if len(sys.argv) > 2 else "ops"
torch.manual_seed(0)
torch.set_num_threads(1)

if WORKLOAD == "ops":
    N = 200_000
    UNIT, SCALE = "ns/op", 1e9
    a = torch.ones(1)
    b = torch.ones(1)

    def work():
        for _ in range(N):
            torch.add(a, b)
else:
    N = 200
    UNIT, SCALE = "us/step", 1e6
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 32)
    y = torch.randint(0, 10, (64,))

    def work():
        for _ in range(N):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


try:
    import kinetrace

    # Under record: starts profiling here (no CUDA) and turns PyTorch's ops on if a window is open.
    kinetrace.step()
except ImportError:
    kinetrace = None


def once():
    """(wall, CPU time of this thread) of one run of `work`, in seconds."""
    if MODE.startswith("torch.profiler"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU],
                     record_shapes=MODE == "torch.profiler-shapes",
                     with_stack=MODE == "torch.profiler-stack",
                     profile_memory=MODE == "torch.profiler-memory") as p:
            t, c = time.perf_counter(), time.thread_time()
            work()
            dt = time.perf_counter() - t, time.thread_time() - c
        del p
        return dt
    if MODE.startswith("kinetrace.profile"):
        from torch.profiler import ProfilerActivity

        with kinetrace.profile(activities=[ProfilerActivity.CPU],
                               record_shapes=MODE.endswith("-shapes")):
            t, c = time.perf_counter(), time.thread_time()
            work()
            return time.perf_counter() - t, time.thread_time() - c
    t, c = time.perf_counter(), time.thread_time()
    work()
    return time.perf_counter() - t, time.thread_time() - c


runs = [once() for _ in range(5)]
wall = min(r[0] for r in runs)
cpu = min(r[1] for r in runs)
active = bool(kinetrace and kinetrace.is_active())
print(f"{MODE:21} {wall / N * SCALE:8.1f} {UNIT} wall {cpu / N * SCALE:8.1f} {UNIT} CPU   "
      f"(kinetrace profiling: {active})")
