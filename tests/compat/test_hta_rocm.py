"""HolisticTraceAnalysis 0.5.0 reads a ROCm trace kinetrace wrote through its ROCm backend.

The trace comes from `crates/rocm/examples/rocm_fixture.rs`: the real backend driven by the fake
rocprofiler-sdk (no AMD GPU exists here), four `ProfilerStep`s of three kernel launches (one an
RCCL all-reduce on a second stream) and a copy, on an exact GPU timeline. Its module docs give the
construction; HTA's four analyses must give it back. HTA floors every time stamp and duration of a
ns-resolution trace to whole µs (as it does for Kineto's own traces since PyTorch 2.3), so a 50 µs
kernel reads 49 or 50 and a 0 µs gap 0 or 1: the bounds below are the construction and that
flooring. The gaps between steps are real time (the steps sleep), so only their bounds are checked.
And `kinetrace analyze` must give HTA's numbers on this trace too (`test_analyze_vs_hta.compare`).

Binary: `KINETRACE_ROCM_FIXTURE` names a prebuilt example (as `scripts/compat-tests.sh` sets it);
without it the example is run with `cargo run --release`.
"""

import os
import subprocess
from pathlib import Path

import pytest

from hta.trace_analysis import TraceAnalysis

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 1800

GEMM = "_Z4gemmPKfS0_Pf"
AXPY = "_Z4axpyPfS_f"
COPY = "Memcpy HtoD (Host -> Device)"
ALLREDUCE = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
# HTA keeps three of the four steps.
KEPT = 3


@pytest.fixture(scope="module")
def rocm_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rocm_fixture")
    binary = os.environ.get("KINETRACE_ROCM_FIXTURE")
    if binary:
        cmd = [binary, str(out)]
    else:
        cmd = [
            "cargo", "run", "--quiet", "--release", "-p", "kinetrace-rocm",
            "--example", "rocm_fixture", "--", str(out),
        ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=BUILD_TIMEOUT)
    return out


@pytest.fixture(scope="module")
def analysis(rocm_dir) -> TraceAnalysis:
    return TraceAnalysis(trace_dir=str(rocm_dir))


def test_rocm_trace_loads_with_its_steps(analysis):
    assert analysis.t.get_ranks() == [0]
    names = set(analysis.t.symbol_table.sym_table[i] for i in analysis.t.get_trace(0)["name"])
    # HTA drops the last ProfilerStep and everything after its start.
    assert {"ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"} <= names
    assert "ProfilerStep#4" not in names
    assert {GEMM, AXPY, ALLREDUCE, COPY, "hipLaunchKernel", "hipMemcpyAsync"} <= names


def test_rocm_kernel_breakdown(analysis):
    by_type, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    kernels = {(row["kernel_type"], row["name"]): row for _, row in by_kernel.iterrows()}
    assert set(kernels) == {
        ("COMPUTATION", GEMM),
        ("COMPUTATION", AXPY),
        ("COMMUNICATION", ALLREDUCE),
        ("MEMORY", COPY),
    }
    for key, dur in [
        (("COMPUTATION", GEMM), 50),
        (("COMPUTATION", AXPY), 30),
        (("COMMUNICATION", ALLREDUCE), 40),
        (("MEMORY", COPY), 3),
    ]:
        row = kernels[key]
        assert dur - 1 <= row["mean (us)"] <= dur, (key, row)
        assert row["max (us)"] == row["min (us)"] == row["mean (us)"], (key, row)
        assert row["sum (us)"] == KEPT * row["mean (us)"], (key, row)
    # By type, HTA splits out the time computation and communication overlap: per step the
    # all-reduce's first 20 µs run under the axpy, so 60 µs of computation alone, 20 of
    # communication alone, 20 of both, and the 3 µs copy.
    sums = {row["kernel_type"]: row["sum"] for _, row in by_type.iterrows()}
    assert set(sums) == {
        "COMPUTATION", "COMMUNICATION", "COMPUTATION overlapping COMMUNICATION", "MEMORY",
    }, sums
    for kind, us in [
        ("COMPUTATION", 60),
        ("COMMUNICATION", 20),
        ("COMPUTATION overlapping COMMUNICATION", 20),
        ("MEMORY", 3),
    ]:
        assert KEPT * (us - 2) <= sums[kind] <= KEPT * us, (kind, sums)


def test_rocm_temporal_breakdown_is_the_construction(analysis):
    rows = analysis.get_temporal_breakdown(visualize=False)
    assert list(rows["rank"]) == [0]
    row = rows.iloc[0]
    # Per step the gemm and the axpy run back to back (t+100 – t+180 µs): 80 µs of computation.
    assert KEPT * 78 <= row["compute_time(us)"] <= KEPT * 80, row
    # The GPU is busy t+100 – t+203 µs (the all-reduce to t+200, then the copy): 103 µs, of
    # which 23 not computation.
    busy = row["kernel_time(us)"] - row["idle_time(us)"]
    assert KEPT * 100 <= busy <= KEPT * 103, row
    assert KEPT * 21 <= row["non_compute_time(us)"] <= KEPT * 23, row
    # From the first step's gemm to the third step's copy: two step periods of at least 100.4 ms.
    assert row["kernel_time(us)"] >= 2 * 100_400, row
    total = row["idle_time_pctg"] + row["compute_time_pctg"] + row["non_compute_time_pctg"]
    assert abs(total - 100.0) < 0.5, row


def test_rocm_comm_comp_overlap_is_half(analysis):
    rows = analysis.get_comm_comp_overlap(visualize=False)
    assert list(rows["rank"]) == [0]
    # The all-reduce (t+160 – t+200 µs) runs under the axpy for its first 20 µs: 50 % (19 of 39
    # µs once HTA has floored the times).
    pctg = rows.iloc[0]["comp_comm_overlap_pctg"]
    assert 100 * 19 / 39 - 0.01 <= pctg <= 50.0, rows


def test_rocm_idle_time_breakdown_is_the_construction(analysis):
    df, stats = analysis.get_idle_time_breakdown(visualize=False, show_idle_interval_stats=True)
    idle = {(int(r["stream"]), r["idle_category"]): r["idle_time"] for _, r in df.iterrows()}
    counts = {(int(r["stream"]), cat): int(r["count"]) for cat, r in stats.iterrows()}
    # Two GPU streams: the null stream (gemm, axpy, copy) is row 0, the all-reduce's row 1.
    assert {s for s, _ in idle} == {0, 1}, df
    # Null stream, within a step: gemm -> axpy 0 µs, axpy -> copy 20 µs, both queued before the
    # GPU got there (kernel wait, under HTA's 30 µs threshold): six gaps, 60 µs (66 floored).
    assert counts[(0, "kernel_wait")] == 2 * KEPT, stats
    assert KEPT * 20 <= idle[(0, "kernel_wait")] <= KEPT * 22, df
    # Between steps each stream waits for the next step's calls (host wait): two gaps a stream,
    # each a step period less the step's GPU work.
    for stream in (0, 1):
        assert counts[(stream, "host_wait")] == KEPT - 1, stats
        assert idle[(stream, "host_wait")] >= 2 * 100_000, df
        assert idle.get((stream, "other"), 0) == 0, df
    assert (1, "kernel_wait") not in counts or counts[(1, "kernel_wait")] == 0, stats


def test_analyze_matches_hta_on_the_rocm_trace(rocm_dir):
    from test_analyze_vs_hta import compare

    ours = compare(rocm_dir)
    (t,) = ours["temporal_breakdown"]
    assert KEPT * 78 <= t["compute_time_us"] <= KEPT * 80, t
