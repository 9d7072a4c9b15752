"""HolisticTraceAnalysis 0.5.0 loads what the preload shim writes for an unmodified job.

The stand-in CUDA job (`crates/preload/examples/fake_train.rs`, with the fake libcupti) runs 8 steps
with `libkinetrace.so` preloaded and `KINETRACE_ITERATIONS=3 KINETRACE_START_ITERATION=2`; HTA must
find the rank, the iterations and the kernels of those steps only.

Run with the compat venv: `target/compat-venv/bin/python -m pytest tests/preload` (the binaries are
built with `cargo build --release -p kinetrace-preload --examples` if needed).
"""

import os
import subprocess
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


def built() -> Path:
    subprocess.run(
        ["cargo", "build", "--quiet", "--release", "-p", "kinetrace-preload", "--examples"],
        cwd=ROOT,
        check=True,
        timeout=BUILD_TIMEOUT,
    )
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    ).stdout
    import json

    return Path(json.loads(meta)["target_directory"]) / "release"


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    target = built()
    tmp = tmp_path_factory.mktemp("preload")
    libs = tmp / "libs"
    libs.mkdir()
    for name in ("libcuda.so.1", "libcupti.so.12"):
        (libs / name).symlink_to(target / "deps" / "libkinetrace_fake_cupti.so")
    out = tmp / "traces"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETRACE_", "KINETO_", "CUDA_INJECTION"))}
    env.update(
        LD_PRELOAD=str(target / "examples" / "libkinetrace.so"),
        LD_LIBRARY_PATH=str(libs),
        KINETRACE_CUPTI_PATH=str(libs / "libcupti.so.12"),
        KINETRACE_OUTPUT_DIR=str(out),
        KINETRACE_CONTROL_DIR=str(tmp / "ctl"),
        KINETRACE_ITERATIONS="3",
        KINETRACE_START_ITERATION="2",
        RANK="0",
    )
    done = subprocess.run(
        [str(target / "examples" / "fake_train"), "8", "--cuda"], env=env, check=True, capture_output=True, text=True,
        timeout=RUN_TIMEOUT,
    )
    assert done.stdout == "fake_train: done 8 steps\n"
    assert done.stderr == ""
    assert len(list(out.glob("*.pt.trace.json"))) == 1
    return out


def test_hta_reads_the_preload_trace(trace_dir):
    analysis = TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True)
    assert list(analysis.t.traces.keys()) == [0]
    df = analysis.t.get_trace(0)
    names = analysis.t.symbol_table.get_sym_table()
    steps = sorted(names[i] for i in df["name"].unique() if names[i].startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    kernels = sorted({names[i] for i in df[df["stream"] > 0]["name"].unique()})
    assert kernels == [f"step{s}_kernel{k}" for s in (2, 3, 4) for k in (0, 1)]
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert list(breakdown["rank"]) == [0]
