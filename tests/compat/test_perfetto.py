"""`kinetrace convert` writes .pftrace files that Perfetto's own schema decodes, holding every event of
their JSON twin: each `X` event as a slice, properly nested on its track (overlaps dealt into lanes),
every flow with both ends, every track an event names described, and PyTorch's `[memory]` events as
the byte counter tracks `Total Allocated (DEVICE)` / `Total Reserved (DEVICE)` of their process,
value for value. A directory converts trace by trace.

Inputs: the real traces in ../shared/traces (PyTorch, AMD, HTA fixtures) and a trace kinetrace's demo
writes. Binaries: `KINETRACE_BIN` (the CLI) and `KINETRACE_DEMO` name prebuilt ones (as
`scripts/compat-tests.sh` sets them); without them they are built with cargo.
"""

import gzip
import json
import os
import subprocess
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

# Imported outright: a missing package in the compat venv is a failure, never a reason to skip.
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
TIMEOUT = 1800

BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4
UNIT_SIZE_BYTES = 3


def kinetrace_bin() -> list:
    b = os.environ.get("KINETRACE_BIN")
    if b:
        return [b]
    return ["cargo", "run", "--quiet", "--release", "-p", "kinetrace-cli", "--"]


def shared_traces() -> list:
    found = sorted(SHARED.rglob("*.json*"))
    assert found, f"no traces under {SHARED}: the shared traces folder is missing"
    return found


def demo_trace(tmp: Path) -> Path:
    binary = os.environ.get("KINETRACE_DEMO")
    cmd = [binary, str(tmp)] if binary else ["cargo", "run", "--quiet", "--release", "--example", "demo", "--", str(tmp)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=TIMEOUT, stdout=subprocess.DEVNULL)
    traces = sorted(tmp.rglob("*.pt.trace.json*"))
    assert traces, f"the demo wrote no trace under {tmp}"
    return traces[0]


def load_json(p: Path) -> dict:
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        # Decimals: the ns fraction of an absolute µs time does not survive a float.
        return json.load(f, parse_float=Decimal)


def ns(base: int, us) -> int:
    return max(0, base + int((Decimal(str(us)) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP)))


def memory_samples(doc: dict) -> list:
    """The `[memory]` events the converter draws as curves: those with either total."""
    return [
        e
        for e in doc["traceEvents"]
        if e.get("ph") in ("i", "I")
        and e.get("name") == "[memory]"
        and any(k in e.get("args", {}) for k in ("Total Allocated", "Total Reserved"))
    ]


def device_label(args: dict) -> str:
    kind, dev = args.get("Device Type"), args.get("Device Id", -1)
    if kind == 0 or (kind is None and dev < 0):
        return "CPU"
    if kind in (1, 6) or kind is None:
        return f"GPU {dev}"
    return f"device type {kind} id {dev}"


def check(src: Path, out: Path, convert: bool = True) -> None:
    if convert:
        subprocess.run(kinetrace_bin() + ["convert", str(src), str(out)], cwd=ROOT, check=True, timeout=TIMEOUT)
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())  # raises DecodeError on anything that is not a Trace
    doc = load_json(src)
    tracks, names, cats = {}, {}, {}
    per_track = {}
    flow_out, flow_in = Counter(), Counter()
    begun = Counter()
    begun_at = Counter()
    instants = 0
    counters = 0
    counter_values = {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in tracks, f"track {d.uuid} described twice"
            tracks[d.uuid] = d
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        for c in p.interned_data.event_categories:
            cats[c.iid] = c.name
        if p.HasField("track_event"):
            e = p.track_event
            assert p.trusted_packet_sequence_id == 1
            per_track.setdefault(e.track_uuid, []).append((p.timestamp, e))
            if e.type == BEGIN:
                begun[names[e.name_iid]] += 1
                begun_at[p.timestamp] += 1
                flow_out.update(e.flow_ids)
                flow_in.update(e.terminating_flow_ids)
            if e.type == INSTANT:
                instants += 1
            if e.type == COUNTER:
                counters += 1
                counter_values.setdefault(e.track_uuid, []).append((p.timestamp, e))
    for d in tracks.values():
        assert d.parent_uuid == 0 or d.parent_uuid in tracks, f"track {d.uuid}: unknown parent {d.parent_uuid}"
    # Every X event of the JSON twin is a slice, by name.
    want = Counter(e["name"] for e in doc["traceEvents"] if e.get("ph") == "X")
    assert begun == want, f"slices differ from the X events: {(want - begun) or (begun - want)}"
    # To the nanosecond, as the JSON text gives them.
    base = int(doc.get("baseTimeNanoseconds", 0))
    want_at = Counter(ns(base, e["ts"]) for e in doc["traceEvents"] if e.get("ph") == "X")
    assert begun_at == want_at, f"slice starts differ: {list((want_at - begun_at).items())[:5]}"
    memory = memory_samples(doc)
    assert instants == sum(1 for e in doc["traceEvents"] if e.get("ph") in ("i", "I")) - len(memory)
    want_counters = sum(
        sum(1 for v in e.get("args", {}).values() if isinstance(v, (int, Decimal)) and not isinstance(v, bool))
        for e in doc["traceEvents"]
        if e.get("ph") == "C"
    )
    want_counters += sum(("Total Allocated" in e["args"]) + ("Total Reserved" in e["args"]) for e in memory)
    assert counters == want_counters
    # The memory curves: per process and device, a byte counter track per total under the process
    # track, its values the events' (in time order, at their times).
    processes = {d.uuid: d.process.pid for d in tracks.values() if d.HasField("process")}
    for key in ("Total Allocated", "Total Reserved"):
        want = {}
        for e in memory:
            if key in e["args"]:
                label = f"{key} ({device_label(e['args'])})"
                want.setdefault((e["pid"], label), []).append((ns(base, e["ts"]), int(e["args"][key])))
        for (pid, label), values in want.items():
            found = [
                d
                for d in tracks.values()
                if d.name == label and d.HasField("counter") and processes.get(d.parent_uuid) == pid
            ]
            assert len(found) == 1, f"{label} of process {pid}: {len(found)} tracks"
            d = found[0]
            assert d.counter.unit == UNIT_SIZE_BYTES, f"{label}: unit {d.counter.unit}"
            got = [(ts, e.counter_value) for ts, e in counter_values.get(d.uuid, [])]
            assert got == sorted(values, key=lambda v: v[0]), f"{label}: values differ"
    # Slices nest strictly on every track; events in file order per track are in time order.
    for uuid, evs in per_track.items():
        assert uuid in tracks, f"events on undescribed track {uuid}"
        stack, last = [], 0
        for ts, e in evs:
            assert ts >= last, f"track {uuid}: time goes back at {ts}"
            last = ts
            if e.type == BEGIN:
                stack.append(ts)
            elif e.type == END:
                assert stack, f"track {uuid}: an end without a begin at {ts}"
                assert ts >= stack.pop()
        assert not stack, f"track {uuid}: {len(stack)} slices never end"
    # Flows: each id leaves one slice and ends at one.
    assert flow_out == flow_in, f"flows without both ends: {set(flow_out) ^ set(flow_in)}"
    assert all(n == 1 for n in flow_out.values())
    n_flows = len({(e.get("cat"), e.get("id")) for e in doc["traceEvents"] if e.get("ph") == "s"})
    assert len(flow_out) <= n_flows


@pytest.mark.parametrize("src", shared_traces(), ids=lambda p: p.name)
def test_shared_traces_convert_and_decode(src: Path, tmp_path: Path) -> None:
    check(src, tmp_path / "out.pftrace")


def test_memory_events_become_counter_tracks() -> None:
    """The torch 2.15 CPU traces hold [memory] events: the check above must have curves to compare."""
    traces = sorted((SHARED / "torch_2_15_cpu").glob("*.json*"))
    assert traces, "torch_2_15_cpu is missing from the shared traces"
    for t in traces:
        assert len(memory_samples(load_json(t))) > 10, t


def test_a_folder_converts_each_trace_and_decodes(tmp_path: Path) -> None:
    src = SHARED / "torch_2_15_cpu"
    out = tmp_path / "out"
    subprocess.run(kinetrace_bin() + ["convert", str(src), str(out)], cwd=ROOT, check=True, timeout=TIMEOUT)
    traces = sorted(src.glob("*.json*"))
    assert traces
    for t in traces:
        name = t.name.removesuffix(".gz").removesuffix(".json") + ".pftrace"
        check(t, out / name, convert=False)


def test_a_kinetrace_trace_converts_and_decodes(tmp_path: Path) -> None:
    check(demo_trace(tmp_path / "demo"), tmp_path / "demo.pftrace")
