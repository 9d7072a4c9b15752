"""What a PyTorch user meets in the first hour (issue 22), with real PyTorch on the CPU.

A 12-step training script (MLP with LayerNorm, a DataLoader, AdamW; under `torchrun` it trains with
gloo, one rank sleeping every step) runs under `kinetrace record`, beside torch.profiler:

- Ctrl-C on a whole-run recording (SIGINT to `record`, and to its whole process group), and
  SIGTERM: the job dies of that signal, the trace of what was recorded is written, and `record`
  says so in its last lines;
- `--schedule wait=2,warmup=2,active=3`: the second cycle's last step, cut by the end of the run,
  is marked partial and left out of step statistics, where torch.profiler's own trace has the same
  steps;
- a 2-process `torchrun` gloo job with rank 1 sleeping 50 ms a step: rank 1 is the straggler, and
  rank 0 waits for it in gloo:all_reduce;
- `--memory` on the CPU says what it did not record;
- the op table against `key_averages(group_by_input_shape=True)` on torch.profiler's own trace.

Required (a missing venv fails) when `KINETRACE_TORCH_TESTS=1` or `CI=true`; otherwise skipped with
the reason when the torch venv is missing (as tests/preload/test_torch_record.py).
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("TORCH_VENV", ROOT / "target" / "torch-venv"))
TORCH_PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".kinetrace-torch-venv-stamp"
REQUIRED = os.environ.get("KINETRACE_TORCH_TESTS") == "1" or os.environ.get("CI") == "true"
# Every wait on a process has this deadline (a cold op-recorder build included).
DEADLINE = 600

pytestmark = [
    pytest.mark.skipif(
        not REQUIRED and not STAMP.exists(),
        reason=f"no torch venv at {VENV}: run scripts/torch-venv.sh (or set KINETRACE_TORCH_TESTS=1)",
    ),
]

TRAIN = r"""
import argparse, itertools, os, sys, time
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12, help="0: until interrupted")
p.add_argument("--torch-profiler", metavar="DIR")
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-ms", type=float, default=50.0)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
distributed = "WORLD_SIZE" in os.environ
rank = 0
if distributed:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
n = args.steps or 64
data = TensorDataset(torch.randn(n * 16, 32), torch.randn(n * 16, 1))
loader = DataLoader(data, batch_size=16)


def train(after_step):
    batches = itertools.cycle(loader) if args.steps == 0 else loader
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000)
        loss.backward()
        if distributed:
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(flat)
        opt.step()
        after_step()
        print(f"rank {rank} step {i} loss {loss.item():.4f}", flush=True)


if args.torch_profiler:
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=2, warmup=2, active=3),
                 on_trace_ready=tensorboard_trace_handler(args.torch_profiler)) as prof:
        train(prof.step)
else:
    train(lambda: None)
if distributed:
    dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
"""

# torch.profiler's own trace of a few training steps with shapes and memory, and its
# key_averages(group_by_input_shape=True) per (name, input shapes).
KEY_AVERAGES = r"""
import json, sys
import torch
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(16, 32), torch.randn(16, 1)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
prof.export_chrome_trace(sys.argv[1])
json.dump([dict(name=e.key, shapes=e.input_shapes, count=e.count, self_cpu=e.self_cpu_time_total,
                cpu_total=e.cpu_time_total, cpu_mem=e.cpu_memory_usage,
                self_cpu_mem=e.self_cpu_memory_usage)
           for e in prof.key_averages(group_by_input_shape=True)], open(sys.argv[2], "w"))
"""


def _target_dir() -> Path:
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
    ).stdout
    return Path(json.loads(meta)["target_directory"])


@pytest.fixture(scope="module")
def kinetrace(tmp_path_factory):
    subprocess.run(
        ["cargo", "build", "--quiet", "--release", "-p", "kinetrace-preload", "-p", "kinetrace-cli"],
        cwd=ROOT, check=True, timeout=1800,
    )
    # One op-recorder build for the module (record builds it on its first Python command).
    _ENV["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    return _target_dir() / "release" / "kinetrace"


_ENV = {}


def _env(tmp: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KINETRACE_", "KINETO_", "CUDA_INJECTION", "NVTX_INJECTION"))
        and k not in ("LD_PRELOAD", "PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env["KINETRACE_CONTROL_DIR"] = str(tmp / "ctl")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(_ENV)
    # torchrun's console script is found next to the interpreter.
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '')}"
    return env


def _script(tmp: Path, text: str = TRAIN, name: str = "train.py") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def _run(cmd, tmp: Path):
    return subprocess.run(cmd, env=_env(tmp), cwd=tmp, capture_output=True, text=True,
                          timeout=DEADLINE)


def _traces(d: Path):
    return sorted(d.rglob("*.pt.trace.json")) if d.exists() else []


def _steps(trace: Path):
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events
                  if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#"))


def _default_signals():
    # As from a terminal: a runner that starts jobs without job control leaves SIGINT ignored, and
    # an ignored signal stays ignored by record and the job.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("how", ["sigint-to-record", "sigint-to-group", "sigterm-to-record"])
def test_ctrl_c_keeps_a_whole_run_recording(kinetrace, tmp_path, how):
    script = _script(tmp_path)
    out, stdout = tmp_path / "traces", tmp_path / "stdout.txt"
    with open(stdout, "w") as sink:
        rec = subprocess.Popen(
            [str(kinetrace), "record", "-o", str(out), "--", str(TORCH_PYTHON), str(script),
             "--steps", "0"],
            env=_env(tmp_path), cwd=tmp_path, stdout=sink, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=_default_signals,
        )
        try:
            deadline = time.monotonic() + DEADLINE
            while "rank 0 step 3 " not in stdout.read_text():
                assert rec.poll() is None, rec.communicate()[1]
                assert time.monotonic() < deadline, "the job never reached step 3"
                time.sleep(0.05)
            sig = signal.SIGTERM if how == "sigterm-to-record" else signal.SIGINT
            if how == "sigint-to-group":
                os.killpg(rec.pid, sig)
            else:
                os.kill(rec.pid, sig)
            _, err = rec.communicate(timeout=DEADLINE)
        finally:
            if rec.poll() is None:
                os.killpg(rec.pid, signal.SIGKILL)
                rec.wait()
    # record dies of the job's signal: a shell sees 130 (143 for SIGTERM).
    assert rec.returncode == -sig, (rec.returncode, err)
    traces = _traces(out)
    assert len(traces) == 1, err
    printed = [int(line.split()[3]) for line in stdout.read_text().splitlines()
               if line.startswith("rank 0 step ")]
    steps = _steps(traces[0])
    assert steps and steps == list(range(steps[0], steps[-1] + 1)), steps
    assert steps[-1] >= printed[-1], (steps, printed[-1])
    said = "interrupted (SIGINT)" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert f"kinetrace: the job was {said} in step {steps[-1]}; 1 trace(s) of what was recorded in " \
        in err, err
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err, "Python's own traceback, as without kinetrace"
    assert "incomplete file" not in err and "no traces" not in err, err
    partial = json.loads(traces[0].read_text()).get("kinetrace_partial_step")
    assert partial == str(steps[-1]), "the interrupted step is marked partial"


def test_the_last_step_of_a_run_is_partial_not_the_slowest(kinetrace, tmp_path):
    script = _script(tmp_path)
    theirs = tmp_path / "torch-profiler"
    peer = _run([str(TORCH_PYTHON), str(script), "--torch-profiler", str(theirs)], tmp_path)
    assert peer.returncode == 0, peer.stderr
    out = tmp_path / "traces"
    rec = _run([str(kinetrace), "record", "--schedule", "wait=2,warmup=2,active=3", "-o", str(out),
                "--", str(TORCH_PYTHON), str(script)], tmp_path)
    assert rec.returncode == 0, rec.stderr
    ours_traces = _traces(out)
    theirs_traces = sorted(theirs.glob("*.pt.trace.json"))
    assert len(ours_traces) == len(theirs_traces) == 2, (rec.stderr, theirs_traces)
    # The same steps in each cycle: 4–6, then 11 and 12, the last cut by the end of the run.
    assert [_steps(t) for t in ours_traces] == [_steps(t) for t in theirs_traces] \
        == [[4, 5, 6], [11, 12]]
    meta = [json.loads(t.read_text()).get("kinetrace_partial_step") for t in ours_traces]
    assert meta == [None, "12"], "a cycle that ends at a step boundary has no partial step"

    report = json.loads(_run([str(kinetrace), "analyze", "--json", str(out)], tmp_path).stdout)
    assert [(s["step"], s["partial"]) for s in report["steps"]] == \
        [(4, False), (5, False), (6, False), (11, False), (12, True)]
    text = _run([str(kinetrace), "analyze", "--only", "steps", "--top", "0", str(out)], tmp_path).stdout
    table = text.split("Steps per rank (slowest first)")[1].splitlines()[3:8]
    assert table[-1].split()[2:4] == ["12", "partial"], text
    assert "partial: rank 0 step 12 — the capture ended inside it" in text, text
    # doctor's steps are the whole ones.
    doc = json.loads(_run([str(kinetrace), "doctor", "--json", str(out)], tmp_path).stdout)
    assert sorted(r["steps"] for r in doc["ranks"]) == [1, 3], doc["ranks"]
    # torch.profiler's own trace names no partial step: all its steps are analysed as whole.
    report = json.loads(_run([str(kinetrace), "analyze", "--json", str(theirs)], tmp_path).stdout)
    assert not any(s["partial"] for s in report["steps"])


def test_a_cpu_only_gloo_straggler_is_named_with_the_wait_it_causes(kinetrace, tmp_path):
    script = _script(tmp_path)
    out = tmp_path / "traces"
    rec = _run([str(kinetrace), "record", "-o", str(out), "--", "torchrun", "--nproc-per-node", "2",
                str(script), "--steps", "6", "--slow-rank", "1", "--slow-ms", "50"], tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert len(_traces(out)) == 2, rec.stderr
    # The summary record prints, and analyze's JSON.
    assert "straggler: rank 1 is slow (" in rec.stderr, rec.stderr
    assert "rank 0 waits " in rec.stderr and " per step in gloo:all_reduce for it" in rec.stderr, \
        rec.stderr
    report = json.loads(_run([str(kinetrace), "analyze", "--json", str(out)], tmp_path).stdout)
    s = report["straggler"]
    assert (s["rank"], s["basis"], s["waiting_rank"], s["wait_in"]) == \
        (1, "cpu", 0, "gloo:all_reduce"), s
    assert s["steps_compared"] == 5, "steps 1–5: the partial sixth is left out"
    doc = json.loads(_run([str(kinetrace), "doctor", "--json", str(out)], tmp_path).stdout)
    finding = next(f for f in doc["findings"] if f["rule"] == "straggler-rank")
    assert finding["ranks"] == [1], finding
    assert finding["summary"].startswith("rank 1 is slow") and "gloo:all_reduce" in finding["summary"]


def test_memory_on_a_cpu_job_says_what_it_did_not_record(kinetrace, tmp_path):
    script = _script(tmp_path)
    out = tmp_path / "traces"
    rec = _run([str(kinetrace), "record", "--memory", "--iterations", "3", "-o", str(out), "--",
                str(TORCH_PYTHON), str(script)], tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert "--memory (KINETRACE_MEMORY) records the CUDA driver's allocations, and this process " \
        "has no CUDA yet" in rec.stderr, rec.stderr
    assert "kinetrace record --profile-memory" in rec.stderr, rec.stderr
    traces = _traces(out)
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert not any(e.get("name") == "[memory]" for e in events)
    text = _run([str(kinetrace), "analyze", "--only", "memory", str(out)], tmp_path).stdout
    assert "no [memory] events in the traces: record PyTorch's allocator" in text, text


def test_the_op_table_is_key_averages(kinetrace, tmp_path):
    script = _script(tmp_path, KEY_AVERAGES, "key_averages.py")
    traces = tmp_path / "traces"
    traces.mkdir()
    theirs = tmp_path / "key_averages.json"
    peer = _run([str(TORCH_PYTHON), str(script), str(traces / "t.json"), str(theirs)], tmp_path)
    assert peer.returncode == 0, peer.stderr
    r = _run([str(kinetrace), "analyze", "--json", "--only", "ops", "--group-by", "shape",
              "--sort", "self_cpu_memory_usage", str(traces)], tmp_path)
    assert r.returncode == 0, r.stderr
    ours = {(o["name"], o["shape"]): o for o in json.loads(r.stdout)["ops"]}
    compared = 0
    for e in json.load(open(theirs)):
        name = e["name"]
        # Not comparable, as torch itself disagrees between its trace and key_averages: the
        # `[memory]` row (not an op); a TensorList's shapes ([[]] there, the tensors' shapes in
        # the trace); a redispatch (an op whose only child has its own name: one event there, two
        # in the trace).
        if name in ("[memory]", "aten::broadcast_tensors", "aten::div_"):
            continue
        # An op recorded without shapes has none here, `[]` there.
        shape = json.dumps(e["shapes"]) if e["shapes"] else None
        o = ours.get((name, shape))
        assert o is not None, (name, e["shapes"])
        assert o["count"] == e["count"], (name, o["count"], e["count"])
        # The trace's µs have three decimals; key_averages sums the same events.
        assert abs(o["cpu_self_us"] - e["self_cpu"]) <= 0.01 * o["count"] + 0.01, (name, o, e)
        assert abs(o["cpu_total_us"] - e["cpu_total"]) <= 0.01 * o["count"] + 0.01, (name, o, e)
        assert abs(o["cpu_avg_us"] - e["cpu_total"] / e["count"]) <= 0.02, (name, o, e)
        assert (o["cpu_mem_bytes"], o["cpu_mem_self_bytes"]) == (e["cpu_mem"], e["self_cpu_mem"]), \
            (name, o, e)
        compared += 1
    assert compared > 100, compared
    # The table's order is the one asked for.
    mem = [o["cpu_mem_self_bytes"] for o in json.loads(r.stdout)["ops"]]
    assert mem == sorted(mem, reverse=True)
    text = _run([str(kinetrace), "analyze", "--only", "ops", "--group-by", "shape", str(traces)],
                tmp_path).stdout
    for column in ("input shapes", "self CPU %", "total CPU %", "CPU avg", "self CPU mem", "CPU mem"):
        assert column in text, text
