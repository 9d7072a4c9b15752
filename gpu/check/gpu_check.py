#!/usr/bin/env python3
"""The GPU check of kinetrace (driven by scripts/gpu-check.sh; standard library only, plus torch
for the PyTorch workloads).

Subcommands:

  all --stage DIR --out DIR        the whole check on an NVIDIA machine: the cudarc workload under
                                   kinetrace, its trace checked; the same work in PyTorch under
                                   torch.profiler, compared; a small training loop under
                                   `kinetrace record --iterations 3` vs torch.profiler (if the staged
                                   CLI has `record`); a bf16 matmul of known size through `kinetrace
                                   analyze --only efficiency` (efficiency_check.py). One summary
                                   table; exit 1 on any failed check.
  check-trace TRACE [--expect-json FILE | --expect kernel=N,...] [options]
                                   the trace checks alone, on any trace (e.g. one synthesised, or
                                   the demo's with the counts it should hold).
  selftest [--out DIR]             synthesises a trace in the workload's shape, checks that it passes
                                   and that each kind of damage is caught (no GPU needed).
  torch-workload ...               the PyTorch workloads (run by `all`; prints one JSON line).
  rocm --stage DIR --out DIR       the check on an AMD machine with ROCm PyTorch (issue 11): the
                                   training loop under torch.profiler (Kineto's ROCm path) and under
                                   `kinetrace record` (the staged shim registered as a rocprofiler-sdk
                                   tool through ROCP_TOOL_LIBRARIES), compared; the trace checks that
                                   apply, plus the ROCm ones (`rocm_trace_checks`). Never run yet: no
                                   AMD GPU has been available to the project.
"""

import argparse
import collections
import copy
import glob
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
T0 = time.monotonic()
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "450"))  # the whole run: < 8 minutes


def progress(msg):
    sys.stderr.write("[gpu-check %6.1fs] %s\n" % (time.monotonic() - T0, msg))
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------------
# Traces


def load_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def find_traces(root):
    out = []
    for pat in ("**/*.pt.trace.json", "**/*.pt.trace.json.gz", "**/*.trace.json", "**/*.json.gz"):
        out += glob.glob(os.path.join(root, pat), recursive=True)
    return sorted(set(out))


def step_num(name):
    try:
        return int(name.split("#", 1)[1])
    except (IndexError, ValueError):
        return None


class Trace:
    """The parts of a Kineto trace the checks need."""

    def __init__(self, data, path="<trace>"):
        self.path = path
        self.data = data
        evs = data.get("traceEvents", []) if isinstance(data, dict) else data
        self.events = evs
        self.gpu = [e for e in evs if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
        self.api = [e for e in evs if e.get("ph") == "X" and e.get("cat") in API_CATS]
        self.api_by_corr = {}
        for e in self.api:
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                self.api_by_corr.setdefault(c, e)
        self.flow_s = collections.defaultdict(list)
        self.flow_f = collections.defaultdict(list)
        for e in evs:
            if e.get("cat") != "ac2g" and e.get("name") != "ac2g":
                continue
            if e.get("ph") == "s":
                self.flow_s[e.get("id")].append(e)
            elif e.get("ph") == "f":
                self.flow_f[e.get("id")].append(e)
        self.steps = []  # (n, ts, end, pid)
        for e in evs:
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                n = step_num(e["name"])
                if n is not None:
                    self.steps.append((n, float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("pid")))
        self.steps.sort()
        self.annotations = collections.defaultdict(list)  # External id -> [span]
        for e in evs:
            if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op"):
                x = (e.get("args") or {}).get("External id")
                if x is not None:
                    self.annotations[x].append(e)

    def step_of_ts(self, ts):
        for n, a, b, _ in self.steps:
            if a <= ts <= b:
                return n
        return None

    def step_window(self, n):
        for m, a, b, _ in self.steps:
            if m == n:
                return a, b
        return None

    def step_of_gpu(self, e):
        """The step whose CPU window holds the API call that launched `e`."""
        c = (e.get("args") or {}).get("correlation")
        api = self.api_by_corr.get(c)
        if api is None:
            return None
        return self.step_of_ts(float(api["ts"]))

    def counts(self):
        return dict(collections.Counter(e["cat"] for e in self.gpu))

    def per_step(self):
        """{step: {cat: n}} over GPU records; step None = launched outside every ProfilerStep."""
        out = collections.defaultdict(collections.Counter)
        for e in self.gpu:
            out[self.step_of_gpu(e)][e["cat"]] += 1
        return {k: dict(v) for k, v in out.items()}


def parse_expect(s):
    out = {}
    for part in s.split(","):
        if not part.strip():
            continue
        k, _, v = part.partition("=")
        out[k.strip()] = int(v)
    return out


def check_trace(tr, expect, span_name="iter", busy=None, slack_us=20.0):
    """The checks of a kinetrace trace of the cudarc workload. `expect` holds `counts` (totals per
    category), optionally `per_step` (per recorded step) and `recorded_steps`. `busy` = (kernel name,
    expected µs) for the duration check. Returns [(name, ok, detail)]."""
    res = []

    def add(name, ok, detail):
        res.append((name, bool(ok), detail))

    counts = tr.counts()
    want = expect.get("counts", {})
    add("trace has GPU records", len(tr.gpu) > 0, "%d GPU records, %d API records" % (len(tr.gpu), len(tr.api)))
    for cat in GPU_CATS:
        if cat in want:
            add("count %s" % cat, counts.get(cat, 0) == want[cat], "trace %d, launched %d" % (counts.get(cat, 0), want[cat]))
    per = tr.per_step()
    steps_want = expect.get("recorded_steps")
    if steps_want is not None:
        got = sorted(n for n, _, _, _ in tr.steps)
        add("recorded steps", got == sorted(steps_want), "trace ProfilerStep# %s, expected %s" % (got, sorted(steps_want)))
    if expect.get("per_step"):
        bad = []
        for n in steps_want or sorted(k for k in per if k is not None):
            got = per.get(n, {})
            for cat, k in expect["per_step"].items():
                if got.get(cat, 0) != k:
                    bad.append("step %s %s %d != %d" % (n, cat, got.get(cat, 0), k))
        if None in per:
            bad.append("%d GPU records launched outside every ProfilerStep" % sum(per[None].values()))
        add("counts per step", not bad, "; ".join(bad[:4]) or "each step: %s" % expect["per_step"])

    # Correlation: every GPU record has its runtime/driver call, and an ac2g flow pair.
    no_corr, no_api, no_flow = [], [], []
    for e in tr.gpu:
        c = (e.get("args") or {}).get("correlation")
        if c is None:
            no_corr.append(e["name"])
            continue
        if c not in tr.api_by_corr:
            no_api.append("%s#%s" % (e["name"], c))
        s, f = tr.flow_s.get(c, []), tr.flow_f.get(c, [])
        if len(s) != 1 or len(f) != 1:
            no_flow.append("%s#%s (s=%d f=%d)" % (e["name"], c, len(s), len(f)))
    add("correlation ids", not no_corr, "%d GPU records lack one %s" % (len(no_corr), no_corr[:3]))
    add("runtime/driver call per GPU record", not no_api, "%d unmatched %s" % (len(no_api), no_api[:3]))
    add("ac2g flow pair per GPU record", not no_flow, "%d without one s+f pair %s" % (len(no_flow), no_flow[:3]))
    flow_ts_bad = 0
    for e in tr.gpu:
        c = (e.get("args") or {}).get("correlation")
        api = tr.api_by_corr.get(c)
        s = tr.flow_s.get(c, [])
        if api is not None and len(s) == 1 and abs(float(s[0]["ts"]) - float(api["ts"])) > 1.0:
            flow_ts_bad += 1
    add("ac2g starts at its API call", flow_ts_bad == 0, "%d flow starts off their API call" % flow_ts_bad)

    # External id: kernels (and copies, sets) link to the enclosing span.
    unlinked = []
    for e in tr.gpu:
        x = (e.get("args") or {}).get("External id")
        spans = tr.annotations.get(x, [])
        if span_name == "any":
            ok = bool(spans)
        else:
            ok = any(s.get("name") == span_name for s in spans)
        if not ok:
            unlinked.append("%s(ext %s)" % (e["name"], x))
    add("External id -> '%s' span" % span_name, not unlinked, "%d of %d GPU records unlinked %s" % (len(unlinked), len(tr.gpu), unlinked[:3]))

    # Durations.
    nonpos = [e["name"] for e in tr.gpu if not float(e.get("dur", 0)) > 0]
    add("durations > 0", not nonpos, "%d GPU records with dur <= 0 %s" % (len(nonpos), nonpos[:3]))
    if busy:
        name, us = busy
        durs = [float(e["dur"]) for e in tr.gpu if e["cat"] == "kernel" and name in e["name"]]
        ok = bool(durs) and all(0.8 * us <= d <= 2.0 * us for d in durs)
        detail = "%d x %s: %s us (expected %.0f us, within 0.8x-2x)" % (
            len(durs), name, ("%.1f..%.1f" % (min(durs), max(durs))) if durs else "none", us)
        add("kernel B duration", ok, detail)
    bw_bad, bw_seen = [], 0
    for e in tr.gpu:
        b = (e.get("args") or {}).get("bytes")
        d = float(e.get("dur", 0))
        if e["cat"] in ("gpu_memcpy", "gpu_memset") and b and d > 0:
            bw_seen += 1
            gbs = b / (d * 1e3)  # bytes per ns = GB/s
            if not 0.05 <= gbs <= 5000:
                bw_bad.append("%s %.3g GB/s" % (e["name"], gbs))
    if bw_seen:
        add("copy/set bandwidth plausible", not bw_bad, "%d of %d outside 0.05-5000 GB/s %s" % (len(bw_bad), bw_seen, bw_bad[:3]))
    streams = collections.defaultdict(set)
    for e in tr.gpu:
        if e["cat"] == "kernel":
            streams[e["name"]].add((e.get("args") or {}).get("stream"))
    if busy and len(streams) >= 2:
        all_streams = set().union(*streams.values())
        add("kernels on two streams", len(all_streams) >= 2, "streams %s" % sorted(map(str, all_streams)))

    # Timestamps: each GPU record inside the CPU window of the step that launched it.
    outside = []
    for e in tr.gpu:
        n = tr.step_of_gpu(e)
        if n is None:
            continue
        a, b = tr.step_window(n)
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if ts < a - slack_us or end > b + slack_us:
            outside.append("%s step %d: [%.1f, %.1f] vs [%.1f, %.1f]" % (e["name"], n, ts - a, end - a, 0.0, b - a))
    add("GPU records within their step", not outside, "%d outside (+-%.0f us) %s" % (len(outside), slack_us, outside[:2]))

    dropped = tr.data.get("dropped_events") if isinstance(tr.data, dict) else None
    if isinstance(dropped, dict):
        total = sum(v for v in dropped.values() if isinstance(v, (int, float)))
        add("no dropped events", total == 0, json.dumps(dropped))
    return res


HIP_LAUNCHES = ("hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel")


def rocm_trace_checks(tr):
    """The ROCm-specific checks of a kinetrace trace (docs/rocm-support.md): which backend recorded
    it, HIP calls with Kineto's `cid`, launch arguments as Kineto writes them (rocprofiler-sdk
    backend), kernels on the rows of their stream. Returns [(name, ok, detail)]."""
    res = []

    def add(name, ok, detail):
        res.append((name, ok if ok is None else bool(ok), detail))

    data = tr.data if isinstance(tr.data, dict) else {}
    backend = data.get("rocm_backend")
    add("ROCm backend named", backend in ("rocprofiler-sdk", "roctracer"),
        "rocm_backend %r (%s)" % (backend, data.get("rocprofiler_sdk_version") or data.get("roctracer_version")))
    no_cid = [e["name"] for e in tr.api if "cid" not in (e.get("args") or {})]
    add("HIP calls carry cid", tr.api and not no_cid, "%d of %d without %s" % (len(no_cid), len(tr.api), no_cid[:3]))
    if backend == "rocprofiler-sdk":
        launches = [e for e in tr.api if e.get("name") in HIP_LAUNCHES]
        bad = [e["name"] for e in launches
               if not all(k in (e.get("args") or {}) for k in ("stream", "grid", "block", "shared memory"))]
        add("launch arguments (stream, grid, block, shared memory)", launches and not bad,
            "%d launches, %d without %s" % (len(launches), len(bad), bad[:3]))
        named = sum(1 for e in launches if "kernel" in (e.get("args") or {}))
        add("launches naming their kernel", None, "%d of %d" % (named, len(launches)))
    rows_bad = [e["name"] for e in tr.gpu
                if e.get("pid") != (e.get("args") or {}).get("device") or e.get("tid") != (e.get("args") or {}).get("stream")]
    add("GPU rows are (device, stream)", not rows_bad, "%d off %s" % (len(rows_bad), rows_bad[:3]))
    return res


def innermost_range(ranges_by_tid, api):
    """The innermost user_annotation / cpu_op on the API call's thread whose span holds the call."""
    ts, end = float(api["ts"]), float(api["ts"]) + float(api.get("dur", 0))
    best = None
    for r in ranges_by_tid.get((api.get("pid"), api.get("tid")), []):
        a = float(r["ts"])
        b = a + float(r.get("dur", 0))
        if a <= ts + 1e-3 and end <= b + 1e-3 and (best is None or float(best["ts"]) <= a):
            if best is not None and float(best["ts"]) == a and float(r.get("dur", 0)) > float(best.get("dur", 0)):
                continue
            best = r
    return best


def candle_checks(tr, recorded_steps, linears_per_forward):
    """The checks of the candle example's trace (examples/candle, `cuda` build): every kernel carries
    the External id of the innermost range open on the thread that launched it (a `linear` for the
    forward's matmuls, `backward`, `optimizer`...), each recorded forward's `linear` ranges launched
    kernels, and kernel counts per step are stable. Returns [(name, ok, detail)]."""
    res = []

    def add(name, ok, detail):
        res.append((name, bool(ok), detail))

    kernels = [e for e in tr.gpu if e.get("cat") == "kernel"]
    add("kernels recorded", kernels, "%d kernels, %d API calls" % (len(kernels), len(tr.api)))
    got = sorted(n for n, _, _, _ in tr.steps)
    add("recorded steps", got == sorted(recorded_steps), "trace ProfilerStep# %s, expected %s" % (got, sorted(recorded_steps)))
    ranges_by_tid = collections.defaultdict(list)
    for e in tr.events:
        if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op"):
            ranges_by_tid[(e.get("pid"), e.get("tid"))].append(e)
    no_ext, no_api, wrong, by_range = [], [], [], collections.Counter()
    under_linear = collections.Counter()  # step -> kernels launched inside a `linear`
    for k in kernels:
        a = k.get("args") or {}
        x = a.get("External id")
        if x is None or x not in tr.annotations:
            no_ext.append("%s(ext %s)" % (k["name"][:40], x))
        api = tr.api_by_corr.get(a.get("correlation"))
        if api is None:
            no_api.append(k["name"][:40])
            continue
        r = innermost_range(ranges_by_tid, api)
        if r is None or (r.get("args") or {}).get("External id") != x:
            wrong.append("%s: ext %s, launched in %s (ext %s)" % (
                k["name"][:40], x, r and r.get("name"), r and (r.get("args") or {}).get("External id")))
            continue
        by_range[r.get("name")] += 1
        if r.get("name") == "linear":
            under_linear[tr.step_of_ts(float(api["ts"]))] += 1
    add("every kernel carries a range's External id", not no_ext, "%d of %d without %s" % (len(no_ext), len(kernels), no_ext[:3]))
    add("a launch call per kernel", not no_api, "%d of %d without %s" % (len(no_api), len(kernels), no_api[:3]))
    add("External id = innermost range of the launch", not wrong,
        "%d of %d off %s; kernels by range %s" % (len(wrong), len(kernels), wrong[:2], dict(by_range)))
    short = [n for n in recorded_steps if under_linear.get(n, 0) < linears_per_forward]
    add("kernels under each `linear`", not short,
        "per step %s (>= %d expected: a matmul per linear)" % (dict(under_linear), linears_per_forward))
    per = per_step_kernels(tr)
    add("kernel counts per step stable", per and len(set(per.values())) == 1, "per step %s" % per)
    return res


# --------------------------------------------------------------------------------------------------
# A synthetic trace in the workload's shape (self-test without a GPU)


def synth_trace(recorded_steps, busy_us=200.0, pid=4242, tid=4242, base=1_000_000.0):
    evs = []
    ext = 100
    corr = 1000
    ts = base
    for n in recorded_steps:
        step_ts = ts
        ext += 1
        step_ext = ext
        ext += 1
        iter_ext = ext
        t = step_ts + 2.0
        ops = [
            ("cuMemcpyHtoDAsync_v2", "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 7, 40.0),
            ("cuLaunchKernel", "kernel", "kt_vadd", 7, 10.0),
            ("cuMemcpyDtoHAsync_v2", "gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 7, 40.0),
            ("cuMemsetD8Async", "gpu_memset", "Memset (Device)", 13, 5.0),
            ("cuLaunchKernel", "kernel", "kt_busy", 13, busy_us + 3.0),
        ]
        gpu_t = {7: t + 5.0, 13: t + 5.0}
        for api_name, cat, name, stream, dur in ops:
            corr += 1
            evs.append({"ph": "X", "cat": "cuda_driver", "name": api_name, "pid": pid, "tid": tid, "ts": t,
                        "dur": 3.0, "args": {"External id": iter_ext, "cbid": 1, "correlation": corr}})
            evs.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": t, "cat": "ac2g", "name": "ac2g"})
            g = max(gpu_t[stream], t + 4.0)
            evs.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": g, "dur": dur,
                        "args": {"External id": iter_ext, "device": 0, "context": 1, "stream": stream,
                                 "correlation": corr}})
            evs.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": g, "cat": "ac2g", "name": "ac2g", "bp": "e"})
            gpu_t[stream] = g + dur
            t += 4.0
        end = max(gpu_t.values()) + 5.0
        evs.append({"ph": "X", "cat": "user_annotation", "name": "iter", "pid": pid, "tid": tid, "ts": step_ts + 1.0,
                    "dur": end - step_ts, "args": {"External id": iter_ext}})
        evs.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % n, "pid": pid, "tid": tid,
                    "ts": step_ts, "dur": end - step_ts + 3.0, "args": {"External id": step_ext}})
        ts = end + 10.0
    return {"schemaVersion": 1, "traceEvents": evs, "dropped_events": {"cpu_ring": 0, "cupti": 0}}


# --------------------------------------------------------------------------------------------------
# burn-cuda (issue 12): examples/burn built with `--features cuda`, fusion off. cubecl launches every
# kernel later, on its device thread; kinetrace-burn pairs each launch with the range that issued it.

BURN_STEPS = [3, 4, 5]


def burn_trace_checks(tr, steps=BURN_STEPS):
    """[(check, ok, detail)] for the burn example's trace: the steps, every kernel's External id
    naming a range on the training thread that began before the kernel's launch call, and the same
    number of kernels issued in every recorded step."""
    out = []
    got_steps = [n for n, _, _, _ in tr.steps]
    out.append(("burn: recorded steps", got_steps == steps, "%s (expected %s)" % (got_steps, steps)))
    kernels = [e for e in tr.gpu if e.get("cat") == "kernel"]
    out.append(("burn: kernels recorded", len(kernels) > 0, "%d kernels" % len(kernels)))
    step_tids = {e.get("tid") for e in tr.events
                 if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}
    bad, issued = [], collections.Counter()
    for k in kernels:
        args = k.get("args") or {}
        ext = args.get("External id")
        api = tr.api_by_corr.get(args.get("correlation"))
        spans = [sp for sp in tr.annotations.get(ext, []) if sp.get("tid") in step_tids] if ext is not None else []
        if not spans:
            bad.append("%s: External id %s names no range on the training thread" % (k.get("name"), ext))
            continue
        sp = spans[0]
        if api is not None and float(sp["ts"]) > float(api["ts"]):
            bad.append("%s: its range %s began after the launch call" % (k.get("name"), sp.get("name")))
            continue
        issued[tr.step_of_ts(float(sp["ts"]))] += 1
    out.append(("burn: every kernel carries its issuing range", len(kernels) > 0 and not bad,
                "%d/%d attributed%s" % (len(kernels) - len(bad), len(kernels), ("; e.g. " + "; ".join(bad[:3])) if bad else "")))
    per = [issued.get(n, 0) for n in steps]
    out.append(("burn: kernels per step stable", len(set(per)) == 1 and per[0] > 0,
                "issued per step %s (outside the steps: %d)" % (dict(zip(steps, per)), issued.get(None, 0))))
    other = sum(1 for k in kernels
                if tr.api_by_corr.get((k.get("args") or {}).get("correlation"), {}).get("tid") not in step_tids)
    out.append(("burn: launched off the training thread", None,
                "%d/%d launch calls on another thread (cubecl's device thread)" % (other, len(kernels))))
    return out


def synth_burn_trace(steps=BURN_STEPS, pid=77, train_tid=77, server_tid=78, base=2_000_000.0):
    evs = []
    ext, corr, ts = 500, 9000, base
    for n in steps:
        step_ts = ts
        ext += 1
        evs.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % n, "pid": pid, "tid": train_tid,
                    "ts": step_ts, "dur": 300.0, "args": {"External id": ext}})
        t = step_ts + 5.0
        for rng in ("forward", "backward", "optimizer"):
            ext += 1
            evs.append({"ph": "X", "cat": "user_annotation", "name": rng, "pid": pid, "tid": train_tid, "ts": t,
                        "dur": 80.0, "args": {"External id": ext}})
            for i in range(3):
                corr += 1
                launch = t + 10.0 + 20.0 * i
                evs.append({"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": pid, "tid": server_tid,
                            "ts": launch, "dur": 3.0, "args": {"External id": ext, "correlation": corr}})
                evs.append({"ph": "X", "cat": "kernel", "name": "%s_k%d_f32_0000abcd" % (rng, i), "pid": 0, "tid": 7,
                            "ts": launch + 5.0, "dur": 4.0,
                            "args": {"External id": ext, "correlation": corr, "device": 0, "stream": 7}})
            t += 90.0
        ts = step_ts + 310.0
    return {"schemaVersion": 1, "traceEvents": evs}


def burn_selftest():
    """The burn checks pass a well-formed synthetic trace and catch each kind of damage."""
    failures = 0
    good = synth_burn_trace()
    bad = [r for r in burn_trace_checks(Trace(good)) if r[1] is False]
    print("selftest: clean synthetic burn trace: %d failed" % len(bad))
    for r in bad:
        print("  unexpected failure: %s: %s" % (r[0], r[2]))
    failures += len(bad)

    def kernel_at(t, i):
        return [e for e in t["traceEvents"] if e.get("cat") == "kernel"][i]

    def server_range(t):
        # The kernel's id names a range, but one on the launching (server) thread.
        t["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "on_server", "pid": 77, "tid": 78,
                                 "ts": 1.0, "dur": 1.0, "args": {"External id": 4242}})
        kernel_at(t, 0)["args"]["External id"] = 4242

    def late_range(t):
        k = kernel_at(t, 1)
        for e in t["traceEvents"]:
            if e.get("cat") == "user_annotation" and (e.get("args") or {}).get("External id") == k["args"]["External id"]:
                e["ts"] = k["ts"] + 100.0

    for what, mutate, expect_fail in [
        ("a kernel without External id", lambda t: kernel_at(t, 3)["args"].pop("External id"),
         "burn: every kernel carries its issuing range"),
        ("a kernel labelled with a server-thread range", server_range, "burn: every kernel carries its issuing range"),
        ("a kernel whose range began after its launch", late_range, "burn: every kernel carries its issuing range"),
        ("a kernel missing in one step", lambda t: t["traceEvents"].remove(kernel_at(t, 10)), "burn: kernels per step stable"),
        ("a step missing", lambda t: t["traceEvents"].pop(
            next(i for i, e in enumerate(t["traceEvents"]) if e.get("name") == "ProfilerStep#4")), "burn: recorded steps"),
    ]:
        t = copy.deepcopy(good)
        mutate(t)
        failed = {r[0] for r in burn_trace_checks(Trace(t)) if r[1] is False}
        ok = expect_fail in failed
        print("selftest: %-42s -> %s" % (what, "caught by '%s'" % expect_fail if ok else "NOT caught (failed: %s)" % sorted(failed)))
        if not ok:
            failures += 1
    return failures


def cmd_burn(s, stage, out, libs):
    """The burn-cuda step of `all`: the staged example with and without the profiler."""
    exe = os.path.join(stage, "bin", "kinetrace-burn-example-cuda")
    if not os.path.exists(exe):
        s.add("burn-cuda", "example", None, "SKIPPED: not staged (GPU_CHECK_BUILD_BURN=1 scripts/gpu-check.sh build)")
        return
    env = workload_env(libs)
    # cubecl-cuda compiles with NVRTC at run time and needs the CUDA headers ($CUDA_PATH/include):
    # PyTorch's NVIDIA wheels carry them when no toolkit is installed.
    if not any(os.path.exists(os.path.join(env.get(k, ""), "include", "cuda_fp16.h")) for k in ("CUDA_PATH", "CUDA_HOME")):
        for d in libs.get("include_roots", []):
            env["CUDA_PATH"] = d
            break
    s.add("burn-cuda", "CUDA headers", None, "CUDA_PATH=%s" % env.get("CUDA_PATH", env.get("CUDA_HOME")))
    runs = {}
    for label, extra in (("off", ["--off"]), ("on", [])):
        d = os.path.join(out, "burn-" + label)
        shutil.rmtree(d, ignore_errors=True)
        rc, so, se = run_child([exe, d] + extra, 240, env=env, log=os.path.join(out, "burn-%s.log" % label))
        runs[label] = last_json(so)
        s.add("burn-cuda", "ran (%s)" % ("profiled" if label == "on" else "no profiler"), rc == 0 and runs[label] is not None,
              "rc %d%s" % (rc, "" if rc == 0 else "; " + " | ".join(se.strip().splitlines()[-2:])))
    on = runs.get("on") or {}
    if on.get("traces"):
        tr = Trace(load_trace(on["traces"][0]), on["traces"][0])
        for name, ok, detail in burn_trace_checks(tr, on.get("recorded_steps") or BURN_STEPS):
            s.add("burn-cuda", name, ok, detail)
        s.add("burn-cuda", "launch attribution counts", None, json.dumps(on.get("attribution")))
    elif runs.get("on") is not None:
        s.add("burn-cuda", "trace written", False, "no trace")
    off = runs.get("off") or {}
    rec = on.get("recorded_steps") or BURN_STEPS
    try:
        t_on = statistics.median(on["step_ms"][n] for n in rec)
        t_off = statistics.median(off["step_ms"][n] for n in rec)
        s.add("overhead", "burn-cuda: added per step", None, "%.3f ms (median of steps %s: profiled %.3f ms, no profiler %.3f ms)"
              % (t_on - t_off, rec, t_on, t_off))
    except (KeyError, IndexError, TypeError, statistics.StatisticsError):
        s.add("overhead", "burn-cuda: added per step", None, "n/a")



def selftest(out_dir):
    steps = [2, 3, 4, 5]
    expect = {"counts": {"kernel": 8, "gpu_memcpy": 8, "gpu_memset": 4}, "recorded_steps": steps,
              "per_step": {"kernel": 2, "gpu_memcpy": 2, "gpu_memset": 1}}
    good = synth_trace(steps)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "synthetic.pt.trace.json")
    with open(path, "w") as f:
        json.dump(good, f)
    failures = 0
    res = check_trace(Trace(load_trace(path), path), expect, busy=("kt_busy", 200.0))
    bad = [r for r in res if not r[1]]
    print("selftest: clean synthetic trace: %d checks, %d failed" % (len(res), len(bad)))
    for r in bad:
        print("  unexpected failure: %s: %s" % (r[0], r[2]))
    failures += len(bad)

    def damaged(what, mutate, expect_fail):
        nonlocal failures
        t = copy.deepcopy(good)
        mutate(t["traceEvents"])
        res = check_trace(Trace(t), expect, busy=("kt_busy", 200.0))
        failed = {r[0] for r in res if not r[1]}
        ok = expect_fail in failed
        print("selftest: %-42s -> %s" % (what, "caught by '%s'" % expect_fail if ok else "NOT caught (failed: %s)" % sorted(failed)))
        if not ok:
            failures += 1

    def first(evs, pred):
        return next(i for i, e in enumerate(evs) if pred(e))

    damaged("a kernel missing", lambda evs: evs.pop(first(evs, lambda e: e.get("cat") == "kernel")), "count kernel")
    damaged("a memset missing", lambda evs: evs.pop(first(evs, lambda e: e.get("cat") == "gpu_memset")), "count gpu_memset")
    damaged("an API record missing", lambda evs: evs.pop(first(evs, lambda e: e.get("cat") == "cuda_driver")),
            "runtime/driver call per GPU record")
    damaged("a flow end missing", lambda evs: evs.pop(first(evs, lambda e: e.get("ph") == "f")), "ac2g flow pair per GPU record")
    damaged("a kernel's External id wrong",
            lambda evs: evs[first(evs, lambda e: e.get("cat") == "kernel")]["args"].__setitem__("External id", 99999),
            "External id -> 'iter' span")
    damaged("kernel B too short",
            lambda evs: evs[first(evs, lambda e: e.get("name") == "kt_busy")].__setitem__("dur", 20.0), "kernel B duration")
    damaged("a zero duration",
            lambda evs: evs[first(evs, lambda e: e.get("cat") == "gpu_memcpy")].__setitem__("dur", 0.0), "durations > 0")
    damaged("a kernel outside its step",
            lambda evs: evs[first(evs, lambda e: e.get("name") == "kt_vadd")].__setitem__("ts", 10.0), "GPU records within their step")
    damaged("a step missing", lambda evs: evs.pop(first(evs, lambda e: e.get("name") == "ProfilerStep#3")), "recorded steps")

    # The ROCm checks, on the synthetic trace turned into a rocprofiler-sdk one.
    def as_rocm(t):
        t["rocm_backend"] = "rocprofiler-sdk"
        for e in t["traceEvents"]:
            if e.get("cat") in API_CATS:
                e["cat"] = "cuda_runtime"
                e["name"] = "hipLaunchKernel"
                a = e.setdefault("args", {})
                a["cid"] = a.pop("cbid", 214)
                a.update({"stream": "0x0", "grid": [1, 1, 1], "block": [64, 1, 1], "shared memory": 0})
        return t

    rocm = as_rocm(copy.deepcopy(good))
    res = rocm_trace_checks(Trace(rocm))
    bad = [r for r in res if r[1] is False]
    print("selftest: clean synthetic ROCm trace: %d checks, %d failed" % (len(res), len(bad)))
    for r in bad:
        print("  unexpected failure: %s: %s" % (r[0], r[2]))
    failures += len(bad)
    for what, mutate, expect_fail in [
        ("no rocm_backend", lambda t: t.pop("rocm_backend"), "ROCm backend named"),
        ("a call with cbid, not cid",
         lambda t: t["traceEvents"][first(t["traceEvents"], lambda e: e.get("cat") == "cuda_runtime")]["args"].pop("cid"),
         "HIP calls carry cid"),
        ("a launch without its grid",
         lambda t: t["traceEvents"][first(t["traceEvents"], lambda e: e.get("cat") == "cuda_runtime")]["args"].pop("grid"),
         "launch arguments (stream, grid, block, shared memory)"),
    ]:
        t = copy.deepcopy(rocm)
        mutate(t)
        failed = {r[0] for r in rocm_trace_checks(Trace(t)) if r[1] is False}
        ok = expect_fail in failed
        print("selftest: %-42s -> %s" % (what, "caught by '%s'" % expect_fail if ok else "NOT caught (failed: %s)" % sorted(failed)))
        if not ok:
            failures += 1
    failures += burn_selftest()
    # The candle checks, on a trace in the example's shape.
    ct = synth_candle_trace([2, 3, 4])
    res = candle_checks(Trace(ct), [2, 3, 4], 3)
    bad = [r for r in res if not r[1]]
    print("selftest: clean synthetic candle trace: %d checks, %d failed" % (len(res), len(bad)))
    for r in bad:
        print("  unexpected failure: %s: %s" % (r[0], r[2]))
    failures += len(bad)

    def linear_kernel(t):
        return first(t["traceEvents"], lambda e: e.get("cat") == "kernel" and e["name"].startswith("gemm"))

    def forward_ext(t):
        return t["traceEvents"][first(t["traceEvents"], lambda e: e.get("name") == "forward")]["args"]["External id"]

    for what, mutate, expect_fail in [
        ("a gemm labelled with forward, not its linear",
         lambda t: t["traceEvents"][linear_kernel(t)]["args"].__setitem__("External id", forward_ext(t)),
         "External id = innermost range of the launch"),
        ("a kernel without an External id",
         lambda t: t["traceEvents"][linear_kernel(t)]["args"].pop("External id"),
         "every kernel carries a range's External id"),
        ("an extra kernel in one step",
         lambda t: t["traceEvents"].append(dict(t["traceEvents"][linear_kernel(t)])),
         "kernel counts per step stable"),
    ]:
        t = copy.deepcopy(ct)
        mutate(t)
        failed = {r[0] for r in candle_checks(Trace(t), [2, 3, 4], 3) if not r[1]}
        ok = expect_fail in failed
        print("selftest: %-42s -> %s" % (what, "caught by '%s'" % expect_fail if ok else "NOT caught (failed: %s)" % sorted(failed)))
        if not ok:
            failures += 1
    import nccl_check

    failures += nccl_check.selftest(print)
    print("selftest: %s" % ("passed" if failures == 0 else "%d problem(s)" % failures))
    return 0 if failures == 0 else 1


def synth_candle_trace(steps, pid=77, tid=77, base=2_000_000.0):
    """A trace in the candle example's shape: per step, forward > mlp > 3 x linear (each launching a
    gemm through cuLaunchKernel), then backward (2 kernels) and optimizer (1 kernel)."""
    evs = []
    ids = iter(range(1000, 100000))
    corr = iter(range(1, 100000))

    def rng(name, ts, dur):
        e = {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
             "args": {"External id": next(ids)}}
        evs.append(e)
        return e["args"]["External id"]

    def launch(kname, ts, ext):
        c = next(corr)
        evs.append({"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": pid, "tid": tid, "ts": ts,
                    "dur": 5.0, "args": {"correlation": c, "External id": ext, "cbid": 307}})
        evs.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": ts + 20.0, "dur": 10.0,
                    "args": {"correlation": c, "External id": ext, "stream": 7, "device": 0}})

    for i, n in enumerate(steps):
        t0 = base + i * 1000.0
        rng("ProfilerStep#%d" % n, t0, 900.0)
        fwd = rng("forward", t0 + 10, 300.0)
        rng("mlp", t0 + 20, 280.0)
        for j in range(3):
            lin = rng("linear", t0 + 30 + j * 80, 70.0)
            launch("gemm_%d" % j, t0 + 40 + j * 80, lin)
        _ = fwd
        bwd = rng("backward", t0 + 320, 300.0)
        launch("bwd_a", t0 + 330, bwd)
        launch("bwd_b", t0 + 400, bwd)
        opt = rng("optimizer", t0 + 630, 200.0)
        launch("adamw", t0 + 640, opt)
    return {"schemaVersion": 1, "traceEvents": evs}


# --------------------------------------------------------------------------------------------------
# PyTorch workloads (run in a child process: `torch-workload`)


def _cudart_memset(torch):
    """cudaMemsetAsync from the CUDA runtime PyTorch loaded (so the trace holds a real memset, as
    the cudarc workload's cuMemsetD8Async). Returns (fn, note)."""
    import ctypes

    names = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if "libcudart.so" in os.path.basename(p) and p not in names:
                    names.append(p)
    except OSError:
        pass
    names += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for n in names:
        try:
            lib = ctypes.CDLL(n)
            fn = lib.cudaMemsetAsync
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]

            def memset(t, stream, fn=fn):
                rc = fn(ctypes.c_void_p(t.data_ptr()), 0, t.numel() * t.element_size(), ctypes.c_void_p(stream.cuda_stream))
                if rc != 0:
                    raise RuntimeError("cudaMemsetAsync returned %d" % rc)

            return memset, n
        except (OSError, AttributeError):
            continue

    def fallback(t, stream):
        t.zero_()

    return fallback, "no libcudart found: memset done with zero_() (a fill kernel)"


def torch_workload(a):
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"workload": "torch-" + a.mode, "error": "torch cannot be imported: %s" % e}))
        return 3

    out = {"workload": "torch-" + a.mode, "profiler": a.profiler, "torch": torch.__version__,
           "cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        out["error"] = "torch.cuda.is_available() is False"
        print(json.dumps(out))
        return 3
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    out["device"] = torch.cuda.get_device_name(0)
    prof_mod = torch.profiler
    trace_paths = []
    os.makedirs(a.out, exist_ok=True)

    def on_ready(p):
        path = os.path.join(a.out, "torch-%s.%d.pt.trace.json" % (a.mode, os.getpid()))
        p.export_chrome_trace(path)
        trace_paths.append(path)

    if a.mode == "plain":
        n = a.elements
        a_ = torch.empty(n, device=dev)
        b_ = torch.ones(n, device=dev)
        c_ = torch.empty(n, device=dev)
        d_ = torch.empty(n, device=dev)
        hin = (torch.arange(n, dtype=torch.float32) % 1000).pin_memory()
        hout = torch.empty(n, dtype=torch.float32).pin_memory()
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        memset, memset_note = _cudart_memset(torch)
        out["memset"] = memset_note
        # Calibrate torch.cuda._sleep (cycles) to --busy-us.
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles_probe = 2_000_000
        e0.record()
        torch.cuda._sleep(cycles_probe)
        e1.record()
        e1.synchronize()
        cyc_per_us = cycles_probe / (e0.elapsed_time(e1) * 1e3)
        cycles = int(a.busy_us * cyc_per_us)
        out["sleep_cycles"] = cycles

        def iteration():
            with torch.cuda.stream(s1):
                a_.copy_(hin, non_blocking=True)
                torch.add(a_, b_, out=c_)
                hout.copy_(c_, non_blocking=True)
            with torch.cuda.stream(s2):
                memset(d_, s2)
                torch.cuda._sleep(cycles)
            s1.synchronize()
            s2.synchronize()

        launches = 5
        if "zero_" in memset_note:  # the memset became a fill kernel
            out["per_step"] = {"kernel": 3, "gpu_memcpy": 2, "gpu_memset": 0}
        else:
            out["per_step"] = {"kernel": 2, "gpu_memcpy": 2, "gpu_memset": 1}
    else:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())]).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(64, 1024, device=dev)

        def iteration():
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()

        launches = None  # counted from the traces

    for _ in range(a.warmup if a.mode == "plain" else 0):
        iteration()
    torch.cuda.synchronize()
    rf = torch.autograd.profiler.record_function

    def timed(n, prof=None):
        times = []
        for _ in range(n):
            recording = prof is not None and str(getattr(prof, "current_action", "")).endswith(("RECORD", "RECORD_AND_SAVE"))
            t = time.perf_counter()
            with rf("iter"):
                iteration()
            if prof is not None:
                prof.step()
            times.append(((time.perf_counter() - t) * 1e6, recording))
        return times

    if a.mode == "plain":
        off = [t for t, _ in timed(a.iterations)]
        on = []
        if a.profiler == "torch":
            sched = prof_mod.schedule(wait=1, warmup=1, active=a.iterations, repeat=1)
            with prof_mod.profile(activities=[prof_mod.ProfilerActivity.CPU, prof_mod.ProfilerActivity.CUDA],
                                  schedule=sched, on_trace_ready=on_ready) as prof:
                on = [t for t, r in timed(a.iterations + 3, prof) if r]
        out["counts"] = {k: v * a.iterations for k, v in out["per_step"].items()}
        out["recorded_steps"] = list(range(2, 2 + a.iterations))
    else:
        # Training loop: one process, --iterations optimizer steps; the window is steps
        # [start, start+active); 'off' = steps from start+active+2 on (after the trace is written).
        start, active = a.start, a.active
        if a.profiler == "torch":
            sched = prof_mod.schedule(wait=max(start - 1, 0), warmup=1 if start >= 1 else 0, active=active, repeat=1)
            with prof_mod.profile(activities=[prof_mod.ProfilerActivity.CPU, prof_mod.ProfilerActivity.CUDA],
                                  schedule=sched, on_trace_ready=on_ready) as prof:
                times = timed(a.iterations, prof)
        else:
            times = timed(a.iterations)
        all_t = [t for t, _ in times]
        on = all_t[start:start + active] if a.profiler != "none-baseline" else []
        off = all_t[start + active + 2:]
        if a.profiler == "none-baseline":
            off = all_t[2:]
        out["per_iteration_us"] = all_t
        out["window"] = [start, start + active - 1]
    out["iterations"] = a.iterations
    out["launches_per_iter"] = launches
    out["wall_us_per_iter_off"] = {"median": statistics.median(off), "n": len(off)} if off else None
    out["wall_us_per_iter_on"] = {"median": statistics.median(on), "n": len(on)} if on else None
    if off and on and launches:
        out["added_us_per_launch"] = (statistics.median(on) - statistics.median(off)) / launches
    out["traces"] = trace_paths
    print(json.dumps(out))
    return 0


# --------------------------------------------------------------------------------------------------
# The whole check


class Summary:
    def __init__(self):
        self.rows = []  # (section, check, ok|None, detail)

    def add(self, section, check, ok, detail=""):
        self.rows.append((section, check, ok, detail))
        mark = {True: "PASS", False: "FAIL", None: "info"}[ok if ok is None else bool(ok)]
        progress("%s  %s / %s  %s" % (mark, section, check, detail))

    def failed(self):
        return [r for r in self.rows if r[2] is False]

    def print(self):
        w1 = max([len(r[0]) for r in self.rows] + [7])
        w2 = max([len(r[1]) for r in self.rows] + [5])
        line = "-" * (w1 + w2 + 60)
        print(line)
        print("%-*s  %-*s  %-6s %s" % (w1, "section", w2, "check", "result", "detail"))
        print(line)
        for s, c, ok, d in self.rows:
            mark = {True: "PASS", False: "FAIL", None: "info"}[ok if ok is None else bool(ok)]
            if len(d) > 160:
                d = d[:157] + "..."
            print("%-*s  %-*s  %-6s %s" % (w1, s, w2, c, mark, d))
        print(line)
        nf = len(self.failed())
        npass = sum(1 for r in self.rows if r[2] is True)
        print("gpu-check: %d passed, %d failed" % (npass, nf))


def run_child(cmd, timeout, env=None, log=None):
    """Runs cmd; returns (rc, stdout, stderr tail). Never raises on timeout."""
    left = BUDGET_S - (time.monotonic() - T0)
    timeout = max(5.0, min(timeout, left))
    progress("run: %s (timeout %.0fs)" % (" ".join(cmd), timeout))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env,
                           universal_newlines=True)
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        so = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        se = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + "\n(timed out after %.0fs)" % timeout
    if log:
        with open(log, "w") as f:
            f.write("$ %s\n--- stdout\n%s\n--- stderr\n%s\n" % (" ".join(cmd), so, se))
    tail = "\n".join(se.strip().splitlines()[-8:])
    if tail:
        for ln in tail.splitlines():
            sys.stderr.write("    | %s\n" % ln)
    return rc, so, se


def last_json(stdout):
    for ln in reversed(stdout.strip().splitlines()):
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except ValueError:
                continue
    return None


def per_step_kernels(tr):
    per = tr.per_step()
    return {n: per.get(n, {}).get("kernel", 0) for n, _, _, _ in tr.steps}


def fmt_us(x):
    return "n/a" if x is None else "%.2f us" % x


def find_cuda_libs():
    """Where libnvrtc and libcupti are on this machine: PyTorch's NVIDIA wheels (site-packages
    nvidia/cu13/lib, nvidia/cuda_nvrtc/lib, nvidia/cuda_cupti/lib), then the toolkit ($CUDA_HOME,
    /usr/local/cuda). Returns ({'nvrtc': [dirs], 'cupti': [files]}); nothing is imported."""
    import site

    roots = []
    try:
        roots += site.getsitepackages()
    except AttributeError:
        pass
    try:
        roots.append(site.getusersitepackages())
    except AttributeError:
        pass
    roots += [p for p in sys.path if p.endswith("-packages")]
    found = {"nvrtc": [], "cupti": [], "include_roots": []}
    for r in dict.fromkeys(roots):
        # CUDA headers (cubecl-cuda's NVRTC needs cuda_fp16.h & co. under $CUDA_PATH/include).
        for sub in ("nvidia/cu13", "nvidia/cuda_runtime", "nvidia/cu12"):
            if os.path.exists(os.path.join(r, sub, "include", "cuda_fp16.h")):
                found["include_roots"].append(os.path.join(r, sub))
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cuda_cupti/lib", "nvidia/cu12/lib"):
            d = os.path.join(r, sub)
            if glob.glob(os.path.join(d, "libnvrtc.so*")):
                found["nvrtc"].append(d)
            found["cupti"] += sorted(glob.glob(os.path.join(d, "libcupti.so.1[0-9]*")), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if not home:
            continue
        d = os.path.join(home, "lib64")
        if glob.glob(os.path.join(d, "libnvrtc.so*")):
            found["nvrtc"].append(d)
        found["cupti"] += sorted(glob.glob(os.path.join(home, "extras/CUPTI/lib64/libcupti.so.1[0-9]*")), reverse=True)
    found["nvrtc"] = list(dict.fromkeys(found["nvrtc"]))
    found["cupti"] = list(dict.fromkeys(found["cupti"]))
    return found


def workload_env(libs, cupti=None):
    env = dict(os.environ)
    if libs["nvrtc"]:
        env["LD_LIBRARY_PATH"] = ":".join(libs["nvrtc"] + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    if "CUDA_HOME" not in env and os.path.isdir("/usr/local/cuda"):
        env["CUDA_HOME"] = "/usr/local/cuda"
    if cupti:
        env["KINETRACE_CUPTI_PATH"] = cupti
    return env


def torch_env():
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def cmd_all(a):
    s = Summary()
    stage = os.path.abspath(a.stage)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    me = os.path.abspath(__file__)
    py = sys.executable
    iters = a.iterations

    # 1. The cudarc workload under kinetrace.
    progress("step 1/5: cudarc workload under kinetrace (%d recorded iterations)" % iters)
    wl_out = os.path.join(out, "kinetrace-workload")
    shutil.rmtree(wl_out, ignore_errors=True)
    exe = os.path.join(stage, "bin", "kinetrace-gpu-workload")
    libs = find_cuda_libs()
    s.add("setup", "CUDA libraries", None, "nvrtc dirs %s; libcupti %s" % (libs["nvrtc"], libs["cupti"]))
    wl_cmd = [exe, "--iterations", str(iters), "--busy-us", str(a.busy_us), "--out", wl_out]
    rc, so, se = run_child(wl_cmd, 120, env=workload_env(libs), log=os.path.join(out, "workload.log"))
    wl = last_json(so)
    if (rc == 0 and wl and not wl.get("cupti", {}).get("live") and libs["cupti"]
            and "KINETRACE_CUPTI_PATH" not in os.environ):
        # kinetrace's own search found no usable libcupti: say so, and retry with the one found here.
        s.add("setup", "kinetrace's libcupti search", None, "off: %s; retrying with KINETRACE_CUPTI_PATH=%s" % (
            wl.get("cupti", {}).get("reason"), libs["cupti"][0]))
        shutil.rmtree(wl_out, ignore_errors=True)
        rc, so, se = run_child(wl_cmd, 120, env=workload_env(libs, libs["cupti"][0]), log=os.path.join(out, "workload-retry.log"))
        wl = last_json(so)
    if rc == 3:
        s.add("workload", "GPU present", False, (wl or {}).get("message", "no NVIDIA GPU / driver found"))
        s.print()
        return 2
    s.add("workload", "ran", rc == 0 and wl is not None and "error" not in wl,
          "rc %d; %s" % (rc, (wl or {}).get("message", "") or ("%s, kernels from %s" % ((wl or {}).get("device"), (wl or {}).get("kernel_source")))))
    wl_trace = None
    if wl and "error" not in wl:
        cupti = wl.get("cupti", {})
        s.add("workload", "CUPTI live", cupti.get("live"), json.dumps(cupti)[:200])
        s.add("workload", "results correct", wl.get("result_mismatches") == 0, "%s mismatches" % wl.get("result_mismatches"))
        bm = wl.get("busy_measured_ns", 0)
        s.add("workload", "kernel B self-timed", 0.9 * wl["busy_ns"] <= bm <= 3 * wl["busy_ns"], "%.1f us on the GPU timer (asked %.0f)" % (bm / 1e3, wl["busy_ns"] / 1e3))
        traces = wl.get("traces") or []
        s.add("workload", "one trace written", len(traces) == 1, ", ".join(traces) or "none")
        if traces:
            wl_trace = Trace(load_trace(traces[0]), traces[0])
            for name, ok, detail in check_trace(wl_trace, wl, busy=(wl["kernels"]["B"], wl["busy_ns"] / 1e3)):
                s.add("kinetrace trace", name, ok, detail)
        s.add("overhead", "kinetrace: added per launch", None,
              "%s (iteration median off %s, on %s, %d launches/iter)" % (
                  fmt_us(wl.get("added_us_per_launch")), fmt_us((wl.get("wall_us_per_iter_off") or {}).get("median")),
                  fmt_us((wl.get("wall_us_per_iter_on") or {}).get("median")), wl.get("launches_per_iter", 0)))

    # 2. The same work in PyTorch under torch.profiler.
    progress("step 2/5: the same work in PyTorch under torch.profiler")
    t_out = os.path.join(out, "torch-plain")
    shutil.rmtree(t_out, ignore_errors=True)
    rc, so, se = run_child([py, me, "torch-workload", "--mode", "plain", "--profiler", "torch", "--iterations", str(iters),
                            "--busy-us", str(a.busy_us), "--out", t_out], 180, env=torch_env(),
                           log=os.path.join(out, "torch-plain.log"))
    tw = last_json(so)
    s.add("torch.profiler", "ran", rc == 0 and tw is not None and "error" not in tw,
          "rc %d; %s" % (rc, (tw or {}).get("error") or "torch %s, CUDA %s; memset via %s" % (
              (tw or {}).get("torch"), (tw or {}).get("cuda"), (tw or {}).get("memset"))))
    if tw and tw.get("traces"):
        ttr = Trace(load_trace(tw["traces"][0]), tw["traces"][0])
        tc = ttr.counts()
        s.add("torch.profiler", "counts", all(tc.get(k, 0) == v for k, v in tw["counts"].items()),
              "trace %s, launched %s" % (tc, tw["counts"]))
        if wl_trace is not None:
            ours = sorted(per_step_kernels(wl_trace).values())
            theirs = sorted(per_step_kernels(ttr).values())
            s.add("compare", "kernels per step (workload)", ours == theirs and len(ours) > 0,
                  "kinetrace %s, torch.profiler %s" % (ours, theirs))
            s.add("compare", "trace size (workload)", None, "kinetrace %d B, torch.profiler %d B" % (
                os.path.getsize(wl_trace.path), os.path.getsize(ttr.path)))
        s.add("overhead", "torch.profiler: added per launch", None,
              "%s (iteration median off %s, on %s, %s launches/iter)" % (
                  fmt_us(tw.get("added_us_per_launch")), fmt_us((tw.get("wall_us_per_iter_off") or {}).get("median")),
                  fmt_us((tw.get("wall_us_per_iter_on") or {}).get("median")), tw.get("launches_per_iter")))
        if wl and wl.get("added_us_per_launch") is not None and tw.get("added_us_per_launch") is not None:
            s.add("compare", "added per launch", None, "kinetrace %s vs torch.profiler %s" % (
                fmt_us(wl["added_us_per_launch"]), fmt_us(tw["added_us_per_launch"])))
    elif tw is None or "error" in (tw or {}):
        pass
    else:
        s.add("torch.profiler", "trace written", False, "no trace")

    # 3/4. A training loop: under `kinetrace record --iterations 3` and under torch.profiler.
    cli = os.path.join(stage, "bin", "kinetrace")
    has_record = False
    if os.path.exists(cli):
        rc, so, se = run_child([cli, "record", "--help"], 20)
        has_record = rc == 0
    if not has_record:
        why = "no staged kinetrace CLI" if not os.path.exists(cli) else "the staged CLI has no `record` subcommand"
        progress("steps 3-4 skipped: %s" % why)
        s.add("kinetrace record", "training loop", None, "SKIPPED: %s" % why)
    else:
        start, active, n = 2, 3, a.train_iterations
        common = ["--mode", "train", "--iterations", str(n), "--start", str(start), "--active", str(active)]
        progress("step 3/5: training loop, no profiler (baseline) and under torch.profiler")
        tb_out = os.path.join(out, "train-baseline")
        rc, so, se = run_child([py, me, "torch-workload", "--profiler", "none-baseline", "--out", tb_out] + common, 120,
                               env=torch_env(), log=os.path.join(out, "train-baseline.log"))
        base = last_json(so) or {}
        tt_out = os.path.join(out, "train-torch")
        shutil.rmtree(tt_out, ignore_errors=True)
        rc, so, se = run_child([py, me, "torch-workload", "--profiler", "torch", "--out", tt_out] + common, 120,
                               env=torch_env(), log=os.path.join(out, "train-torch.log"))
        tt = last_json(so) or {}
        s.add("train torch.profiler", "ran", rc == 0 and bool(tt.get("traces")), "rc %d, %s" % (rc, tt.get("traces")))
        progress("step 4/5: training loop under `kinetrace record --iterations %d --start-iteration %d`" % (active, start))
        kr_out = os.path.join(out, "train-kinetrace")
        shutil.rmtree(kr_out, ignore_errors=True)
        env = torch_env()
        rc, so, se = run_child([cli, "record", "--iterations", str(active), "--start-iteration", str(start), "-o", kr_out,
                                "--", py, me, "torch-workload", "--profiler", "none", "--out", kr_out + "-unused"] + common,
                               150, env=env, log=os.path.join(out, "train-kinetrace.log"))
        kr = last_json(so) or {}
        ktraces = find_traces(kr_out)
        s.add("kinetrace record", "ran", rc == 0 and bool(ktraces), "rc %d, %d trace(s) in %s" % (rc, len(ktraces), kr_out))
        if tt.get("traces") and ktraces:
            ttr = Trace(load_trace(tt["traces"][0]), tt["traces"][0])
            ktr = Trace(load_trace(ktraces[0]), ktraces[0])
            theirs, ours = per_step_kernels(ttr), per_step_kernels(ktr)
            s.add("kinetrace record", "recorded steps", len(ours) == active,
                  "kinetrace %s, torch.profiler %s" % (sorted(ours), sorted(theirs)))
            s.add("compare", "kernels per step (training)", sorted(ours.values()) == sorted(theirs.values()) and len(ours) > 0,
                  "kinetrace %s, torch.profiler %s" % (sorted(ours.values()), sorted(theirs.values())))
            for name, ok, detail in check_trace(ktr, {}, span_name="any"):
                if name in ("correlation ids", "runtime/driver call per GPU record", "ac2g flow pair per GPU record",
                            "durations > 0", "GPU records within their step", "no dropped events"):
                    s.add("kinetrace record trace", name, ok, detail)
            for name, ok, detail in framework_view_checks(ktr, ttr):
                s.add("framework view", name, ok, detail)
            s.add("compare", "trace size (training)", None, "kinetrace %d B (%d events), torch.profiler %d B (%d events)" % (
                os.path.getsize(ktr.path), len(ktr.events), os.path.getsize(ttr.path), len(ttr.events)))
        b = (base.get("wall_us_per_iter_off") or {}).get("median")
        for label, r in (("kinetrace record", kr), ("torch.profiler", tt)):
            on = (r.get("wall_us_per_iter_on") or {}).get("median")
            off = (r.get("wall_us_per_iter_off") or {}).get("median")
            s.add("overhead", "%s: training step" % label, None,
                  "recorded %s, after the window %s, no profiler %s (added %s/step)" % (
                      fmt_us(on), fmt_us(off), fmt_us(b), fmt_us(on - b) if (on is not None and b is not None) else "n/a"))
    # Efficiency (issue 24): a bf16 matmul of known size under torch.profiler, read by
    # `kinetrace analyze --only efficiency` (efficiency_check.py says what is checked).
    progress("step 5: efficiency: a bf16 8192x8192x8192 matmul against the roofline")
    if os.path.exists(cli):
        import efficiency_check

        left = BUDGET_S - (time.monotonic() - T0)
        for name, ok, detail in efficiency_check.run(cli, os.path.join(out, "efficiency"), timeout=min(180.0, left)):
            s.add("efficiency", name, ok, detail)
    else:
        s.add("efficiency", "matmul against the roofline", None, "SKIPPED: no staged kinetrace CLI")
    candle_step(s, stage, out, libs)
    nccl_step(s, cli if has_record else None, py, out)
    flight_hang_step(s, cli if has_record else None, py, out)
    progress("step 6: burn-cuda example (issue 12), fusion off")
    cmd_burn(s, stage, out, libs)
    s.print()
    progress("done in %.0fs (logs in %s)" % (time.monotonic() - T0, out))
    return 1 if s.failed() else 0


def nvidia_lib_dirs():
    """Every nvidia/*/lib folder of the installed NVIDIA wheels (cuBLAS, cuRAND, NVRTC for candle's
    cudarc, which dlopens them by soname)."""
    import site

    roots = []
    try:
        roots += site.getsitepackages()
    except AttributeError:
        pass
    roots += [p for p in sys.path if p.endswith("-packages")]
    dirs = []
    for r in dict.fromkeys(roots):
        dirs += sorted(d for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) if os.path.isdir(d))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isdir(os.path.join(home, "lib64")):
            dirs.append(os.path.join(home, "lib64"))
    return list(dict.fromkeys(dirs))


CANDLE_LINEARS = 3  # examples/candle: three with_tracing::linear enters per forward


def candle_step(s, stage, out, libs):
    """Step 5: the candle training loop (examples/candle, `cuda` feature, staged when built with
    GPU_CHECK_BUILD_CANDLE=1): every kernel under the range that launched it, stable kernel counts
    per step, and the time profiling adds per step."""
    packed = os.path.join(stage, "bin", "kinetrace-candle-example.gz")
    if not os.path.exists(packed):
        progress("step 5 skipped: no candle example staged (GPU_CHECK_BUILD_CANDLE=1 at build stages it)")
        s.add("candle", "training loop (cuda)", None, "SKIPPED: not staged (GPU_CHECK_BUILD_CANDLE=1 scripts/gpu-check.sh build)")
        return
    progress("step 5: candle 0.11.1 training loop on CUDA under kinetrace")
    c_out = os.path.join(out, "candle")
    shutil.rmtree(c_out, ignore_errors=True)
    # Staged gzipped (the stage must stay under 64 MiB): unpack next to the output.
    os.makedirs(out, exist_ok=True)
    exe = os.path.join(out, "kinetrace-candle-example")
    with gzip.open(packed, "rb") as src, open(exe, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(exe, 0o755)
    active = 5
    env = workload_env(libs)
    env["LD_LIBRARY_PATH"] = ":".join(nvidia_lib_dirs() + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    if libs["cupti"] and "KINETRACE_CUPTI_PATH" not in env:
        env["KINETRACE_CUPTI_PATH"] = libs["cupti"][0]
    cmd = [exe, "--out", c_out, "--active", str(active), "--baseline", "20", "--batch", "256", "--hidden", "1024"]
    rc, so, se = run_child(cmd, 150, env=env, log=os.path.join(out, "candle.log"))
    r = last_json(so) or {}
    s.add("candle", "ran on CUDA", rc == 0 and r.get("device") == "cuda",
          "rc %d; device %s; loss %s -> %s" % (rc, r.get("device"), r.get("first_loss"), r.get("last_loss")))
    traces = find_traces(c_out)
    s.add("candle", "one trace written", len(traces) == 1, ", ".join(traces) or "none")
    if len(traces) == 1:
        tr = Trace(load_trace(traces[0]), traces[0])
        for name, ok, detail in candle_checks(tr, list(range(2, 2 + active)), CANDLE_LINEARS):
            s.add("candle trace", name, ok, detail)
        for name, ok, detail in check_trace(tr, {}, span_name="any"):
            if name in ("correlation ids", "runtime/driver call per GPU record", "durations > 0",
                        "GPU records within their step", "no dropped events"):
                s.add("candle trace", name, ok, detail)
    idle, rec = r.get("idle_step_us"), r.get("recording_step_us")
    s.add("overhead", "candle: training step", None, "recorded %s, no profiler running %s (added %s/step)" % (
        fmt_us(rec), fmt_us(idle), fmt_us(rec - idle) if (rec is not None and idle is not None) else "n/a"))


def nccl_step(s, cli, py, out):
    """Collectives over NCCL (nccl_check.py): a one-rank NCCL job with DDP under `kinetrace record
    --record-shapes --with-stack --profile-memory`; its trace must have torch's record_param_comms
    args, NCCL kernels labelled with them, derived args on c10d ops, distributedInfo with the NCCL
    version, the CUDA caching allocator's [memory] events with Total Reserved, and kernels that
    reach a line of the job through their op and its python_function frames."""
    import socket

    import nccl_check

    if cli is None:
        s.add("nccl", "collectives", None, "SKIPPED: no staged kinetrace CLI with `record`")
        return
    progress("step 5b (collectives): a one-rank NCCL job (DDP) under `kinetrace record --record-shapes`")
    n_out = os.path.join(out, "nccl")
    shutil.rmtree(n_out, ignore_errors=True)
    job = os.path.join(out, "nccl_job.py")
    with open(job, "w") as f:
        f.write(nccl_check.JOB)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # All three of the guide's switches: the allocator's GPU events and the frames come with it.
    rc, so, se = run_child([cli, "record", "--record-shapes", "--with-stack", "--profile-memory",
                            "--iterations", "3", "--start-iteration", "2",
                            "-o", n_out, "--", py, job, str(port)], 150, env=torch_env(),
                           log=os.path.join(out, "nccl.log"))
    r = last_json(so) or {}
    traces = find_traces(n_out)
    s.add("nccl", "ran", rc == 0 and len(traces) == 1, "rc %d; NCCL %s; %d trace(s)" % (rc, r.get("nccl"), len(traces)))
    if len(traces) == 1:
        for name, ok, detail in nccl_check.checks(load_trace(traces[0])):
            s.add("nccl trace", name, ok, detail)


FLIGHT_HANG_JOB = r"""
import json
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256, device="cuda")
for _ in range(5):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
torch.cuda.synchronize()
# The GPU spins for several seconds (as behind a collective whose peer never comes) while the host
# waits in cudaDeviceSynchronize: no op names that wait.
torch.cuda._sleep(int(sys.argv[1]))
torch.cuda.synchronize()
print(json.dumps({"done": True}))
"""


def flight_hang_step(s, cli, py, out):
    """The flight recorder's hang check on a real CUDA wait (issue 25): a job whose host waits in
    `cudaDeviceSynchronize` for longer than KINETRACE_FLIGHT_HANG (the GPU spinning in
    torch.cuda._sleep) must leave a `hang` dump naming the synchronize call, seen through CUPTI's
    API callbacks, and end normally."""
    if cli is None:
        s.add("flight", "hang in a CUDA wait", None, "SKIPPED: no staged kinetrace CLI with `record`")
        return
    progress("step 5c (flight recorder): a host waiting in cudaDeviceSynchronize for 6 s, hang after 2 s")
    f_out = os.path.join(out, "flight-hang")
    shutil.rmtree(f_out, ignore_errors=True)
    job = os.path.join(out, "flight_hang_job.py")
    with open(job, "w") as f:
        f.write(FLIGHT_HANG_JOB)
    env = torch_env()
    env.update({"KINETRACE_FLIGHT_HANG": "2s", "KINETRACE_FLIGHT_SLOW_STEP": "off",
                "KINETRACE_FLIGHT_AFTER": "0"})
    # About 6 s of GPU spinning at ~2 GHz (cycles; a faster clock shortens it, still over 2 s).
    rc, so, se = run_child([cli, "record", "--flight", "30s", "-o", f_out, "--", py, job, str(12 * 10**9)],
                           90, env=env, log=os.path.join(out, "flight-hang.log"))
    r = last_json(so) or {}
    s.add("flight", "job ran and ended normally", rc == 0 and r.get("done") is True, "rc %d" % rc)
    dumps = []
    for path in find_traces(f_out):
        try:
            doc = load_trace(path)
        except Exception as e:  # a dump that does not parse is a failure below
            s.add("flight", "dump parses", False, "%s: %s" % (path, e))
            continue
        if doc.get("flight_trigger") == "hang":
            dumps.append(doc)
    op = dumps[0].get("flight_hang_op", "") if dumps else ""
    s.add("flight", "hang dump naming the CUDA wait", len(dumps) == 1 and "ynchronize" in op,
          "%d hang dump(s); op %r; %s" % (len(dumps), op, dumps[0].get("flight_reason") if dumps else ""))


def cmd_rocm(a):
    """The ROCm check (see the module docs). Exit 0 passed, 1 a check failed, 2 no ROCm GPU."""
    s = Summary()
    stage = os.path.abspath(a.stage)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    me = os.path.abspath(__file__)
    py = sys.executable
    rc, so, se = run_child([py, "-c", "import json, torch; print(json.dumps({'torch': torch.__version__, "
                            "'hip': torch.version.hip, 'gpu': torch.cuda.is_available(), "
                            "'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"],
                           120, env=torch_env(), log=os.path.join(out, "rocm-probe.log"))
    info = last_json(so) or {}
    if not info.get("hip") or not info.get("gpu"):
        s.add("setup", "ROCm PyTorch with a GPU", False, "rc %d: %s" % (rc, info or se.strip()[-200:]))
        s.print()
        return 2
    s.add("setup", "ROCm PyTorch", None, "torch %s, HIP %s, %s" % (info["torch"], info["hip"], info["device"]))
    cli = os.path.join(stage, "bin", "kinetrace")
    shim = os.path.join(stage, "bin", "libkinetrace.so")
    if not (os.path.exists(cli) and os.path.exists(shim)):
        s.add("setup", "staged CLI and shim", False, "build with GPU_CHECK_BUILD_CLI=1 scripts/gpu-check.sh build")
        s.print()
        return 1
    start, active, n = 2, 3, a.train_iterations
    common = ["--mode", "train", "--iterations", str(n), "--start", str(start), "--active", str(active)]
    progress("rocm 1/2: training loop under torch.profiler (Kineto's ROCm path)")
    tt_out = os.path.join(out, "train-torch")
    shutil.rmtree(tt_out, ignore_errors=True)
    rc, so, se = run_child([py, me, "torch-workload", "--profiler", "torch", "--out", tt_out] + common, 180,
                           env=torch_env(), log=os.path.join(out, "train-torch.log"))
    tt = last_json(so) or {}
    s.add("train torch.profiler", "ran", rc == 0 and bool(tt.get("traces")), "rc %d, %s" % (rc, tt.get("traces")))
    progress("rocm 2/2: training loop under `kinetrace record` (ROCP_TOOL_LIBRARIES=%s)" % shim)
    kr_out = os.path.join(out, "train-kinetrace")
    shutil.rmtree(kr_out, ignore_errors=True)
    env = torch_env()
    # The dependable way in (docs/rocm-support.md): the SDK registers the shim as a tool.
    env["ROCP_TOOL_LIBRARIES"] = shim
    rc, so, se = run_child([cli, "record", "--iterations", str(active), "--start-iteration", str(start), "-o", kr_out,
                            "--", py, me, "torch-workload", "--profiler", "none", "--out", kr_out + "-unused"] + common,
                           180, env=env, log=os.path.join(out, "train-kinetrace.log"))
    ktraces = find_traces(kr_out)
    s.add("kinetrace record", "ran", rc == 0 and bool(ktraces), "rc %d, %d trace(s) in %s" % (rc, len(ktraces), kr_out))
    if ktraces:
        ktr = Trace(load_trace(ktraces[0]), ktraces[0])
        for name, ok, detail in rocm_trace_checks(ktr):
            s.add("ROCm trace", name, ok, detail)
        for name, ok, detail in check_trace(ktr, {}, span_name="any"):
            if name in ("trace has GPU records", "correlation ids", "runtime/driver call per GPU record",
                        "durations > 0", "GPU records within their step", "no dropped events"):
                s.add("kinetrace record trace", name, ok, detail)
        if tt.get("traces"):
            ttr = Trace(load_trace(tt["traces"][0]), tt["traces"][0])
            theirs, ours = per_step_kernels(ttr), per_step_kernels(ktr)
            s.add("kinetrace record", "recorded steps", len(ours) == active,
                  "kinetrace %s, torch.profiler %s" % (sorted(ours), sorted(theirs)))
            s.add("compare", "kernels per step (training)", sorted(ours.values()) == sorted(theirs.values()) and len(ours) > 0,
                  "kinetrace %s, torch.profiler %s" % (sorted(ours.values()), sorted(theirs.values())))
            for name, ok, detail in framework_view_checks(ktr, ttr):
                s.add("framework view", name, ok, detail)
    s.print()
    progress("done in %.0fs (logs in %s)" % (time.monotonic() - T0, out))
    return 1 if s.failed() else 0


def _gpu_time_by_op(tr):
    """GPU time (µs) of the kernels each CPU op launched, by op name (kernel External id -> the
    cpu_op with that External id), and the kernels whose External id names no cpu_op."""
    ops = {}
    for e in tr.events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                ops[ext] = e
    by_name, unlinked = {}, []
    for e in tr.events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            ext = (e.get("args") or {}).get("External id")
            op = ops.get(ext)
            if op is None:
                unlinked.append(e.get("name"))
                continue
            by_name[op["name"]] = by_name.get(op["name"], 0.0) + float(e.get("dur", 0))
    return ops, by_name, unlinked


def framework_view_checks(ktr, ttr):
    """kinetrace's PyTorch framework view against torch.profiler's trace of the same training loop:
    every kernel links to an ATen op on the thread that launched it, and the ops ordered by the GPU
    time of their kernels agree at the top."""
    out = []
    ops, ours, unlinked = _gpu_time_by_op(ktr)
    out.append(("ATen ops recorded", len(ops) > 0, "%d cpu_op events with an External id" % len(ops)))
    out.append(("every kernel's External id is an op", not unlinked and bool(ours),
                "%d unlinked %s" % (len(unlinked), unlinked[:3])))
    # The launching thread: the runtime call with the kernel's correlation id runs on the op's thread.
    launches = {}
    for e in ktr.events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                launches[c] = e
    wrong = []
    for e in ktr.events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            a = e.get("args") or {}
            op, call = ops.get(a.get("External id")), launches.get(a.get("correlation"))
            if op is not None and (call is None or call.get("tid") != op.get("tid")):
                wrong.append(e.get("name"))
    out.append(("op on the launching thread", not wrong, "%d kernels whose op is on another thread %s" % (len(wrong), wrong[:3])))
    _, theirs, _ = _gpu_time_by_op(ttr)
    top = lambda d: [k for k, _ in sorted(d.items(), key=lambda kv: -kv[1])[:3]]
    out.append(("top ops by GPU time", top(ours) == top(theirs) and bool(ours),
                "kinetrace %s, torch.profiler %s" % (top(ours), top(theirs))))
    return out


def cmd_check_trace(a):
    tr = Trace(load_trace(a.trace), a.trace)
    expect = {}
    if a.expect_json:
        with open(a.expect_json) as f:
            expect = last_json(f.read()) or {}
    if a.expect:
        expect["counts"] = parse_expect(a.expect)
    if a.per_step:
        expect["per_step"] = parse_expect(a.per_step)
    if a.steps:
        expect["recorded_steps"] = [int(x) for x in a.steps.split(",") if x.strip()]
    busy = None
    if a.busy:
        name, _, us = a.busy.rpartition(":")
        busy = (name, float(us))
    elif expect.get("kernels") and expect.get("busy_ns"):
        busy = (expect["kernels"]["B"], expect["busy_ns"] / 1e3)
    s = Summary()
    for name, ok, detail in check_trace(tr, expect, span_name=a.span, busy=busy, slack_us=a.slack_us):
        s.add(os.path.basename(a.trace)[:40], name, ok, detail)
    s.print()
    return 1 if s.failed() else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    pa = sub.add_parser("all")
    pa.add_argument("--stage", required=True)
    pa.add_argument("--out", required=True)
    pa.add_argument("--iterations", type=int, default=10)
    pa.add_argument("--train-iterations", type=int, default=14)
    pa.add_argument("--busy-us", type=int, default=200)
    pc = sub.add_parser("check-trace")
    pc.add_argument("trace")
    pc.add_argument("--expect-json", help="the workload's JSON line (counts, per_step, recorded_steps, kernels, busy_ns)")
    pc.add_argument("--expect", help="totals per category: kernel=N,gpu_memcpy=N,gpu_memset=N")
    pc.add_argument("--per-step", help="per recorded step: kernel=N,...")
    pc.add_argument("--steps", help="recorded ProfilerStep numbers: 3,4")
    pc.add_argument("--span", default="iter", help="span kernels must link to by External id ('any': any span)")
    pc.add_argument("--busy", help="NAME:US: kernels named NAME last about US microseconds")
    pc.add_argument("--slack-us", type=float, default=20.0)
    pr = sub.add_parser("rocm")
    pr.add_argument("--stage", required=True)
    pr.add_argument("--out", required=True)
    pr.add_argument("--train-iterations", type=int, default=14)
    ps = sub.add_parser("selftest")
    ps.add_argument("--out", default="/tmp/gpu-check-selftest")
    pt = sub.add_parser("torch-workload")
    pt.add_argument("--mode", choices=["plain", "train"], default="plain")
    pt.add_argument("--profiler", choices=["none", "none-baseline", "torch"], default="none")
    pt.add_argument("--iterations", type=int, default=10)
    pt.add_argument("--warmup", type=int, default=5)
    pt.add_argument("--start", type=int, default=2)
    pt.add_argument("--active", type=int, default=3)
    pt.add_argument("--busy-us", type=int, default=200)
    pt.add_argument("--elements", type=int, default=1 << 20)
    pt.add_argument("--out", default="torch-traces")
    a = p.parse_args(argv)
    if a.cmd == "all":
        return cmd_all(a)
    if a.cmd == "check-trace":
        return cmd_check_trace(a)
    if a.cmd == "selftest":
        return selftest(a.out)
    if a.cmd == "rocm":
        return cmd_rocm(a)
    if a.cmd == "torch-workload":
        return torch_workload(a)
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
