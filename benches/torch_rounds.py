"""What `with_stack` and `profile_memory` add to a training step, kinetrace's against torch.profiler's,
in one process.

`benches/torch_ops.py` runs each mode in its own process; on a shared machine the step time of
the same mode moves by more than what `with_stack` adds, so per-step ratios from it are noise.
Here all modes run in one process, in rounds: each round runs every mode for K steps (in an
order shuffled per round, seeded), timing each step by the CPU time of this thread; a mode's
figure is the median over all its steps. Modes:

- `plain`: no profiler;
- `torch` / `torch-stack` / `torch-memory`: inside `torch.profiler.profile(activities=[CPU])`,
  without a switch, with `with_stack=True`, with `profile_memory=True`;
- `kinetrace` / `kinetrace-stack` / `kinetrace-memory`: the same inside `kinetrace.profile` (the
  same compiled recorder, frame reading and allocator reporter as `kinetrace record --with-stack`
  / `--profile-memory`; the caller puts the package on PYTHONPATH and names the shim in
  KINETRACE_PRELOAD_PATH, as `scripts/bench-torch-ops.sh` does).

The workload is `torch_ops.py`'s `steps`: the guide's MLP with LayerNorm, AdamW and
cross-entropy on a 64-row batch. Each profiler is entered and left per round (its export is not
timed); the first steps of each round are not counted.

    python benches/torch_rounds.py [rounds] [steps per round]
"""
import os
import random
import statistics
import sys
import tempfile
import time

import torch

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
K = int(sys.argv[2]) if len(sys.argv) > 2 else 40
WARM = 5

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64),
                            torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 32)
y = torch.randint(0, 10, (64,))


def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def timed(out):
    for i in range(WARM + K):
        c = time.thread_time_ns()
        step()
        if i >= WARM:
            out.append((time.thread_time_ns() - c) / 1e3)


def run(mode, out, tmp):
    from torch.profiler import ProfilerActivity

    cpu = [ProfilerActivity.CPU]
    if mode == "plain":
        timed(out)
    elif mode.startswith("torch"):
        with torch.profiler.profile(activities=cpu, with_stack=mode.endswith("-stack"),
                                    profile_memory=mode.endswith("-memory")) as p:
            timed(out)
        del p
    else:
        import kinetrace

        handler = kinetrace.tensorboard_trace_handler(tmp)
        with kinetrace.profile(activities=cpu, with_stack=mode.endswith("-stack"),
                               profile_memory=mode.endswith("-memory"), on_trace_ready=handler):
            timed(out)
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))


def main():
    modes = ["plain", "torch", "torch-stack", "torch-memory", "kinetrace", "kinetrace-stack",
             "kinetrace-memory"]
    times = {m: [] for m in modes}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ROUNDS):
            order = modes[:]
            rng.shuffle(order)
            for m in order:
                run(m, times[m], tmp)
    med = {m: statistics.median(v) for m, v in times.items()}
    load = open("/proc/loadavg").read().split()[:3]
    print(f"torch {torch.__version__}, {ROUNDS} rounds x {K} steps per mode, load {' '.join(load)}")
    print(f"{'mode':18} {'CPU us/step (median)':>21}")
    for m in modes:
        print(f"{m:18} {med[m]:21.1f}")
    for switch in ("stack", "memory"):
        t_add = med[f"torch-{switch}"] - med["torch"]
        k_add = med[f"kinetrace-{switch}"] - med["kinetrace"]
        ratio = f" ({k_add / t_add:.2f}x torch's)" if t_add > 0 else ""
        print(f"{switch:6} adds: torch.profiler {t_add:+7.1f} us/step, kinetrace {k_add:+7.1f} "
              f"us/step{ratio}")

main()
