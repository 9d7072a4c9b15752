"""HolisticTraceAnalysis 0.5.0 reads a ROCm trace kinetrace wrote through its ROCm backend.

The trace comes from `crates/rocm/examples/rocm_fixture.rs`: the real backend driven by the fake
rocprofiler-sdk (no AMD GPU exists here), four `ProfilerStep`s of two kernel launches and a copy.
Its module docs give the numbers asserted below (durations, names and counts are constructed; the
time stamps are real, so only what does not depend on them is checked exactly).

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
    assert {GEMM, AXPY, COPY, "hipLaunchKernel", "hipMemcpyAsync"} <= names


def test_rocm_kernel_breakdown(analysis):
    _, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    kernels = {(row["kernel_type"], row["name"]): row for _, row in by_kernel.iterrows()}
    assert set(kernels) == {("COMPUTATION", GEMM), ("COMPUTATION", AXPY), ("MEMORY", COPY)}
    # HTA rounds the ns-resolution `dur` down to whole µs ("Rounding down ns resolution events"),
    # as it does for Kineto's own traces since PyTorch 2.3: 50 µs reads as 49 or 50.
    for key, dur in [(("COMPUTATION", GEMM), 50), (("COMPUTATION", AXPY), 30), (("MEMORY", COPY), 3)]:
        row = kernels[key]
        assert dur - 1 <= row["mean (us)"] <= dur, (key, row)
        assert row["max (us)"] == row["min (us)"] == row["mean (us)"], (key, row)
        # Three of each: the steps HTA keeps.
        assert row["sum (us)"] == 3 * row["mean (us)"], (key, row)


def test_rocm_temporal_breakdown_adds_up(analysis):
    rows = analysis.get_temporal_breakdown(visualize=False)
    assert list(rows["rank"]) == [0]
    row = rows.iloc[0]
    # The two kernels of a step overlap (the fake starts each 1 µs after its launch), so the
    # merged compute time lies between the longer kernel's and the sum of both, per kept step.
    assert 3 * 49 <= row["compute_time(us)"] <= 3 * 80, row
    assert row["kernel_time(us)"] >= row["compute_time(us)"]
    total = row["idle_time_pctg"] + row["compute_time_pctg"] + row["non_compute_time_pctg"]
    assert abs(total - 100.0) < 0.5, row
