"""HolisticTraceAnalysis 0.5.0 reads the trace of a real candle 0.11.1 training loop profiled by kinetrace.

The trace comes from `examples/candle` (its own workspace; see its `src/main.rs`): an MLP of three
candle-transformers `with_tracing::linear` layers under an `mlp` span, trained on the CPU for
`wait 1, warm-up 1, active 3` steps, so steps 2, 3 and 4 are recorded. Each forward enters `mlp` once
and `linear` three times.

Binary: `KINETRACE_CANDLE` names a prebuilt example binary (as `scripts/compat-tests.sh` sets it);
without it the example is built and run with `cargo run --locked --manifest-path examples/candle/Cargo.toml`.
"""

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from hta.trace_analysis import TraceAnalysis

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ROOT = Path(__file__).resolve().parents[2]
# The example's cold dev build (candle-core, -nn, -transformers) on a loaded 2-core machine.
BUILD_TIMEOUT = 1800
ARGS = ["--active", "3", "--batch", "16", "--hidden", "32"]


@pytest.fixture(scope="module")
def candle_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("candle")
    binary = os.environ.get("KINETRACE_CANDLE")
    if binary:
        cmd = [binary]
    else:
        manifest = ROOT / "examples" / "candle" / "Cargo.toml"
        cmd = ["cargo", "run", "--quiet", "--locked", "--manifest-path", str(manifest), "--"]
    subprocess.run(cmd + ["--out", str(out)] + ARGS, cwd=ROOT, check=True, timeout=BUILD_TIMEOUT)
    traces = sorted(out.glob("*.pt.trace.json"))
    assert len(traces) == 1, f"one trace expected in {out}: {traces}"
    return out


def names_of(ta: TraceAnalysis, rank: int = 0) -> Counter:
    sym = ta.t.symbol_table.sym_table
    return Counter(sym[i] for i in ta.t.get_trace(rank)["name"])


def test_hta_finds_the_recorded_steps(candle_dir):
    ta = TraceAnalysis(trace_dir=str(candle_dir))
    assert ta.t.get_ranks() == [0]
    # HTA drops the last profiler step by default (its work may be cut off): 2 and 3 remain.
    assert ta.t.get_iterations(0) == [2, 3]
    names = names_of(ta)
    assert names["ProfilerStep#2"] == 1 and names["ProfilerStep#3"] == 1
    assert "ProfilerStep#4" not in names


def test_hta_sees_candles_spans_and_the_users_ranges(candle_dir):
    ta = TraceAnalysis(trace_dir=str(candle_dir), include_last_profiler_step=True)
    assert ta.t.get_iterations(0) == [2, 3, 4]
    names = names_of(ta)
    for n in ("ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"):
        assert names[n] == 1, n
    for r in ("data", "forward", "backward", "optimizer", "mlp"):
        assert names[r] == 3, (r, names)
    # Three with_tracing::linear enters per forward, each its own range.
    assert names["linear"] == 9, names
    # Every range sits on the training thread, as one call stack HTA can nest.
    df = ta.t.get_trace(0)
    sym = ta.t.symbol_table.sym_index
    linear = df[df["name"] == sym["linear"]]
    forward = df[df["name"] == sym["forward"]]
    assert linear["tid"].nunique() == 1 and set(linear["tid"]) == set(forward["tid"])
    for _, row in linear.iterrows():
        assert any(f.ts <= row.ts and row.ts + row.dur <= f.ts + f.dur for f in forward.itertuples()), row
