"""What one allocator event costs under `profile_memory`, kinetrace's reporter against torch.profiler's,
with no Python between the events.

`torch_rounds.py`'s `alloc` workload times `torch.empty` from Python: ~1 µs of interpreter and
dispatcher per allocation around the ~0.1–0.3 µs the event adds, so its per-event figures swing
by more than the difference being measured. Here a C++ loop (built once into a temporary
directory against the installed torch, loaded with ctypes) calls c10's CPU allocator directly:
`allocate(bytes)` and the free when its DataPtr goes, N times, timed by this thread's CPU clock.
That is exactly the path `profile_memory` instruments (c10's ProfiledCPUMemoryReporter: its size
table under a mutex, then the reporter in the thread's PROFILER_STATE), and nothing else.

Modes, run in rounds (the order shuffled per round, seeded): `plain` (no profiler), `floor` (a
reporter that keeps nothing: c10's own bookkeeping, which every profiler pays), `torch` /
`torch-memory` (inside `torch.profiler.profile(activities=[CPU])`, without / with
`profile_memory=True`), `kinetrace` / `kinetrace-memory` (inside `kinetrace.profile`, the same
recorder and allocator reporter as `kinetrace record --profile-memory`; PYTHONPATH must hold the
package and KINETRACE_PRELOAD_PATH the shim, as `scripts/bench-torch-ops.sh` sets them). What
`profile_memory` adds per event is the median over rounds of each round's paired difference
(`X-memory` against `X`), with the middle half of those differences beside it, and the
profiler's own part: `X-memory` against `floor`.

    python benches/alloc_events.py [rounds] [allocations per timed loop] [modes,...]
"""
import ctypes
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import torch

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
LOOPS = 5  # timed loops per mode per round (one more first, not counted)
BYTES = 256

SOURCE = r"""
#include <c10/core/CPUAllocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <time.h>

namespace prof = torch::profiler::impl;

// The floor: a reporter that says memory profiling is on and keeps nothing, so c10 does all of
// its own bookkeeping (the size table under its mutex, the look-ups) and the virtual call, and
// no profiler adds anything.
struct Discard final : prof::ProfilerStateBase {
  Discard() : prof::ProfilerStateBase(prof::ProfilerConfig(prof::ProfilerState::Disabled)) {}
  void reportMemoryUsage(void*, int64_t, size_t, size_t, c10::Device) override {}
  bool memoryProfilingEnabled() const override { return true; }
  prof::ActiveProfilerType profilerType() override { return prof::ActiveProfilerType::NONE; }
};

extern "C" void kt_floor_on() {
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::make_shared<Discard>());
}

extern "C" void kt_floor_off() { c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE); }

static long long thread_ns() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

// n allocations of `bytes` from c10's CPU allocator, each freed before the next: this thread's CPU
// nanoseconds for all of them.
extern "C" long long kt_alloc_loop(long long n, long long bytes) {
  c10::Allocator* a = c10::GetCPUAllocator();
  long long start = thread_ns();
  for (long long i = 0; i < n; ++i) {
    c10::DataPtr p = a->allocate(bytes);
  }
  return thread_ns() - start;
}
"""


def build(work):
    torch_dir = os.path.dirname(torch.__file__)
    src = os.path.join(work, "alloc_loop.cpp")
    lib = os.path.join(work, "alloc_loop.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    subprocess.run([os.environ.get("CXX", "c++"), "-O2", "-DNDEBUG", "-shared", "-fPIC",
                    "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi,
                    "-I", os.path.join(torch_dir, "include"),
                    "-I", sysconfig.get_paths()["include"], src,
                    "-L", os.path.join(torch_dir, "lib"), "-lc10", "-ltorch_cpu",
                    "-Wl,-rpath," + os.path.join(torch_dir, "lib"), "-o", lib], check=True)
    lib = ctypes.CDLL(lib)
    lib.kt_alloc_loop.restype = ctypes.c_longlong
    lib.kt_alloc_loop.argtypes = [ctypes.c_longlong, ctypes.c_longlong]
    return lib


def timed(lib):
    """ns per allocator event (an allocation and its free are two) of each timed loop."""
    lib.kt_alloc_loop(N, BYTES)
    return [lib.kt_alloc_loop(N, BYTES) / (2 * N) for _ in range(LOOPS)]


def run(mode, lib, tmp):
    """(ns per event of each timed loop, the window's end in wall ns per event recorded)."""
    from torch.profiler import ProfilerActivity

    memory = mode.endswith("-memory")
    if mode == "plain":
        return timed(lib), 0.0
    if mode == "floor":
        lib.kt_floor_on()
        try:
            return timed(lib), 0.0
        finally:
            lib.kt_floor_off()
    if mode.startswith("torch"):
        window = torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=memory)
    else:
        import kinetrace

        window = kinetrace.profile(activities=[ProfilerActivity.CPU], profile_memory=memory,
                                   on_trace_ready=kinetrace.tensorboard_trace_handler(tmp))
    with window:
        out = timed(lib)
        # The window's end is what the training thread waits for when a cycle closes: torch turns
        # its events into Python objects on this thread; kinetrace hands its trace to on_trace_ready.
        end = time.perf_counter_ns()
    end = time.perf_counter_ns() - end
    for f in os.listdir(tmp):
        if f.endswith(".json") or f.endswith(".gz"):
            os.unlink(os.path.join(tmp, f))
    return out, end / ((LOOPS + 1) * 2 * N)


def main():
    modes = ["plain", "floor", "torch", "torch-memory", "kinetrace", "kinetrace-memory"]
    if len(sys.argv) > 3:
        modes = [m for m in modes if m in sys.argv[3].split(",")]
    rng = random.Random(0)
    rounds = []
    with tempfile.TemporaryDirectory() as work:
        lib = build(work)
        for _ in range(ROUNDS):
            order = modes[:]
            rng.shuffle(order)
            this = {}
            for m in order:
                loops, end = run(m, lib, work)
                this[m] = statistics.median(loops)
                this[m + " end"] = end
            rounds.append(this)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"torch {torch.__version__}, {ROUNDS} rounds x {LOOPS} loops x {N} allocations of "
          f"{BYTES} B per mode, load {' '.join(load)}")
    print(f"{'mode':18} {'CPU ns/event (median over rounds)':>34}")
    for m in modes:
        end = statistics.median(r[m + " end"] for r in rounds) * (LOOPS + 1) * 2 * N / 1e6
        print(f"{m:18} {statistics.median(r[m] for r in rounds):34.1f}   window end {end:7.2f} ms")

    def added(prefix, base=None, what=""):
        d = sorted(r[f"{prefix}-memory{what}"] - r[(base or prefix) + what] for r in rounds)
        q = statistics.quantiles(d, n=4) if len(d) > 1 else [d[0], d[0], d[0]]
        return statistics.median(d), q[0], q[2]

    if all(m in modes for m in ("torch", "torch-memory", "kinetrace", "kinetrace-memory")):
        t, t_lo, t_hi = added("torch")
        k, k_lo, k_hi = added("kinetrace")
        ratio = f"{k / t:.2f}x torch's" if t > 0 else "-"
        print(f"profile_memory adds per event: torch.profiler {t:+.1f} ns [{t_lo:+.1f}, {t_hi:+.1f}]"
              f"   kinetrace {k:+.1f} ns [{k_lo:+.1f}, {k_hi:+.1f}]   {ratio}")
    if all(m in modes for m in ("floor", "torch-memory", "kinetrace-memory")):
        t, t_lo, t_hi = added("torch", "floor")
        k, k_lo, k_hi = added("kinetrace", "floor")
        ratio = f"{k / t:.2f}x torch's" if t > 0 else "-"
        print(f"the profiler's own part (over the floor): torch.profiler {t:+.1f} ns "
              f"[{t_lo:+.1f}, {t_hi:+.1f}]   kinetrace {k:+.1f} ns [{k_lo:+.1f}, {k_hi:+.1f}]   "
              f"{ratio}")
    if all(m in modes for m in ("torch", "torch-memory", "kinetrace", "kinetrace-memory")):
        t, t_lo, t_hi = added("torch", what=" end")
        k, k_lo, k_hi = added("kinetrace", what=" end")
        print(f"the window's end, wall ns per event recorded (what the training thread waits when "
              f"a cycle closes): torch.profiler {t:+.1f} [{t_lo:+.1f}, {t_hi:+.1f}]   kinetrace "
              f"{k:+.1f} [{k_lo:+.1f}, {k_hi:+.1f}]")


main()
