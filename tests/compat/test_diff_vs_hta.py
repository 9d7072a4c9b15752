"""`kinetrace diff --json` gives HolisticTraceAnalysis 0.5.0's `TraceDiff` numbers.

Pairs of traces are generated here (seeded): a base and a new run of the same loop with names
added, deleted, run more or less often, and durations changed; CPU ops, annotations, runtime
calls, kernels, copies and sets; one name under two `cat`s; integer µs in one pair and float µs
with sub-µs fractions (which HTA rounds inward, down to −1 µs for the shortest) in another; two
ranks. HTA's `TraceDiff.compare_traces` and `ops_diff` run on the same directories, and for every
name the counts, the total durations (on HTA's rounded clock) and the category must be equal.

HTA's `TraceDiff` only counts rows of the iterations it is given, by its `add_iteration` rule,
which kinetrace follows: HTA is given all of them where kinetrace counts all steps (its default),
`--step N` is compared with HTA's `iteration=N` and `--step first` with HTA's defaults. HTA
compares one rank per call (`control_rank` / `test_rank`); kinetrace compares every rank both
sides have. A CUDA-graph / torch.compile pair checks the step rule case by case, and the real
traces of `../shared/traces` are checked too.

The binary: `KINETRACE_BIN`, else `cargo build --release -p kinetrace-cli` is run and its output
used.
"""

import gzip
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


def check(comparison: dict, comp, ops, every_category: bool = True) -> None:
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
    for cat in CATEGORIES if every_category else ():
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


# A CUDA-graph and torch.compile run against an eager one (issue 20): HTA's `TraceDiff` picks an
# iteration's rows by `add_iteration` (hta/common/trace.py): host rows (stream < 0) by the
# ProfilerStep span holding their start, the last such row in the file winning (GPU-side
# `gpu_user_annotation` copies included); rows on a stream by their correlated launch row; and
# nothing for rows on a stream without one. The pair below has each case that rule decides.
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*)"
DTOD = "Memcpy DtoD (Device -> Device)"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n"
TRITON = "triton_poi_fused_add_mul_0"


def graph_trace(graphs: bool, first_step: int = 1, steps: int = 3, adds: int = 9,
                stream0_kernel: bool = False) -> dict:
    """One rank: `steps` host ProfilerSteps of 10 ms, each with three input copies and a matmul.

    Eager (`graphs=False`): `adds` aten::add launches per step. With graphs: step 1 also runs the
    adds eagerly (the warm-up run of CUDA-graph trees), every step launches one `cudaGraphLaunch`
    near its end whose replay (the adds, two DtoD copies and a gemm, all sharing the launch's
    correlation, with `graph id` / `graph node id`) runs on for ~2 ms into the next step (past
    the trace's last step for the last), Triton launch `cpu_op`s carrying `stream` (7, and 0 for
    one) launch kernels of their own name, and two kernels of a replay launched before the trace
    window (no launch row) run at the start. GPU-side `ProfilerStep#N` spans (`gpu_user_annotation`,
    no stream, written after the host rows as Kineto does) cover each step's GPU work, so they lag
    into the next host step. `stream0_kernel` adds a kernel on stream 0 launched in each step.
    """
    host, gpu = [], []
    corr = 1000
    ext = 1
    t0 = 5_000_000
    gpu_cursor = float(t0 + 20)
    spans = {}

    def launch(name: str, ts: float, cat: str = "cuda_runtime") -> int:
        nonlocal corr
        corr += 1
        host.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 6,
                     "args": {"correlation": corr, "External id": ext}})
        return corr

    def run(name: str, cat: str, c, ts: float, dur: float, step: int, stream: int = 7, **extra) -> None:
        nonlocal gpu_cursor
        start = max(gpu_cursor, ts)
        args = {"device": 0, "stream": stream, **extra}
        if c is not None:
            args["correlation"] = c
        gpu.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
                    "args": args})
        gpu_cursor = start + dur + 2
        lo, hi = spans.get(step, (start, start + dur))
        spans[step] = (min(lo, start), max(hi, start + dur))

    def op(name: str, ts: float, dur: float, **args) -> None:
        nonlocal ext
        ext += 1
        host.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                     "args": {"External id": ext, **args}})

    if graphs:
        # A replay launched before the window: its kernels have no launch row in the trace.
        for _ in range(2):
            run(ADD, "kernel", 7, t0 + 20, 40, step=first_step)
    for s in range(steps):
        number = first_step + s
        start = t0 + s * 10_000
        host.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1, "tid": 1,
                     "ts": start, "dur": 10_000, "args": {"External id": ext}})
        t = start + 10
        for _ in range(3):  # input copies
            op("aten::copy_", t, 30)
            c = launch("cudaMemcpyAsync", t + 5)
            run(DTOD, "gpu_memcpy", c, t + 12, 15, step=number)
            t += 60
        op("aten::mm", t, 40)
        c = launch("cudaLaunchKernel", t + 5)
        run(GEMM, "kernel", c, t + 12, 300, step=number)
        t += 80
        if not graphs or s == 0:
            for _ in range(adds):
                op("aten::add", t, 25)
                c = launch("cudaLaunchKernel", t + 5)
                run(ADD, "kernel", c, t + 12, 60, step=number)
                t += 50
        if graphs:
            op("Torch-Compiled Region: 0/0", t, 400)
            for i in range(3):
                # Inductor's launch op: the kernel's name, a `stream` arg, no correlation.
                stream = 0 if i == 2 else 7
                op(TRITON, t + 20 + i * 100, 60, stream=stream, grid=[64, 1, 1])
                c = launch("cuLaunchKernel", t + 30 + i * 100, cat="cuda_driver")
                run(TRITON, "kernel", c, t + 40 + i * 100, 30, step=number)
            t += 420
            # The replay: launched 1 ms before the step ends, it runs ~2.5 ms.
            c = launch("cudaGraphLaunch", start + 9_000)
            node = 0
            for name, cat, dur in [(DTOD, "gpu_memcpy", 20)] * 2 + [(ADD, "kernel", 250)] * adds + [
                    (GEMM, "kernel", 300)]:
                node += 1
                run(name, cat, c, start + 9_010, dur, step=number, **{"graph id": 3, "graph node id": node})
        if stream0_kernel:
            op("aten::relu", t, 20)
            c = launch("cudaLaunchKernel", t + 5)
            run("relu_kernel_on_stream_0", "kernel", c, t + 12, 10, step=number, stream=0)
            t += 40
        assert t < start + 9_000, "the step's host rows overflow it"
    for number, (lo, hi) in sorted(spans.items()):
        gpu.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{number}", "pid": 0,
                    "tid": 7, "ts": lo, "dur": hi - lo, "args": {"External id": 1}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "traceEvents": host + gpu}


def write_graph_pair(root: Path, new_first_step: int = 1, **kw):
    base, new = root / "eager", root / "graphs"
    for d, trace in ((base, graph_trace(False, **kw)), (new, graph_trace(True, first_step=new_first_step, **kw))):
        d.mkdir(parents=True)
        (d / "rank0.pt.trace.json").write_text(json.dumps(trace))
    return base, new


def hta_default_diff(base: Path, new: Path):
    """HTA's defaults: the first rank and the first iteration of each side."""
    control = LabeledTrace(label="base", trace_dir=str(base))
    test = LabeledTrace(label="new", trace_dir=str(new))
    return TraceDiff.compare_traces(control, test), TraceDiff.ops_diff(control, test)


def test_cuda_graph_pair_matches_trace_diff_step_by_step(tmp_path):
    base, new = write_graph_pair(tmp_path)
    for step in (1, 2, 3):
        report = kinetrace_diff(base, new, "--step", str(step))
        comp, ops = hta_diff(base, new, rank=0, iteration=[step])
        check(report["comparisons"][0], comp, ops, every_category=False)
    # All steps: HTA given every iteration of each side.
    report = kinetrace_diff(base, new)
    c = report["comparisons"][0]
    assert (c["selection"], c["basis"]) == ("all_steps", "totals")
    comp, ops = hta_diff(base, new, rank=0)
    check(c, comp, ops, every_category=False)
    # What the rule decided, by name (HTA agrees with all of it, checked above):
    rows = {r["name"]: r for r in c["rows"]}
    # Each Triton launch op is in no step (a `stream` and no correlation); its kernel is in the
    # step of its launch: 3 kernels per step, not 6 rows.
    assert rows[TRITON]["test_counts"] == 9, rows[TRITON]
    # Adds: 9 eager per step on the base side; 9 eager (warm-up) + 3 × 9 replayed on the new one,
    # each replay in its launch's step although it runs into the next; the two kernels of the
    # replay launched before the window are in no step.
    assert (rows[ADD]["control_counts"], rows[ADD]["test_counts"]) == (27, 36), rows[ADD]
    assert c["new_rows_in_no_step"] > c["base_rows_in_no_step"], c


def test_step_first_is_trace_diff_default(tmp_path):
    # The new run's steps are numbered from 4: HTA's default compares ProfilerStep#1 of the base
    # with ProfilerStep#4 of the new run.
    base, new = write_graph_pair(tmp_path, new_first_step=4)
    report = kinetrace_diff(base, new, "--step", "first")
    c = report["comparisons"][0]
    assert (c["selection"], c["base_step"], c["new_step"]) == ("first_step", 1, 4), c
    comp, ops = hta_default_diff(base, new)
    check(c, comp, ops, every_category=False)
    assert "ProfilerStep#4" in ops["added"] and "ProfilerStep#1" in ops["deleted"]


def test_stream_zero_rows_keep_their_launch_step_unlike_hta(tmp_path):
    """The one departure from HTA's rule (docs/diff.md): HTA gives a step only to rows with
    `stream > 0` through their launch, so a kernel on stream 0 (every kernel of the ROCm 6.2
    trace in HTA's test data) is in no iteration; kinetrace counts it in its launch's step."""
    base, new = write_graph_pair(tmp_path, stream0_kernel=True)
    report = kinetrace_diff(base, new, "--step", "2")
    ours = {r["name"]: r for r in report["comparisons"][0]["rows"]}
    comp, _ = hta_diff(base, new, rank=0, iteration=[2])
    assert "relu_kernel_on_stream_0" not in comp.index
    assert (ours["relu_kernel_on_stream_0"]["control_counts"],
            ours["relu_kernel_on_stream_0"]["test_counts"]) == (1, 1)
    # Everything else is as HTA counts it.
    del ours["relu_kernel_on_stream_0"]
    theirs = {name: (int(r["base_counts"]), int(r["new_counts"])) for name, r in comp.iterrows()}
    assert {n: (r["control_counts"], r["test_counts"]) for n, r in ours.items()} == theirs


TRACES = (ROOT / ".." / "shared" / "traces").resolve()
# The real trace sets with ProfilerSteps (cpu_only has one step; critical_path_alexnet none).
REAL_SETS = ["trace_filter", "ns_resolution_trace", "nccl_parser_config", "triton_example", "amd_trace",
             "torch_2_15_cpu", "cpu_only"]


def stream0_gpu_rows(trace_dir: Path) -> dict:
    """Per name, the rows HTA counts as GPU rows (`stream >= 0 and correlation >= 0`) on stream 0."""
    out = {}
    for f in trace_dir.iterdir():
        with (gzip.open(f, "rt") if f.suffix == ".gz" else open(f)) as fh:
            for e in json.load(fh)["traceEvents"]:
                a = e.get("args") or {}
                if e.get("dur") is not None and e.get("cat") and a.get("stream") == 0 and a.get("correlation", -1) >= 0:
                    out[e["name"]] = out.get(e["name"], 0) + 1
    return out


@pytest.mark.parametrize("name", REAL_SETS)
def test_real_traces_match_trace_diff(name, tmp_path):
    """On the real traces, `--step first` counts what HTA's default `compare_traces` counts and the
    default (all steps) what it counts given every iteration, name by name; the only difference
    allowed is kinetrace's documented one, GPU rows on stream 0 (all of the ROCm trace's)."""
    src = TRACES / name
    assert src.is_dir(), f"the reference traces are missing: expected {src} (../shared/traces from the project root)"
    # torch_2_15_cpu holds two cycles of one process, both rank 0: HTA keeps one file per rank,
    # so the comparison is of the first file alone.
    files = sorted(src.iterdir())[:1] if name == "torch_2_15_cpu" else sorted(src.iterdir())
    d = tmp_path / name
    d.mkdir()
    for f in files:
        (d / f.name).symlink_to(f)
    control = LabeledTrace(label="base", trace_dir=str(d))
    test = LabeledTrace(label="new", trace_dir=str(d))
    zero = stream0_gpu_rows(d)
    for args, kw in ((["--step", "first"], {}),
                     ([], {"control_iteration": control.iterations(), "test_iteration": test.iterations()})):
        comp = TraceDiff.compare_traces(control, test, **kw)
        theirs = {n: int(r["base_counts"]) for n, r in comp.iterrows()}
        report = kinetrace_diff(d, d, *args)
        # HTA's default rank: the first.
        c = min(report["comparisons"], key=lambda c: c["base_rank"])
        ours = {r["name"]: r["control_counts"] for r in c["rows"]}
        extra = {n: ours.get(n, 0) - theirs.get(n, 0) for n in set(ours) | set(theirs)
                 if ours.get(n, 0) != theirs.get(n, 0)}
        assert all(0 < v <= zero.get(n, 0) for n, v in extra.items()), (args, extra)
        if name == "amd_trace":
            # Every kernel and copy of the ROCm trace is on stream 0 and launched in step 1.
            assert sum(extra.values()) == 16, extra
        else:
            assert not extra, extra
