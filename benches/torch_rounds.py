"""What `with_stack` and `profile_memory` add to a training step, kinetrace's against torch.profiler's,
in one process.

`benches/torch_ops.py` runs each mode in its own process; on a shared machine the step time of
the same mode moves by more than what `with_stack` adds, so per-step ratios from it are noise.
Here all modes run in one process, in rounds: each round runs every mode for K steps (in an
order shuffled per round, seeded), timing each step by the CPU time of this thread. A mode's
figure is the median over all its steps; what a switch adds is the median over rounds of the
difference within each round (its mode's median step against the same profiler's without it, a
few seconds apart), with the middle half of those differences beside it to show the noise.
Modes:

- `plain`: no profiler;
- `torch` / `torch-stack` / `torch-memory`: inside `torch.profiler.profile(activities=[CPU])`,
  without a switch, with `with_stack=True`, with `profile_memory=True`;
- `kinetrace` / `kinetrace-stack` / `kinetrace-memory`: the same inside `kinetrace.profile` (the
  same compiled recorder, frame reading and allocator reporter as `kinetrace record --with-stack`
  / `--profile-memory`; the caller puts the package on PYTHONPATH and names the shim in
  KINETRACE_PRELOAD_PATH, as `scripts/bench-torch-ops.sh` does).

The workload is `torch_ops.py`'s `steps`: the guide's MLP with LayerNorm, AdamW and
cross-entropy on a 64-row batch; with `TORCH_ROUNDS_WORKLOAD=alloc`, 1,000 `torch.empty(256)` per
step instead (two allocator events each: what `profile_memory` costs per event). Each profiler is entered and left per round (its export is not
timed); the first steps of each round are not counted.

With `TORCH_ROUNDS_CYCLE=1` each profiler runs the way the guide's loop runs it instead: a
schedule (wait=1, warmup=1, active=K) with `on_trace_ready` writing a trace and `p.step()` after
every step, timed with the step, so the step that ends the cycle carries whatever the profiler does
on the training thread when a cycle closes (torch.profiler turns its events into Python objects and
writes the trace there; kinetrace's collector thread writes it). A mode's figure is then the mean
over the K active steps, the cycle's end included.

    python benches/torch_rounds.py [rounds] [steps per round] [modes,...]
"""
import os
import random
import statistics
import sys
import tempfile
import time

import torch

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 24
K = int(sys.argv[2]) if len(sys.argv) > 2 else 20
WARM = 5
CYCLE = os.environ.get("TORCH_ROUNDS_CYCLE") == "1"

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


if os.environ.get("TORCH_ROUNDS_WORKLOAD") == "alloc":
    # Allocations alone: 1,000 `torch.empty` per "step" (an allocation and a free each, and the
    # op around them), so what profile_memory adds per allocator event stands out.
    def step():  # noqa: F811
        for _ in range(1000):
            torch.empty(256)


def timed(out):
    for i in range(WARM + K):
        c = time.thread_time_ns()
        step()
        if i >= WARM:
            out.append((time.thread_time_ns() - c) / 1e3)


def timed_cycle(p, out):
    """Steps with `p.step()` after each: the wait and warmup steps, then the K active ones timed
    (the last one's `p.step()` ends the cycle)."""
    for i in range(2 + K):
        c = time.thread_time_ns()
        step()
        p.step()
        if i >= 2:
            out.append((time.thread_time_ns() - c) / 1e3)


def run_cycle(mode, out, tmp):
    from torch.profiler import ProfilerActivity

    for _ in range(WARM):
        step()
    if mode == "plain":
        class NoProfiler:
            def step(self):
                pass

        timed_cycle(NoProfiler(), out)
        return
    if mode.startswith("torch"):
        import torch.profiler as api
    else:
        import kinetrace as api
    with api.profile(activities=[ProfilerActivity.CPU], with_stack=mode.endswith("-stack"),
                     profile_memory=mode.endswith("-memory"),
                     schedule=api.schedule(wait=1, warmup=1, active=K, repeat=1),
                     on_trace_ready=api.tensorboard_trace_handler(tmp)) as p:
        timed_cycle(p, out)
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))


def run(mode, out, tmp):
    from torch.profiler import ProfilerActivity

    cpu = [ProfilerActivity.CPU]
    if CYCLE:
        run_cycle(mode, out, tmp)
    elif mode == "plain":
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
    if len(sys.argv) > 3:
        modes = [m for m in modes if m in sys.argv[3].split(",")]
    times = {m: [] for m in modes}
    rounds = []  # per round: mode -> median step
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ROUNDS):
            order = modes[:]
            rng.shuffle(order)
            this = {}
            for m in order:
                out = []
                run(m, out, tmp)
                times[m] += out
                this[m] = statistics.fmean(out) if CYCLE else statistics.median(out)
            rounds.append(this)
    med = {m: statistics.median(r[m] for r in rounds) if CYCLE else statistics.median(v)
           for m, v in times.items()}
    load = open("/proc/loadavg").read().split()[:3]
    what = "the mean over a cycle, its end included" if CYCLE else "median"
    print(f"torch {torch.__version__}, {ROUNDS} rounds x {K} steps per mode, load {' '.join(load)}")
    print(f"{'mode':18} CPU us/step ({what}; median over rounds)")
    for m in modes:
        print(f"{m:18} {med[m]:21.1f}")
    def added(prefix, switch):
        d = sorted(r[f"{prefix}-{switch}"] - r[prefix] for r in rounds)
        q = statistics.quantiles(d, n=4) if len(d) > 1 else [d[0], d[0], d[0]]
        return statistics.median(d), q[0], q[2]

    print("added per step (median of the rounds' differences [middle half]):")
    for switch in ("stack", "memory"):
        if f"torch-{switch}" not in modes or f"kinetrace-{switch}" not in modes:
            continue
        t, t_lo, t_hi = added("torch", switch)
        k, k_lo, k_hi = added("kinetrace", switch)
        ratio = f"{k / t:.2f}x torch's" if t > 0 else "-"
        print(f"  {switch:6} torch.profiler {t:+7.1f} us [{t_lo:+.0f}, {t_hi:+.0f}]   kinetrace "
              f"{k:+7.1f} us [{k_lo:+.0f}, {k_hi:+.0f}]   {ratio}")

main()
