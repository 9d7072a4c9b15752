#!/usr/bin/env python3
"""The efficiency check of `kinetrace analyze` on a real GPU (issue 24; run by gpu_check.py `all`,
or alone). Standard library only, plus torch for the matmul.

A bf16 matmul of known size (M = N = K = 8192: 2·8192³ = 1.0995e12 FLOPs per call) runs under
torch.profiler with record_shapes; `kinetrace analyze --json --only efficiency` reads the trace.
Checks:
  - the model's FLOPs are the known count (within 0.1%);
  - kinetrace's achieved TFLOP/s (FLOPs over the kernels' time in the trace) is within 10% of
    the same FLOPs over the time CUDA events measured for the same calls without the profiler;
  - the device matched the peaks table, and the roofline fraction is plausible: between 0.25
    and 1.05 of the dense bf16 peak (a large square bf16 GEMM reaches 60-85% of it; above 1 the
    peak or the model is wrong), compute-bound;
  - GEMM holds at least 90% of the GPU time by category.

Subcommands:
  run --cli KINETRACE --out DIR      on the GPU machine (needs torch with CUDA)
  torch-matmul --out DIR             the profiled matmul alone (prints one JSON line)
  selftest --cli KINETRACE [--out DIR]
                                     no GPU: synthesises torch's trace of the matmul, runs the
                                     staged CLI on it and checks that the checks pass on a right
                                     trace and fail on a wrong one (run at `gpu-check.sh build`).
"""

import argparse
import json
import os
import subprocess
import sys

M = N = K = 8192
FLOPS_PER_CALL = 2 * M * N * K
CALLS = 10


def torch_matmul(out):
    import torch

    os.makedirs(out, exist_ok=True)
    res = {"workload": "matmul", "m": M, "n": N, "k": K, "calls": CALLS, "flops_per_call": FLOPS_PER_CALL}
    if not torch.cuda.is_available():
        res["error"] = "torch.cuda.is_available() is False"
        print(json.dumps(res))
        return 3
    dev = torch.device("cuda", 0)
    res["device"] = torch.cuda.get_device_name(0)
    torch.manual_seed(0)
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        torch.mm(a, b)
    torch.cuda.synchronize()
    # The independent measurement: CUDA events around the same calls, no profiler.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(CALLS):
        torch.mm(a, b)
    e1.record()
    e1.synchronize()
    res["event_ms_per_call"] = e0.elapsed_time(e1) / CALLS
    prof = torch.profiler
    with prof.profile(activities=[prof.ProfilerActivity.CPU, prof.ProfilerActivity.CUDA], record_shapes=True) as p:
        for _ in range(CALLS):
            torch.mm(a, b)
        torch.cuda.synchronize()
    path = os.path.join(out, "matmul.pt.trace.json")
    p.export_chrome_trace(path)
    res["trace"] = path
    print(json.dumps(res))
    return 0


def analyze(cli, trace):
    """`kinetrace analyze --json --only efficiency` on one trace: (report or None, error)."""
    p = subprocess.run([cli, "analyze", "--json", "--quiet", "--only", "efficiency", trace],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    if p.returncode != 0:
        return None, "kinetrace analyze exited %d: %s" % (p.returncode, p.stderr.strip()[-300:])
    try:
        return json.loads(p.stdout)["efficiency"], ""
    except (ValueError, KeyError) as e:
        return None, "unreadable JSON from kinetrace analyze: %s" % e


def verdicts(eff, workload):
    """The checks as (name, ok, detail) on analyze's efficiency section and the workload's line."""
    out = []
    want = "M=%d N=%d K=%d" % (M, N, K)
    group = next((o for o in eff.get("ops", []) if o["op"] == "aten::mm" and o["params"] == want), None)
    out.append(("matmul group", group is not None,
                "aten::mm %s: %s" % (want, "found" if group else "missing from %s" % [(o["op"], o["params"]) for o in eff.get("ops", [])][:5])))
    if group is None:
        return out
    calls, flops = group["calls"], group["flops"]
    known = calls * workload["flops_per_call"]
    out.append(("FLOPs of the model", calls == workload["calls"] and abs(flops - known) <= 1e-3 * known,
                "%d calls, %.4g FLOPs (known %.4g)" % (calls, flops, known)))
    event_tflops = workload["flops_per_call"] / (workload["event_ms_per_call"] * 1e-3) / 1e12
    got = group.get("tflops_per_s")
    ok = got is not None and abs(got - event_tflops) <= 0.10 * event_tflops
    out.append(("achieved TFLOP/s within 10% of CUDA events", ok,
                "kinetrace %s, CUDA events %.1f TFLOP/s (%.3f ms per call)" % (
                    "%.1f" % got if got is not None else "none", event_tflops, workload["event_ms_per_call"])))
    dev = (eff.get("devices") or [{}])[0]
    out.append(("device in the peaks table", bool(dev.get("matched")),
                "%s -> %s%s" % (dev.get("name"), dev.get("matched"), "" if dev.get("matched") else "; " + str(dev.get("no_roofline")))))
    frac = group.get("roofline_fraction")
    out.append(("plausible roofline fraction", frac is not None and 0.25 <= frac <= 1.05 and group.get("bound") == "compute",
                "%s of the roofline, %s-bound (plausible: 0.25-1.05, compute)" % (
                    "%.3f" % frac if frac is not None else "none", group.get("bound"))))
    cats = {c["category"]: c["share"] for c in eff.get("categories", [])}
    out.append(("GEMM category", (cats.get("GEMM") or 0) >= 0.9, "GPU time shares %s" % cats))
    return out


def run(cli, out, workload_json=None, timeout=180.0):
    """The check on the GPU machine; returns the verdicts (or one failed verdict saying why)."""
    if workload_json is None:
        os.makedirs(out, exist_ok=True)
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "torch-matmul", "--out", out],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                               timeout=max(10.0, timeout))
        except subprocess.TimeoutExpired:
            return [("matmul ran", False, "timed out after %.0fs" % max(10.0, timeout))]
        lines = [ln for ln in p.stdout.strip().splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            return [("matmul ran", False, "rc %d: %s" % (p.returncode, (p.stderr.strip() or p.stdout.strip())[-300:]))]
        workload_json = json.loads(lines[-1])
    if "error" in workload_json:
        return [("matmul ran", False, workload_json["error"])]
    eff, err = analyze(cli, workload_json["trace"])
    if eff is None:
        return [("kinetrace analyze", False, err)]
    return [("matmul ran", True, "%s, %.3f ms per call" % (workload_json.get("device"), workload_json["event_ms_per_call"]))] \
        + verdicts(eff, workload_json)


def synth_trace(path, kernel_us, device="NVIDIA H200", dims=(M, K, N)):
    """torch.profiler's trace of the matmul, in its shape: one aten::mm per call with shapes, its
    cudaLaunchKernel and its kernel (External id and correlation), deviceProperties."""
    m, k, n = dims
    ev = []
    t = 1_000_000.0
    for i in range(CALLS):
        ext, corr = 100 + i, 5000 + i
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 20.0,
                   "args": {"External id": ext, "Record function id": 0, "Concrete Inputs": ["", ""],
                            "Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Strides": [[k, 1], [n, 1]],
                            "Input Dims": [[m, k], [k, n]]}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 5, "dur": 4.0,
                   "args": {"External id": ext, "cbid": 211, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64",
                   "pid": 0, "tid": 7, "ts": t + 30, "dur": kernel_us,
                   "args": {"External id": ext, "device": 0, "stream": 7, "correlation": corr}})
        t += kernel_us + 50
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 150_107_209_728, "numSms": 132}],
           "traceEvents": ev}
    with open(path, "w") as f:
        json.dump(doc, f)


def selftest(cli, out):
    """Right trace: every check passes; each wrong one: the check it breaks fails."""
    os.makedirs(out, exist_ok=True)
    ok_all = True
    # 1.5 ms per call: 733 TFLOP/s, 0.74 of the H200's 989.5 bf16.
    cases = [
        ("right", 1500.0, 1.5, {}, None),
        ("kernels faster than the peak allows", 900.0, 0.9, {}, "plausible roofline fraction"),
        ("trace time disagrees with the events", 1500.0, 1.9, {}, "achieved TFLOP/s within 10% of CUDA events"),
        ("other dims", 1500.0, 1.5, {"dims": (M, K, N // 2)}, "matmul group"),
        ("unknown device", 1500.0, 1.5, {"device": "NVIDIA L4"}, "device in the peaks table"),
    ]
    for name, kernel_us, event_ms, kw, must_fail in cases:
        path = os.path.join(out, "selftest-%s.json" % name.replace(" ", "-"))
        synth_trace(path, kernel_us, **kw)
        wl = {"calls": CALLS, "flops_per_call": FLOPS_PER_CALL, "event_ms_per_call": event_ms, "trace": path,
              "device": kw.get("device", "NVIDIA H200")}
        v = run(cli, out, wl)
        failed = [n for n, ok, _ in v if not ok]
        good = (not failed) if must_fail is None else (must_fail in failed)
        ok_all &= good
        print("%s %s: failed checks %s" % ("ok  " if good else "FAIL", name, failed or "none"))
        if not good:
            for n, ok, d in v:
                print("     %s %s: %s" % ("pass" if ok else "fail", n, d))
    return 0 if ok_all else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    pr = sub.add_parser("run")
    pr.add_argument("--cli", required=True)
    pr.add_argument("--out", required=True)
    pt = sub.add_parser("torch-matmul")
    pt.add_argument("--out", required=True)
    ps = sub.add_parser("selftest")
    ps.add_argument("--cli", required=True)
    ps.add_argument("--out", default="/tmp/efficiency-check-selftest")
    a = p.parse_args(argv)
    if a.cmd == "torch-matmul":
        return torch_matmul(a.out)
    if a.cmd == "selftest":
        return selftest(a.cli, a.out)
    if a.cmd == "run":
        v = run(a.cli, a.out)
        for n, ok, d in v:
            print("%s  %s: %s" % ("PASS" if ok else "FAIL", n, d))
        return 0 if all(ok for _, ok, _ in v) else 1
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
