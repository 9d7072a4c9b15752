"""`kinetrace diff --json` gives HolisticTraceAnalysis 0.5.0's `TraceDiff` numbers.

Pairs of traces are generated here (seeded): a base and a new run of the same loop with names
added, deleted, run more or less often, and durations changed; CPU ops, annotations, runtime
calls, kernels, copies and sets; one name under two `cat`s; integer µs in one pair and float µs
with sub-µs fractions (which HTA rounds inward, down to −1 µs for the shortest) in another; two
ranks. HTA's `TraceDiff.compare_traces` and `ops_diff` run on the same directories, and for every
name the counts, the total durations (on HTA's rounded clock) and the category must be equal.

Every row is inside a `ProfilerStep` (GPU rows through their launch), because HTA's `TraceDiff`
only counts rows of the iterations it is given: HTA is given all of them, kinetrace counts all
steps by default. `--step N` is compared with HTA's `iteration=N`. HTA compares one rank per call
(`control_rank` / `test_rank`); kinetrace compares every rank both sides have.

The binary: `KINETRACE_BIN`, else `cargo build --release -p kinetrace-cli` is run and its output
used.
"""

import json
import os
import random
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

# Imported outright: these tests run in the venv scripts/compat-venv.sh prepares, and a missing
# package there is a failure, never a reason to skip.
from hta.trace_diff import LabeledTrace, TraceDiff

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 1800
RUN_TIMEOUT = 300
CATEGORIES = ["added", "deleted", "increased", "decreased", "unchanged"]

# name -> cat. "mixed::name" appears as an op and as an annotation (HTA sums over cats).
HOST = {
    "aten::mm": "cpu_op",
    "aten::relu": "cpu_op",
    "aten::gelu": "cpu_op",
    "aten::add_": "cpu_op",
    "aten::copy_": "cpu_op",
    "forward": "user_annotation",
    "optimizer": "user_annotation",
    "cudaStreamSynchronize": "cuda_runtime",
    "python: train.py(10): step": "python_function",
}
KERNELS = {
    "sm80_xmma_gemm_bf16": "kernel",
    "vectorized_elementwise_kernel<relu>": "kernel",
    "vectorized_elementwise_kernel<gelu>": "kernel",
    "Memcpy HtoD (Pageable -> Device)": "gpu_memcpy",
    "Memset (Device)": "gpu_memset",
}


@lru_cache(maxsize=1)
def kinetrace_bin() -> str:
    env = os.environ.get("KINETRACE_BIN")
    if env:
        return env
    subprocess.run(
        ["cargo", "build", "--quiet", "--release", "-p", "kinetrace-cli"], cwd=ROOT, check=True, timeout=BUILD_TIMEOUT
    )
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    return str(Path(json.loads(meta.stdout)["target_directory"]) / "release" / "kinetrace")


def plan(rng: random.Random, new: bool) -> dict:
    """Per name, how many times per step. The new run deletes aten::relu and its kernel, adds
    aten::gelu and its kernel, and changes other counts at random (so every category occurs)."""
    names = list(HOST) + list(KERNELS) + ["mixed::name"]
    counts = {n: rng.randint(1, 4) for n in names}
    counts["aten::gelu"] = counts["vectorized_elementwise_kernel<gelu>"] = 0
    counts["Memcpy HtoD (Pageable -> Device)"] = rng.randint(2, 4)
    if new:
        counts["aten::relu"] = counts["vectorized_elementwise_kernel<relu>"] = 0
        counts["aten::gelu"] = counts["vectorized_elementwise_kernel<gelu>"] = 2
        counts["aten::mm"] += 2
        counts["sm80_xmma_gemm_bf16"] += 1
        counts["Memcpy HtoD (Pageable -> Device)"] -= 1
    return counts


def make_trace(rng: random.Random, rank: int, counts: dict, steps: int, floats: bool) -> dict:
    """One rank's trace: `steps` steps of 20 ms, the host events of each step laid out one after
    another inside it, each kernel launched (cudaLaunchKernel / cudaMemcpyAsync / cudaMemsetAsync)
    inside the step and run on stream 7 (possibly after the step ends)."""
    events = []
    corr = 100

    def num(v: float):
        return round(v, 3) if floats else int(v)

    def dur(lo: float, hi: float) -> float:
        # Float runs include sub-µs events (HTA's rounding gives them -1 µs or 0).
        if floats and rng.random() < 0.2:
            return rng.uniform(0.05, 0.95)
        return rng.uniform(lo, hi) if floats else rng.randint(int(lo), int(hi))

    t0 = 1_000_000.0 + (0.437 if floats else 0)
    for s in range(steps):
        start = t0 + s * 20_000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": 1, "tid": 1,
                       "ts": num(start), "dur": num(19_000), "args": {}})
        cursor = start + 10
        gpu_cursor = start + 50
        for name, cat in list(HOST.items()) + [("mixed::name", None)]:
            for i in range(counts[name]):
                c = cat or ("cpu_op" if i % 2 == 0 else "user_annotation")
                d = dur(2, 60)
                events.append({"ph": "X", "cat": c, "name": name, "pid": 1, "tid": 1 if c != "python_function" else 2,
                               "ts": num(cursor), "dur": num(d), "args": {}})
                cursor += 70
        for name, cat in KERNELS.items():
            launch = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}[cat]
            for _ in range(counts[name]):
                corr += 1
                events.append({"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": 1, "tid": 1,
                               "ts": num(cursor), "dur": num(5), "args": {"correlation": corr}})
                d = dur(3, 400)
                gpu_cursor = max(gpu_cursor, cursor + 8)
                events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7,
                               "ts": num(gpu_cursor), "dur": num(d),
                               "args": {"stream": 7, "correlation": corr, "device": 0}})
                gpu_cursor += d + 2
                cursor += 30
        assert cursor < start + 19_000, "the step's host events overflow it"
    # File order does not matter to either tool, with one exception kept out of the pairs: HTA
    # gives a GPU row the iteration of its launch row only when that row's index is > 0
    # (`add_iteration`: `df.loc[x, "iteration"] if x > 0 else -1`), so a kernel whose launch is the
    # file's first row drops out of every iteration. Real traces do not start with a launch; these
    # start with the first step's annotation.
    rng.shuffle(events)
    first = next(i for i, e in enumerate(events) if e["name"] == "ProfilerStep#1")
    events.insert(0, events.pop(first))
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": events}


def write_pair(root: Path, seed: int, floats: bool, ranks: int = 1, steps: int = 3):
    rng = random.Random(seed)
    dirs = []
    for side, new in (("base", False), ("new", True)):
        d = root / side
        d.mkdir(parents=True)
        for rank in range(ranks):
            counts = plan(random.Random(seed * 10 + rank), new)
            trace = make_trace(rng, rank, counts, steps, floats)
            (d / f"rank{rank}.pt.trace.json").write_text(json.dumps(trace))
        dirs.append(d)
    return dirs


def kinetrace_diff(base: Path, new: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [kinetrace_bin(), "diff", "--json", "--quiet", str(base), str(new), *extra],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, f"kinetrace diff failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


def hta_diff(base: Path, new: Path, rank: int, iteration=None):
    control = LabeledTrace(label="base", trace_dir=str(base))
    test = LabeledTrace(label="new", trace_dir=str(new))
    ci = iteration if iteration is not None else control.iterations()
    ti = iteration if iteration is not None else test.iterations()
    comp = TraceDiff.compare_traces(control, test, control_rank=rank, test_rank=rank,
                                    control_iteration=ci, test_iteration=ti)
    ops = TraceDiff.ops_diff(control, test, control_rank=rank, test_rank=rank,
                             control_iteration=ci, test_iteration=ti)
    return comp, ops


def check(comparison: dict, comp, ops) -> None:
    ours = {r["name"]: r for r in comparison["rows"]}
    theirs = {name: row for name, row in comp.iterrows()}
    assert sorted(ours) == sorted(theirs), (sorted(set(ours) ^ set(theirs)))
    mismatches = []
    for name, h in theirs.items():
        k = ours[name]
        want = {
            "control_counts": int(h["base_counts"]),
            "test_counts": int(h["new_counts"]),
            "control_total_duration": int(h["base_total_duration"]),
            "test_total_duration": int(h["new_total_duration"]),
            "diff_counts": int(h["diff_counts"]),
            "diff_duration": int(h["diff_duration"]),
            "counts_change_categories": h["counts_change_categories"],
        }
        got = {key: k[key] for key in want}
        if got != want:
            mismatches.append((name, got, want))
    assert not mismatches, "\n".join(f"{n}: kinetrace {g} HTA {w}" for n, g, w in mismatches)
    # ops_diff: the same names in every category.
    for cat in CATEGORIES:
        assert sorted(comparison["ops_diff"][cat]) == sorted(ops[cat]), cat
        for name in ops[cat]:
            assert ours[name]["category"] == cat, (name, ours[name]["category"], cat)
    # Every category occurs, so the comparison means something.
    for cat in CATEGORIES:
        assert ops[cat], f"the generated pair has no {cat} name"


@pytest.mark.parametrize("floats", [False, True], ids=["int_us", "float_us"])
def test_diff_matches_trace_diff(tmp_path, floats):
    base, new = write_pair(tmp_path, seed=7 if floats else 3, floats=floats)
    report = kinetrace_diff(base, new)
    assert len(report["comparisons"]) == 1, report["problems"]
    comp, ops = hta_diff(base, new, rank=0)
    check(report["comparisons"][0], comp, ops)
    if floats:
        # The float pair must exercise HTA's rounding: some total differs from the unrounded sum.
        raw = json.loads((base / "rank0.pt.trace.json").read_text())["traceEvents"]
        exact = sum(e["dur"] for e in raw if e["name"] == "aten::mm")
        rounded = report["comparisons"][0]["rows"]
        mm = next(r for r in rounded if r["name"] == "aten::mm")
        assert mm["control_total_duration"] != pytest.approx(exact, abs=0.5)


def test_diff_one_step_and_two_ranks(tmp_path):
    base, new = write_pair(tmp_path, seed=11, floats=True, ranks=2)
    report = kinetrace_diff(base, new)
    got = {(c["base_rank"], c["new_rank"]): c for c in report["comparisons"]}
    assert sorted(got) == [(0, 0), (1, 1)], report["problems"]
    for rank in (0, 1):
        comp, ops = hta_diff(base, new, rank=rank)
        check(got[(rank, rank)], comp, ops)
    # One step: kinetrace's --step 2 against HTA's iteration 2.
    report = kinetrace_diff(base, new, "--step", "2")
    got = {c["base_rank"]: c for c in report["comparisons"]}
    comp, ops = hta_diff(base, new, rank=1, iteration=[2])
    check(got[1], comp, ops)
