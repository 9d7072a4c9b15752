"""PyTorch's per-event recording cost, the peer figure for `cargo bench --bench span`.

Times N `record_function` ranges (the analogue of kinetrace's span enter/exit) and N tiny `cpu_op`s
(`torch.add` on 1-element tensors) with and without `torch.profiler.profile(activities=[CPU])`;
the cost per event is the difference divided by N (best of 5 runs each). Export is not timed.

Run: target/torch-venv/bin/python benches/peer_torch.py   (scripts/torch-venv.sh makes the venv)
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

N = 200_000


def ranges():
    for _ in range(N):
        with record_function("bench_span"):
            pass


a = torch.ones(1)
b = torch.ones(1)


def ops():
    for _ in range(N):
        torch.add(a, b)


def best(f, profiled):
    times = []
    for _ in range(5):
        if profiled:
            with profile(activities=[ProfilerActivity.CPU]) as p:
                t = time.perf_counter()
                f()
                dt = time.perf_counter() - t
            del p
        else:
            t = time.perf_counter()
            f()
            dt = time.perf_counter() - t
        times.append(dt)
    return min(times)


print(f"torch {torch.__version__}, {N} events per run, best of 5")
for name, f in [("record_function range", ranges), ("cpu_op (torch.add)", ops)]:
    off = best(f, False)
    on = best(f, True)
    print(
        f"{name:24} off {off / N * 1e9:8.1f} ns/event  on {on / N * 1e9:8.1f} ns/event  "
        f"recording cost {(on - off) / N * 1e9:8.1f} ns/event"
    )
