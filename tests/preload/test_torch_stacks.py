"""Python stacks and PyTorch's allocator events as torch.profiler records them, on real PyTorch (CPU).

The guide's script (an MLP with LayerNorm, a DataLoader, AdamW, cross-entropy) under `kinetrace
record --with-stack --profile-memory --record-shapes` and under torch.profiler with the same three
switches over the same iterations:

- every ATen op has a `python_function` ancestor on its thread naming the script's line that
  called it, the same line torch.profiler's trace names for it, op by op;
- `python_function` ranges carry `Python id` / `Python parent id` / `CallFrom` as torch writes
  them, the parent being the frame range around it, and module calls are `nn.Module: Class_n`
  ranges with the names torch gives them;
- `[memory]` events per step are within 5 % of torch's in count and in bytes allocated, with the
  same `Total Allocated` at each step boundary, and carry torch's args;
- nothing of it lies outside the window, and without the switches there is none of it.

A second script calls `gc.collect()` in its loop: with `--with-stack` each collection is a
`python::gc (gen 2)` range inside the step that ran it.

Same venv rules as test_torch_record.py (whose build this file shares).
"""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import test_torch_record as base
from test_torch_record import REQUIRED, STAMP, TORCH_PYTHON, VENV, _env, _run, _steps, _traces
from test_torch_shapes import GUIDE

pytestmark = [
    pytest.mark.skipif(
        not REQUIRED and not STAMP.exists(),
        reason=f"no torch venv at {VENV}: run scripts/torch-venv.sh (or set KINETRACE_TORCH_TESTS=1)",
    ),
]

SCRIPT = "guide.py"
# The guide under torch.profiler with all three switches (the same iterations as
# `record --iterations 3 --start-iteration 2`).
GUIDE_ALL = GUIDE.replace("record_shapes=True,",
                          "record_shapes=True, with_stack=True, profile_memory=True,")
assert GUIDE_ALL != GUIDE


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    b = base.build_once(tmp_path_factory)
    if not b["recorder"]:
        base._no_recorder(b)
    return b


def _load(path):
    return json.loads(Path(path).read_text())


def _by_thread(doc, cats):
    rows = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in cats:
            rows.setdefault(e["tid"], []).append(e)
    return rows


def _end(e):
    return e["ts"] + e["dur"]


def _nested(doc):
    """(event, its enclosing X events on its thread, innermost last) for every X event of the
    CPU categories, by time containment (ties: the longer one encloses)."""
    eps = 0.002  # µs: both writers round to ns
    out = []
    for events in _by_thread(doc, ("cpu_op", "python_function", "user_annotation")).values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in events:
            while stack and _end(stack[-1]) < _end(e) - eps:
                stack.pop()
            out.append((e, list(stack)))
            stack.append(e)
    return out


def _script_line(ancestors):
    """The script line a chain of ancestors names: the CallFrom of the innermost frame the script
    called (`guide.py:21`), else the innermost script frame itself (`guide.py:train`)."""
    for a in reversed(ancestors):
        if a["cat"] != "python_function":
            continue
        call_from = a.get("args", {}).get("CallFrom", "")
        if call_from.startswith(SCRIPT + ":"):
            return call_from
        if a["name"].startswith(SCRIPT + "("):
            return SCRIPT + ":" + a["name"].split(": ", 1)[1]
    return None


def _op_lines(doc):
    """(op name, script line) -> count for every cpu_op, and the ops with no script line."""
    lines, orphans = Counter(), Counter()
    for e, ancestors in _nested(doc):
        if e["cat"] == "cpu_op":
            line = _script_line(ancestors)
            if line is None:
                orphans[e["name"]] += 1
            else:
                lines[(e["name"], line)] += 1
    return lines, orphans


def _steps_spans(doc):
    return sorted((e["ts"], _end(e), e["name"]) for e in doc["traceEvents"]
                  if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))


def _memory_per_step(doc):
    """Per step: ([memory] events, bytes allocated, Total Allocated after its last event)."""
    events = sorted((e for e in doc["traceEvents"] if e.get("name") == "[memory]"),
                    key=lambda e: e["ts"])
    out = []
    for start, end, name in _steps_spans(doc):
        inside = [e for e in events if start <= e["ts"] < end]
        allocated = sum(e["args"]["Bytes"] for e in inside if e["args"]["Bytes"] > 0)
        out.append((name, len(inside), allocated,
                    inside[-1]["args"]["Total Allocated"] if inside else None))
    return out


def _record(built, script, out, log, env, cwd, *switches):
    return _run(
        [str(built["kinetrace"]), "record", "--iterations", "3", "--start-iteration", "2",
         *switches, "-o", str(out), "--log", str(log), "--no-summary", "--",
         str(TORCH_PYTHON), str(script), "record"],
        env, cwd,
    )


def test_the_guides_ops_reach_the_same_python_lines_and_memory_as_torch_profiler(built, tmp_path):
    script = tmp_path / SCRIPT
    script.write_text(GUIDE_ALL)
    env = _env(tmp_path)
    theirs = tmp_path / "torch.json"
    peer = _run([str(TORCH_PYTHON), str(script), "torch.profiler", str(theirs)], env, tmp_path)
    assert peer.returncode == 0, peer.stderr
    out, log = tmp_path / "traces", tmp_path / "kinetrace.log"
    rec = _record(built, script, out, log, env, tmp_path,
                  "--with-stack", "--profile-memory", "--record-shapes")
    assert rec.returncode == 0 and rec.stdout == "trained\n", rec.stderr
    (trace,) = _traces(out)
    assert _steps(trace) == [2, 3, 4]
    assert base.RECORDER_LINE in log.read_text(), log.read_text()
    ours, peer_doc = _load(trace), _load(theirs)

    # The head says so, as torch.profiler's does.
    for k in ("with_stack", "profile_memory", "record_shapes"):
        assert ours.get(k) == peer_doc.get(k) == 1, k

    # Every op reaches the script line torch.profiler's trace gives it.
    mine, orphans = _op_lines(ours)
    torchs, torch_orphans = _op_lines(peer_doc)
    assert not torch_orphans, torch_orphans
    assert not orphans, orphans
    assert sum(torchs.values()) > 1000, sum(torchs.values())
    assert mine == torchs, {k: (mine.get(k), torchs.get(k)) for k in set(mine) | set(torchs)
                            if mine.get(k) != torchs.get(k)}
    # What that covers: the forward (line 20), backward run with the GIL released (21), the
    # optimizer (22) and the DataLoader's collate (18).
    assert {line for _, line in mine} == {f"{SCRIPT}:{n}" for n in (18, 20, 21, 22)}, set(mine)

    # python_function ranges as torch writes them.
    frames = [e for e in ours["traceEvents"] if e.get("cat") == "python_function"]
    assert frames
    ids = Counter(e["args"]["Python id"] for e in frames)
    assert max(ids.values()) == 1, "Python ids repeat"
    name_form = re.compile(r"^(.+\(\d+\): .+|nn\.Module: \w+_\d+)$")
    for e in frames:
        assert name_form.match(e["name"]), e["name"]
        assert re.match(r"^.+:\d+$", e["args"]["CallFrom"]), e
        assert list(e["args"])[-1] == "Python id", e["args"]
    for e, ancestors in _nested(ours):
        if e["cat"] != "python_function":
            continue
        enclosing = [a for a in ancestors if a["cat"] == "python_function"]
        parent = e["args"].get("Python parent id")
        if enclosing:
            assert parent == enclosing[-1]["args"]["Python id"], (e, enclosing[-1])
        else:
            assert parent is None, e
    modules = {e["name"] for e in frames if e["name"].startswith("nn.Module: ")}
    torch_modules = {e["name"] for e in peer_doc["traceEvents"]
                     if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")}
    assert modules == torch_modules, (modules, torch_modules)
    for e in frames:
        if e["name"].startswith("nn.Module: "):
            assert e["args"]["Python module id"] == int(e["name"].rsplit("_", 1)[1]), e

    # [memory]: per step within 5 % of torch's in count and bytes, the same Total Allocated at
    # each step boundary, and torch's args.
    mem, torch_mem = _memory_per_step(ours), _memory_per_step(peer_doc)
    assert [m[0] for m in mem] == [m[0] for m in torch_mem] == [f"ProfilerStep#{n}" for n in (2, 3, 4)]
    for (name, n, allocated, total), (_, tn, tallocated, ttotal) in zip(mem, torch_mem):
        assert tn > 100, torch_mem
        assert abs(n - tn) <= 0.05 * tn, (name, n, tn)
        assert abs(allocated - tallocated) <= 0.05 * tallocated, (name, allocated, tallocated)
        assert total == ttotal, (name, total, ttotal)
    keys = {"Addr", "Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id"}
    for e in ours["traceEvents"]:
        if e.get("name") == "[memory]":
            assert (e["ph"], e["cat"], e["s"]) == ("i", "cpu_instant_event", "t"), e
            assert keys <= set(e["args"]), e
            assert (e["args"]["Device Type"], e["args"]["Device Id"]) == (0, -1), e
            assert e["args"]["Total Reserved"] == 0, e

    # Nothing outside the window: frames and allocations lie within the recorded steps.
    spans = _steps_spans(ours)
    first, last = spans[0][0], spans[-1][1]
    eps = 0.002
    for e in frames:
        assert first - eps <= e["ts"] and _end(e) <= last + eps, (e, first, last)
    for e in ours["traceEvents"]:
        if e.get("name") == "[memory]":
            assert first - eps <= e["ts"] <= last + eps, (e, first, last)

    # Without the switches: none of it, and nothing in the head.
    out2 = tmp_path / "traces-plain"
    rec = _record(built, script, out2, log, env, tmp_path)
    assert rec.returncode == 0, rec.stderr
    (plain,) = _traces(out2)
    doc = _load(plain)
    assert "with_stack" not in doc and "profile_memory" not in doc
    cats = Counter(e.get("cat") for e in doc["traceEvents"])
    assert cats["cpu_op"] > 1000 and cats["python_function"] == 0, cats
    assert not any(e.get("name") == "[memory]" for e in doc["traceEvents"])


GC_SCRIPT = r"""
import gc
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    gc.collect()
    opt.step()
print("trained")
"""


def test_garbage_collections_are_ranges_in_their_step(built, tmp_path):
    script = tmp_path / "gc_loop.py"
    script.write_text(GC_SCRIPT)
    env = _env(tmp_path)
    out, log = tmp_path / "traces", tmp_path / "kinetrace.log"
    rec = _record(built, script, out, log, env, tmp_path, "--with-stack")
    assert rec.returncode == 0 and rec.stdout == "trained\n", rec.stderr
    (trace,) = _traces(out)
    doc = _load(trace)
    spans = _steps_spans(doc)
    assert [s[2] for s in spans] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    collections = [e for e in doc["traceEvents"]
                   if e.get("cat") == "user_annotation" and e["name"] == "python::gc (gen 2)"]
    # One full collection per step (gc.collect()), each inside its step.
    assert len(collections) >= 3, [e["name"] for e in doc["traceEvents"] if "gc" in e.get("name", "")]
    for start, end, name in spans:
        assert any(start <= e["ts"] and _end(e) <= end for e in collections), name
    # Without --with-stack: no gc ranges.
    out2 = tmp_path / "traces-plain"
    rec = _record(built, script, out2, log, env, tmp_path)
    assert rec.returncode == 0, rec.stderr
    (plain,) = _traces(out2)
    assert not any("python::gc" in e.get("name", "") for e in _load(plain)["traceEvents"])


def test_kinetrace_profile_honours_with_stack_and_profile_memory(built, tmp_path):
    """kinetrace.profile(with_stack=True, profile_memory=True) (the in-process API, the shim loaded
    with ctypes) records what `record --with-stack --profile-memory` does, with no warning."""
    one_import = ("from torch.profiler import ProfilerActivity, profile, schedule",
                  "from torch.profiler import ProfilerActivity, schedule\n"
                  "    from kinetrace import profile")
    assert one_import[0] in GUIDE_ALL
    script = tmp_path / SCRIPT
    script.write_text(GUIDE_ALL)
    api = tmp_path / "api" / SCRIPT
    api.parent.mkdir()
    api.write_text(GUIDE_ALL.replace(*one_import))
    env = _env(tmp_path)
    theirs = tmp_path / "torch.json"
    peer = _run([str(TORCH_PYTHON), str(script), "torch.profiler", str(theirs)], env, tmp_path)
    assert peer.returncode == 0, peer.stderr
    env = dict(env, PYTHONPATH=str(base.ROOT / "python"),
               KINETRACE_PRELOAD_PATH=str(built["shim"]))
    ours_path = tmp_path / "ours.json"
    ours = _run([str(TORCH_PYTHON), "-W", "always", str(api), "torch.profiler", str(ours_path)],
                env, tmp_path / "api")
    assert ours.returncode == 0 and ours.stdout == "trained\n", ours.stderr
    assert "not honoured" not in ours.stderr, ours.stderr
    doc, peer_doc = _load(ours_path), _load(theirs)
    assert doc.get("with_stack") == doc.get("profile_memory") == 1, list(doc)[:12]
    mine, orphans = _op_lines(doc)
    torchs, _ = _op_lines(peer_doc)
    assert not orphans, orphans
    # The same op kinds reach the same lines (kinetrace.profile cuts this script's steps elsewhere
    # than torch.profiler does, so the counts per window differ: not this switch's business).
    assert set(mine) == set(torchs), (set(mine) ^ set(torchs))
    assert any(e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")
               for e in doc["traceEvents"])
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert len(mem) > 100, len(mem)
    assert all({"Addr", "Bytes", "Total Allocated", "Total Reserved"} <= set(e["args"]) for e in mem)
