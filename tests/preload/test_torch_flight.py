"""The flight recorder on a real PyTorch job on the CPU (`kinetrace record --flight 10steps`).

A 2-rank gloo job (`torchrun`) where rank 1 stops before an all-reduce in step 6: rank 0, stuck in
it with no step for `KINETRACE_FLIGHT_HANG=2s`, writes a hang dump naming the op; rank 1 writes
none; `doctor` starts from the hang; once rank 1 goes on, the job ends normally.

A small MLP trains 30 steps of about 20 ms; step 20 is made slow (1 s) and an exception leaves the
loop in step 25, before its backward: a `RuntimeError`, or `torch.OutOfMemoryError` raised by the
job. The run must leave two dumps, each a normal trace of the span its head states:

- the slow step's (`flight_trigger` `slow_step`, step 20 against the median of the steps before);
- the exception's (`flight_trigger` `exception`, naming its type), holding steps 15..24 whole and
  step 25 up to the exception, with the ops of the final step (its forward's `aten::` ops),

and the job's own behaviour must not change: the same stdout, the same traceback on stderr, the
same exit code (1) as without kinetrace.

Required, skipped or failed like the other real-torch tests (see test_torch_record.py).
"""

import json
import subprocess
import time
from pathlib import Path

import pytest

import test_torch_record as base
from test_torch_record import REQUIRED, STAMP, TORCH_PYTHON, VENV, _env, _run, _traces

pytestmark = [
    pytest.mark.skipif(
        not REQUIRED and not STAMP.exists(),
        reason=f"no torch venv at {VENV}: run scripts/torch-venv.sh (or set KINETRACE_TORCH_TESTS=1)",
    ),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return base.build_once(tmp_path_factory)


JOB = r"""
import sys
import time
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 16)
y = x.sum(dim=1, keepdim=True)
for step in range(30):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step == 25:
        if sys.argv[1] == "oom":
            raise torch.OutOfMemoryError("injected: tried to allocate 40.00 GiB")
        raise RuntimeError("injected failure in step 25")
    loss.backward()
    # Before the optimizer step, whose hook ends the step: the time is step 20's own.
    time.sleep(1.0 if step == 20 else 0.02)
    opt.step()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
print("not reached")
"""


def _dumps(out: Path):
    docs = [json.loads(p.read_text()) for p in _traces(out)]
    return {d.get("flight_trigger"): d for d in docs if d.get("flight_trigger")}, docs


def _ns(doc, e):
    return doc["baseTimeNanoseconds"] + round(e["ts"] * 1000)


def _steps(doc):
    return sorted(int(e["name"].split("#")[1]) for e in doc["traceEvents"]
                  if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))


def _covers_what_it_says(doc):
    start, end = int(doc["flight_start_ns"]), int(doc["flight_end_ns"])
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("pid"), int)]
    assert timed, "an empty dump"
    # Microsecond rounding of `ts` aside, every event lies in the span the head states.
    outside = [e for e in timed if not start - 1000 <= _ns(doc, e) <= end + 1000]
    assert not outside, outside[:3]


def _plain_then_recorded(built, tmp_path, job, args, flight, **env_extra):
    """Runs `job` (a script's text) with `args` without kinetrace, then under `kinetrace record`
    with the `flight` options and the `env_extra` variables; asserts the job's behaviour is
    unchanged (exit code, stdout, its stderr within kinetrace's). Returns (the plain run, the
    flight dumps by trigger, every trace, kinetrace's log)."""
    script = tmp_path / "job.py"
    script.write_text(job)
    plain = _run([str(TORCH_PYTHON), str(script), *args], _env(tmp_path), tmp_path)
    out, log = tmp_path / "traces", tmp_path / "kinetrace.log"
    env = _env(tmp_path)
    env.update(env_extra)
    rec = _run(
        [str(built["kinetrace"]), "record", *flight, "-o", str(out), "--log", str(log),
         "--no-summary", "--", str(TORCH_PYTHON), str(script), *args],
        env, tmp_path,
    )
    text = log.read_text() if log.exists() else ""
    assert rec.returncode == plain.returncode, (rec.stderr, text)
    assert rec.stdout == plain.stdout, (rec.stderr, text)
    assert plain.stderr in rec.stderr, rec.stderr
    dumps, docs = _dumps(out)
    return plain, dumps, docs, text


@pytest.mark.parametrize("kind,exc", [("error", "RuntimeError"),
                                      ("oom", "torch.OutOfMemoryError")])
def test_a_slow_step_and_an_exception_leave_dumps_and_the_job_unchanged(built, tmp_path, kind, exc):
    # A step the loaded machine stretched by chance must not hold back the injected one.
    plain, dumps, docs, text = _plain_then_recorded(
        built, tmp_path, JOB, [kind], ["--flight", "10steps"],
        KINETRACE_FLIGHT_SLOW_INTERVAL="0s")
    assert plain.returncode == 1, plain.stderr
    assert plain.stdout.count("\n") == 25 and "not reached" not in plain.stdout, plain.stdout
    assert plain.stderr.rstrip().endswith("injected failure in step 25"
                                          if kind == "error" else
                                          "injected: tried to allocate 40.00 GiB"), plain.stderr

    assert "slow_step" in dumps and "exception" in dumps, (len(docs), text)
    slow = [d for d in docs if d.get("flight_slow_step") == "20"]
    assert len(slow) == 1, ([d.get("flight_reason") for d in docs], text)
    slow = slow[0]
    assert int(slow["flight_slow_step_ns"]) >= 1_000_000_000
    assert int(slow["flight_slow_step_ns"]) > 3 * int(slow["flight_median_step_ns"])
    # The span as it stood when step 20 ended (the 10 steps before it and step 20), then its
    # after-period (2 s by default): still running when the exception came, so written then, cut
    # short, up to the step the exception cut (on a machine so loaded that the four steps took
    # over 2 s: written at the period's end).
    steps = _steps(slow)
    assert steps[0] == 10 and steps == list(range(10, steps[-1] + 1)), steps
    assert slow["flight_after_ns"] == "2000000000", slow["flight_after_ns"]
    if "flight_after_cut_by" in slow:
        assert slow["flight_after_cut_by"] == "exception" and steps[-1] == 25, steps
    else:
        assert int(slow["flight_end_ns"]) == int(slow["flight_trigger_ns"]) + 2_000_000_000
        assert steps[-1] >= 21, steps
    (slow20,) = [e for e in slow["traceEvents"] if e.get("name") == "ProfilerStep#20"]
    assert slow20["dur"] >= 1_000_000, slow20
    _covers_what_it_says(slow)

    crash = dumps["exception"]
    assert crash["flight_exception"] == exc, crash["flight_reason"]
    assert exc in crash["flight_reason"] and "step 25" in crash["flight_reason"] or \
        "40.00 GiB" in crash["flight_reason"], crash["flight_reason"]
    # Ten whole steps and the one the exception cut short.
    assert _steps(crash) == list(range(15, 26)), _steps(crash)
    assert crash["kinetrace_partial_step"] == "25"
    assert crash["flight_first_step"] == "15" and crash["flight_last_step"] == "25"
    _covers_what_it_says(crash)
    # The last events: step 25's forward ops, after its ProfilerStep began.
    (last,) = [e for e in crash["traceEvents"] if e.get("name") == "ProfilerStep#25"]
    final_ops = {e["name"] for e in crash["traceEvents"]
                 if e.get("cat") == "cpu_op" and e["ts"] >= last["ts"]}
    assert {"aten::linear", "aten::mse_loss"} <= final_ops, sorted(final_ops)
    # ... and no backward in it (the exception came before).
    assert not any("Backward" in n for n in final_ops), sorted(final_ops)


GLOO = r"""
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
for step in range(10):
    opt.zero_grad()
    model(x).sum().backward()
    if step == 6 and rank == 1:
        # Rank 1 stops before the all-reduce until the test lets it go.
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    time.sleep(0.02)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
"""


def test_a_rank_stuck_in_an_all_reduce_dumps_naming_it(built, tmp_path):
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    go = tmp_path / "go"
    out = tmp_path / "traces"
    env = _env(tmp_path)
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '')}"
    env["KINETRACE_FLIGHT_HANG"] = "2s"
    env["KINETRACE_FLIGHT_SLOW_STEP"] = "off"
    job = subprocess.Popen(
        [str(built["kinetrace"]), "record", "--flight", "20steps", "-o", str(out), "--no-summary",
         "--", "torchrun", "--nproc-per-node", "2", str(script), str(go)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 180
        hang = None
        while hang is None:
            for p in _traces(out):
                try:
                    doc = json.loads(p.read_text())
                except ValueError:
                    continue
                if doc.get("flight_trigger") == "hang":
                    hang = (p, doc)
            if hang is None:
                assert job.poll() is None, job.communicate()
                assert time.monotonic() < deadline, "no hang dump after 180 s"
                time.sleep(0.2)
        # Rank 1 goes on; the all-reduce completes and the job ends normally.
        go.write_text("")
        stdout, stderr = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, stderr
    assert "rank 0 done" in stdout and "rank 1 done" in stdout, stdout
    path, doc = hang
    assert doc["distributedInfo"]["rank"] == 0, doc["distributedInfo"]
    op = doc["flight_hang_op"]
    assert "allreduce" in op or "all_reduce" in op, op
    assert doc["flight_hang_step"] == "6", doc["flight_reason"]
    assert int(doc["flight_hang_stalled_ns"]) >= 2_000_000_000
    assert _steps(doc)[-1] == 6 and doc["kinetrace_partial_step"] == "6", _steps(doc)
    # Only rank 0 was inside a collective: rank 1 (stopped before it) wrote no hang dump.
    hangs = [d for d in (json.loads(p.read_text()) for p in _traces(out))
             if d.get("flight_trigger") == "hang"]
    assert len(hangs) == 1, [d["distributedInfo"] for d in hangs]
    # doctor starts from the hang: the op it was stuck in and the last collective it finished.
    text = subprocess.run([str(built["kinetrace"]), "doctor", str(path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120).stdout
    assert text.startswith("Flight dump, rank 0 (hang): no step for"), text
    assert f"stuck in: {op}" in text and "last collective finished: " in text, text


THREAD_JOB = r"""
import threading
import time
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 16)
y = x.sum(dim=1, keepdim=True)


def train():
    for step in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == 12:
            raise RuntimeError("injected failure in the trainer thread")
        loss.backward()
        time.sleep(0.02)
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


t = threading.Thread(target=train, name="trainer")
t.start()
t.join()
print("main: the trainer thread ended", flush=True)
"""


def test_an_exception_leaving_a_worker_thread_dumps_naming_it(built, tmp_path):
    """The training loop in a thread of its own: an exception leaving it reaches
    `threading.excepthook`, which dumps (trigger `exception`, the thread's name in the head), then
    Python's own hook prints the traceback; the main thread goes on and exits 0, as without
    kinetrace."""
    plain, dumps, docs, text = _plain_then_recorded(
        built, tmp_path, THREAD_JOB, [], ["--flight", "10steps"],
        KINETRACE_FLIGHT_SLOW_STEP="off")
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert len(lines) == 13 and lines[-1] == "main: the trainer thread ended", plain.stdout
    assert "Exception in thread trainer" in plain.stderr, plain.stderr

    assert list(dumps) == ["exception"] and len(docs) == 1, ([d.get("flight_reason") for d in docs],
                                                            text)
    crash = dumps["exception"]
    assert crash["flight_exception"] == "RuntimeError", crash["flight_reason"]
    assert crash["flight_exception_thread"] == "trainer", crash["flight_reason"]
    assert crash["flight_reason"].startswith("RuntimeError left thread trainer: injected"), \
        crash["flight_reason"]
    # Ten whole steps and the one the exception cut short, on the trainer's thread.
    assert _steps(crash) == list(range(2, 13)), _steps(crash)
    assert crash["kinetrace_partial_step"] == "12"
    _covers_what_it_says(crash)
    # Every step on the trainer's row, the one the process's exit closed included (it may close it
    # before the collector writes the dump).
    rows = {e["tid"] for e in crash["traceEvents"]
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    assert len(rows) == 1, rows
    # The last events: step 12's forward ops, on its thread.
    (last,) = [e for e in crash["traceEvents"] if e.get("name") == "ProfilerStep#12"]
    # Not the main thread's (its tid is the pid), which only waits for the trainer.
    assert last["tid"] != last["pid"], last
    final_ops = {e["name"] for e in crash["traceEvents"]
                 if e.get("cat") == "cpu_op" and e["ts"] >= last["ts"] and e["tid"] == last["tid"]}
    assert {"aten::linear", "aten::mse_loss"} <= final_ops, sorted(final_ops)


OOM_JOB = r"""
import time
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 16)
y = x.sum(dim=1, keepdim=True)
for step in range(10):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step == 6:
        raise torch.OutOfMemoryError("injected: tried to allocate 40.00 GiB")
    loss.backward()
    time.sleep(0.02)
    opt.step()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
"""


def test_an_out_of_memory_dump_holds_the_allocators_memory_events(built, tmp_path):
    """`record --flight 60s --profile-memory`: the dump an OutOfMemoryError writes holds PyTorch's
    allocator events (`[memory]`, with `Total Allocated`) of the steps before it."""
    if not built["recorder"]:
        base._no_recorder(built)
    plain, dumps, docs, text = _plain_then_recorded(
        built, tmp_path, OOM_JOB, [], ["--flight", "60s", "--profile-memory"],
        KINETRACE_FLIGHT_SLOW_STEP="off")
    assert plain.returncode == 1, plain.stderr
    assert plain.stderr.rstrip().endswith("injected: tried to allocate 40.00 GiB"), plain.stderr
    assert list(dumps) == ["exception"], ([d.get("flight_reason") for d in docs], text)
    crash = dumps["exception"]
    assert crash["flight_exception"] == "torch.OutOfMemoryError", crash["flight_reason"]
    assert crash.get("profile_memory") == 1, [k for k in crash if k != "traceEvents"]
    _covers_what_it_says(crash)
    memory = [e for e in crash["traceEvents"] if e.get("name") == "[memory]"]
    assert memory, text
    assert all(e.get("ph") == "i" and "Total Allocated" in e["args"] and "Bytes" in e["args"]
               for e in memory), memory[:3]
    # Every whole step before the error allocated (its forward, backward and optimizer step), and
    # some of that memory was live at its end.
    spans = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
             for e in crash["traceEvents"]
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    for step in range(1, 6):
        start, end = spans[step]
        inside = [e for e in memory if start <= e["ts"] < end]
        assert any(e["args"]["Bytes"] > 0 for e in inside), (step, len(inside))
        assert inside[-1]["args"]["Total Allocated"] > 0, (step, inside[-1])

    # A dump is a normal trace: HolisticTraceAnalysis 0.5.0 loads it, its steps and ops, and
    # `kinetrace convert` writes a Perfetto trace that Perfetto's schema decodes, a slice for
    # every complete event and the allocator's bytes as counter tracks.
    from hta.trace_analysis import TraceAnalysis
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    (path,) = [p for p in _traces(tmp_path / "traces")
               if json.loads(p.read_text()).get("flight_trigger") == "exception"]
    alone = tmp_path / "dump"
    alone.mkdir()
    (alone / path.name).write_bytes(path.read_bytes())
    analysis = TraceAnalysis(trace_dir=str(alone), include_last_profiler_step=True)
    df = analysis.t.get_trace(0)
    names = analysis.t.symbol_table.get_sym_table()
    loaded = [names[i] for i in df["name"]]
    want = sum(1 for e in crash["traceEvents"] if e.get("name") == "aten::addmm")
    assert want > 0 and loaded.count("aten::addmm") == want, (loaded.count("aten::addmm"), want)
    assert {f"ProfilerStep#{s}" for s in range(1, 7)} <= set(loaded), sorted(set(loaded))[:20]
    pf = tmp_path / "dump.pftrace"
    conv = _run([str(built["kinetrace"]), "convert", str(path), str(pf)], _env(tmp_path), tmp_path)
    assert conv.returncode == 0, conv.stderr
    trace = pb.Trace()
    trace.ParseFromString(pf.read_bytes())
    begins = sum(1 for p in trace.packet if p.HasField("track_event") and p.track_event.type == 1)
    counters = sum(1 for p in trace.packet if p.HasField("track_event") and p.track_event.type == 4)
    slices = sum(1 for e in crash["traceEvents"] if e.get("ph") == "X")
    assert begins == slices, (begins, slices)
    assert counters >= len(memory), (counters, len(memory))
