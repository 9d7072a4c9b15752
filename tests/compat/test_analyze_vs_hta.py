"""`kinetrace analyze --json` gives HolisticTraceAnalysis 0.5.0's numbers.

For every trace set in `../shared/traces` (and the two-rank trace `examples/hta_fixture.rs` writes),
HTA's four analyses run here, in this process, and `kinetrace analyze --json` runs on the same
directory. Whole-µs values must be equal; percentages and ratios must agree within 0.01 (HTA
rounds them for display, so they are compared with what HTA's own unrounded formula gives from its
own µs columns). Where HTA raises because a set has no GPU rows, kinetrace must say so in a note.

The binary: `KINETRACE_BIN`, else `cargo build --release -p kinetrace-cli` is run and its output
used.
"""

import json
import math
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

# Imported outright: these tests run in the venv scripts/compat-venv.sh prepares, and a missing
# package there is a failure, never a reason to skip.
from hta.trace_analysis import TraceAnalysis

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ROOT = Path(__file__).resolve().parents[2]

# Deadlines for child processes: a hung child fails the test (with its output) instead of hanging CI.
# Builds get long ones (a cold release build on a loaded 2-core machine), everything else 5 minutes.
BUILD_TIMEOUT = 1800
RUN_TIMEOUT = 300
TRACES = (ROOT / ".." / "shared" / "traces").resolve()
TOL = 0.01

TRACE_SETS = sorted(p.name for p in TRACES.iterdir() if p.is_dir()) if TRACES.is_dir() else []


def test_shared_traces_present():
    assert TRACES.is_dir(), (
        f"the reference traces are missing: expected them in {TRACES} (../shared/traces from the "
        "project root); these tests compare kinetrace with HTA on them and cannot run without them"
    )
    assert len(TRACE_SETS) >= 5, f"expected the reference trace sets in {TRACES}, found {TRACE_SETS}"


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


def run_kinetrace(trace_dir: Path):
    proc = subprocess.run(
        [kinetrace_bin(), "analyze", "--json", "--quiet", str(trace_dir)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, f"kinetrace analyze failed on {trace_dir}:\n{proc.stderr}"
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hta_fixture")
    binary = os.environ.get("KINETRACE_HTA_FIXTURE")
    cmd = [binary, str(out)] if binary else [
        "cargo", "run", "--quiet", "--release", "--example", "hta_fixture", "--", str(out)
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=BUILD_TIMEOUT)
    return out


def close(a, b, tol=TOL) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return False
    return abs(float(a) - float(b)) <= tol + 1e-9


def hta_or_none(fn):
    """HTA's result, or None when HTA raises (no GPU rows)."""
    try:
        return fn()
    except (IndexError, ValueError, KeyError):
        return None


def compare(trace_dir: Path):
    ours, _ = run_kinetrace(trace_dir)
    ta = TraceAnalysis(trace_dir=str(trace_dir))
    ranks = ta.t.get_ranks()
    # One entry per trace: a rank's cycles (torch_2_15_cpu: two of one worker) are entries of
    # their own, where HTA keeps one file per rank.
    assert sorted({r["rank"] for r in ours["ranks"]}) == ranks, (ours["ranks"], ranks, ours["problems"])

    # 1. Temporal breakdown.
    temporal = hta_or_none(lambda: ta.get_temporal_breakdown(visualize=False))
    if temporal is None:
        assert ours["temporal_breakdown"] == [], "HTA raises (no GPU rows), kinetrace gave numbers"
        assert any("no GPU rows" in n for n in ours["notes"]), ours["notes"]
    else:
        got = {t["rank"]: t for t in ours["temporal_breakdown"]}
        assert sorted(got) == sorted(int(r) for r in temporal["rank"])
        for _, row in temporal.iterrows():
            t = got[int(row["rank"])]
            for col, key in [
                ("idle_time(us)", "idle_time_us"),
                ("compute_time(us)", "compute_time_us"),
                ("non_compute_time(us)", "non_compute_time_us"),
                ("kernel_time(us)", "kernel_time_us"),
            ]:
                assert float(row[col]) == t[key], (trace_dir.name, row["rank"], col, row[col], t[key])
            for col, key, raw in [
                ("idle_time_pctg", "idle_time_pctg", "idle_time(us)"),
                ("compute_time_pctg", "compute_time_pctg", "compute_time(us)"),
                ("non_compute_time_pctg", "non_compute_time_pctg", "non_compute_time(us)"),
            ]:
                exact = 100 * row[raw] / row["kernel_time(us)"]
                assert close(t[key], exact), (trace_dir.name, col, t[key], exact)
                assert close(t[key], row[col]), (trace_dir.name, col, t[key], row[col])

    # 2. Comm/comp overlap (HTA only gives it rounded to 2 decimals).
    overlap = ta.get_comm_comp_overlap(visualize=False)
    got = {o["rank"]: o["comp_comm_overlap_pctg"] for o in ours["comm_comp_overlap"]}
    for _, row in overlap.iterrows():
        assert close(got[int(row["rank"])], row["comp_comm_overlap_pctg"]), (
            trace_dir.name, row["rank"], got[int(row["rank"])], row["comp_comm_overlap_pctg"]
        )

    # 3. Idle-time breakdown, every rank and stream, with interval statistics.
    idle = hta_or_none(
        lambda: ta.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=True)
    )
    if idle is None:
        assert ours["idle_time_breakdown"] == []
    else:
        df, stats = idle
        got = {(i["rank"], i["stream"], i["idle_category"]): i for i in ours["idle_time_breakdown"]}
        want_keys = {(int(r["rank"]), int(r["stream"]), r["idle_category"]) for _, r in df.iterrows()}
        assert set(got) == want_keys, (trace_dir.name, set(got) ^ want_keys)
        stream_total = df.groupby(["rank", "stream"])["idle_time"].sum()
        for _, row in df.iterrows():
            key = (int(row["rank"]), int(row["stream"]), row["idle_category"])
            i = got[key]
            assert float(row["idle_time"]) == i["idle_time_us"], (trace_dir.name, key, row["idle_time"], i)
            total = stream_total[(row["rank"], row["stream"])]
            exact = row["idle_time"] / total if total else None
            assert close(i["idle_time_ratio"], exact), (trace_dir.name, key, i["idle_time_ratio"], exact)
        for cat, row in stats.iterrows():
            i = got[(int(row["rank"]), int(row["stream"]), cat)]["interval_stats"]
            assert i["count"] == int(row["count"]), (trace_dir.name, cat, row, i)
            for col, key in [("mean", "mean"), ("std", "std"), ("min", "min"), ("25%", "p25"),
                             ("50%", "p50"), ("75%", "p75"), ("max", "max")]:
                assert close(i[key], row[col]), (trace_dir.name, cat, col, row[col], i[key])

    # 4. Kernel breakdown: time by kernel type over all ranks, and the per-kernel table.
    by_type, by_kernel = ta.get_gpu_kernel_breakdown(visualize=False)
    want = {r["kernel_type"]: int(r["sum"]) for _, r in by_type.iterrows()}
    got = {k["kernel_type"]: k for k in ours["kernel_type_breakdown"]}
    # HTA's unstable sort can leave zero-length overlap rows; a missing row counts as 0 µs.
    for kt in set(want) | set(got):
        assert want.get(kt, 0) == (got[kt]["sum_us"] if kt in got else 0), (trace_dir.name, kt)
    total = sum(want.values())
    for kt, k in got.items():
        assert close(k["percentage"], 100 * want[kt] / total), (trace_dir.name, kt, k["percentage"])
    rows = {(k["kernel_type"], k["name"], k["rank"]): k for k in ours["kernel_breakdown"]}
    want_keys = {(r["kernel_type"], r["name"], int(r["rank"])) for _, r in by_kernel.iterrows()}
    assert set(rows) == want_keys, (trace_dir.name, set(rows) ^ want_keys)
    for _, r in by_kernel.iterrows():
        k = rows[(r["kernel_type"], r["name"], int(r["rank"]))]
        for col, key in [("sum (us)", "sum_us"), ("max (us)", "max_us"), ("min (us)", "min_us")]:
            assert float(r[col]) == k[key], (trace_dir.name, r["name"], col, r[col], k[key])
        assert close(k["mean_us"], r["mean (us)"]), (trace_dir.name, r["name"], k["mean_us"], r["mean (us)"])
        assert close(k["stddev"], r["stddev"]), (trace_dir.name, r["name"], k["stddev"], r["stddev"])
    return ours


@pytest.mark.parametrize("trace_set", TRACE_SETS)
def test_matches_hta(trace_set):
    ours = compare(TRACES / trace_set)
    assert ours["ranks"], f"kinetrace analysed no rank of {trace_set}: {ours['problems']}"


def test_matches_hta_on_kinetrace_traces(fixture_dir):
    ours = compare(fixture_dir)
    # The fixture's documented numbers (examples/hta_fixture.rs), as a check on the check.
    for t in ours["temporal_breakdown"]:
        assert (t["kernel_time_us"], t["idle_time_us"], t["compute_time_us"]) == (3000, 750, 1500)


def test_gpu_sets_have_numbers():
    """The sets with GPU rows give every analysis (guards against comparing empty with empty)."""
    for name in ["trace_filter", "nccl_parser_config", "ns_resolution_trace", "amd_trace",
                 "critical_path_alexnet", "triton_example"]:
        ours, _ = run_kinetrace(TRACES / name)
        assert ours["temporal_breakdown"], name
        assert ours["idle_time_breakdown"], name
        assert ours["kernel_breakdown"], name
