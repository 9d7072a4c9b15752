"""HolisticTraceAnalysis 0.5.0 loads the trace of examples/burn (a burn `Learner` run on the CPU
under kinetrace, steps 3-5 recorded) and finds its steps, with the training step's ranges and burn's
own spans in each.

Binary: `KINETRACE_BURN_EXAMPLE` names the prebuilt example (as `scripts/compat-tests.sh` sets it);
without it the example is run with `cargo run` in its own workspace.
"""

import os
import subprocess
from pathlib import Path

import pytest

from hta.trace_analysis import TraceAnalysis

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ROOT = Path(__file__).resolve().parents[2]

# The example's run, or its cold dev build (burn) on a loaded 2-core machine.
TIMEOUT = 1800


@pytest.fixture(scope="module")
def burn_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("burn")
    binary = os.environ.get("KINETRACE_BURN_EXAMPLE")
    if binary:
        cmd = [binary, str(out)]
    else:
        cmd = ["cargo", "run", "--quiet", "--locked", "--manifest-path", str(ROOT / "examples/burn/Cargo.toml"),
               "--target-dir", str(ROOT / "target/examples-burn"), "--", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=TIMEOUT)
    assert len(list(out.glob("*.pt.trace.json"))) == 1, f"one trace in {out}"
    return out


def test_hta_finds_the_recorded_steps(burn_dir):
    ta = TraceAnalysis(trace_dir=str(burn_dir), include_last_profiler_step=True)
    assert ta.t.get_ranks() == [0]
    assert [int(i) for i in ta.t.get_iterations(0)] == [3, 4, 5]
    # By default HTA leaves out the last step, as it does for torch.profiler's traces.
    assert [int(i) for i in TraceAnalysis(trace_dir=str(burn_dir)).t.get_iterations(0)] == [3, 4]


def test_each_step_holds_the_ranges_and_burns_spans(burn_dir):
    ta = TraceAnalysis(trace_dir=str(burn_dir), include_last_profiler_step=True)
    df = ta.t.get_trace(0)
    names = ta.t.symbol_table.sym_table
    df = df.assign(s_name=df["name"].map(lambda i: names[i]))
    for name in ("forward", "backward", "optimizer", "float_from_data"):
        iterations = set(int(i) for i in df.loc[df["s_name"] == name, "iteration"])
        assert iterations == {3, 4, 5}, (name, iterations)
