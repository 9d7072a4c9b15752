#!/usr/bin/env python3
"""Two `kinetrace` binaries against HolisticTraceAnalysis 0.5.0 on one trace directory, side by side.

    python3 scripts/bench-analyze-one.py BEFORE AFTER DIR HTA_PYTHON [RUNS] [HTA_RUNS]

Runs `BEFORE analyze --json --quiet` and `AFTER ...` interleaved, RUNS times each (default 10), on
every `*.json.gz` in DIR and on `DIR/../<name>.json` next to it when present (the same rank
gunzipped), then HTA's import + load + four analyses (the script of scripts/bench-analyze.sh)
HTA_RUNS times (default 2). Every process runs at `nice -n 10`. Wall time is perf_counter around
the whole process; CPU time is user + system from getrusage of the children. Prints the load
average before and after, min/median of each, and the best-against-best ratios to HTA.
(scripts/bench-analyze.sh reports /usr/bin/time's 10 ms resolution; this one is finer.)
"""
import glob
import os
import resource
import subprocess
import sys
import time

HTA = """
import sys, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
ranks = a.t.get_ranks()
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
a.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=True)
a.get_gpu_kernel_breakdown(visualize=False)
"""


def run(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(["nice", "-n", "10"] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr.decode(errors='replace')[-2000:]}")
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    before, after, tdir, hta_python = sys.argv[1:5]
    runs = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    hta_runs = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    gz = sorted(glob.glob(os.path.join(tdir, "*.json.gz")))
    if len(gz) != 1:
        sys.exit(f"expected one *.json.gz in {tdir}")
    inputs = [("gz", gz[0])]
    plain = os.path.join(os.path.dirname(os.path.abspath(tdir)), os.path.basename(os.path.normpath(tdir)).removesuffix("gz") + ".json")
    if os.path.exists(plain):
        inputs.append(("plain", plain))
    load0 = open("/proc/loadavg").read().split()[:3]
    res = {}
    for _ in range(runs):
        for name, b in (("before", before), ("after", after)):
            for kind, f in inputs:
                res.setdefault((name, kind), []).append(run([b, "analyze", "--json", "--quiet", f]))
    for _ in range(hta_runs):
        res.setdefault(("HTA", "gz"), []).append(run([hta_python, "-c", HTA, tdir]))
    load1 = open("/proc/loadavg").read().split()[:3]
    print(f"load average before {' '.join(load0)}, after {' '.join(load1)}")
    for (name, kind), v in res.items():
        w = sorted(x[0] for x in v)
        c = sorted(x[1] for x in v)
        print(f"{name:7} {kind:6} n={len(v):2}  wall min {w[0]:.3f} s, median {w[len(w) // 2]:.3f} s"
              f"  CPU min {c[0]:.3f} s, median {c[len(c) // 2]:.3f} s")
    hw = min(x[0] for x in res[("HTA", "gz")])
    hc = min(x[1] for x in res[("HTA", "gz")])
    for name in ("before", "after"):
        w = min(x[0] for x in res[(name, "gz")])
        c = min(x[1] for x in res[(name, "gz")])
        print(f"{name}: HTA / kinetrace, best against best: wall {hw / w:.1f}x, CPU {hc / c:.1f}x")


if __name__ == "__main__":
    main()
