"""The wheel as a PyTorch user gets it (`scripts/wheel-tests.sh` builds it and runs this).

`pip install` puts it into a fresh venv with **no cargo (or rustc) on PATH** and no network
(`--no-index`). The venv sees the torch venv's packages through a `.pth` file naming the torch
venv's site-packages (appended after the venv's own, so the installed `kinetrace` is the wheel's):
`python -m venv --system-site-packages` would expose the base interpreter's packages, not the torch
venv's, and reinstalling torch would cost ~3 GB per run. The venv is made by the torch venv's own
interpreter, so torch's compiled modules match its Python.

Then, as a user would:
- `import kinetrace` works and comes from the installed package;
- `kinetrace record --iterations 2 -- python train.py` preloads the shim from inside the installed
  package (no KINETRACE_PRELOAD_PATH) and writes a trace with ATen ops (the op recorder built on
  first use with the system C++ compiler, into a fresh cache);
- the guide's training loop (an MLP with LayerNorm, a DataLoader, AdamW, cross-entropy;
  schedule(wait=2, warmup=2, active=3), tensorboard_trace_handler) with `torch.profiler.profile`
  replaced by `kinetrace.profile`, same arguments, writes one trace with the same ops per step as
  torch.profiler's;
- schedules and handlers kinetrace cannot convert are driven step by step; arguments it cannot
  honour are one warning each, never an exception in the loop;
- `auditwheel show` (PyPI's auditwheel) reports a manylinux tag, and the wheel is under 15 MB.

Required (missing prerequisites fail) under `CI=true` or `KINETRACE_TORCH_TESTS=1`; otherwise
skipped with the reason when the wheel or the torch venv is missing.
"""

import collections
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH_VENV = Path(os.environ.get("TORCH_VENV", ROOT / "target" / "torch-venv"))
TORCH_PYTHON = TORCH_VENV / "bin" / "python"
WHEEL = os.environ.get("KINETRACE_WHEEL", "")
AUDITWHEEL = os.environ.get("KINETRACE_AUDITWHEEL", "")
REQUIRED = os.environ.get("KINETRACE_TORCH_TESTS") == "1" or os.environ.get("CI") == "true"


def _prerequisites():
    missing = []
    if not WHEEL or not Path(WHEEL).is_file():
        missing.append("the wheel (KINETRACE_WHEEL; scripts/wheel-tests.sh builds it)")
    if not (TORCH_VENV / ".kinetrace-torch-venv-stamp").exists():
        missing.append(f"the torch venv at {TORCH_VENV} (scripts/torch-venv.sh)")
    return missing


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    missing = _prerequisites()
    if missing:
        why = "missing: " + "; ".join(missing)
        if REQUIRED:
            pytest.fail(why + " (required under CI=true)")
        pytest.skip(why)
    d = tmp_path_factory.mktemp("fresh")
    venv = d / "venv"
    subprocess.run([str(TORCH_PYTHON), "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"

    def purelib(py):
        return subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()

    site = Path(purelib(python))
    (site / "torch-venv.pth").write_text(purelib(TORCH_PYTHON) + "\n")
    # PATH: the venv, then the system directories that hold no Rust toolchain.
    system = [p for p in ("/usr/local/bin", "/usr/bin", "/bin")
              if not any(Path(p, t).exists() for t in ("cargo", "rustc"))]
    path = ":".join([str(venv / "bin")] + system)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KINETRACE_", "KINETO_", "CUDA_INJECTION", "NVTX_INJECTION",
                                "CARGO", "RUSTUP"))
           and k not in ("LD_PRELOAD", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=path, HOME=str(d / "home"), XDG_CACHE_HOME=str(d / "cache"),
               PYTHONDONTWRITEBYTECODE="1")
    (d / "home").mkdir()
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    pip = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-deps",
                          "--disable-pip-version-check", WHEEL],
                         env=env, capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # A binary wheel: nothing was built on install.
    assert "Building wheel" not in pip.stdout, pip.stdout
    return {"dir": d, "python": python, "kinetrace": venv / "bin" / "kinetrace", "env": env,
            "site": site}


def _run(cmd, fresh, cwd, timeout=600):
    return subprocess.run([str(c) for c in cmd], env=fresh["env"], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _traces(d):
    return sorted(Path(d).rglob("*.pt.trace.json")) if Path(d).exists() else []


def test_import_kinetrace_comes_from_the_installed_wheel(fresh, tmp_path):
    r = _run([fresh["python"], "-c",
              "import kinetrace; print(kinetrace.__file__); print(kinetrace.profile.__name__)"],
             fresh, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(fresh["site"] / "kinetrace" / "__init__.py"), "profile"]
    # The wheel installed no sitecustomize (record writes its own per run).
    assert not (fresh["site"] / "sitecustomize.py").exists()


TRAIN = r"""
import os
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 16)
y = x.sum(dim=1, keepdim=True)
for step in range(4):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("preloaded", os.environ.get("LD_PRELOAD"))
"""


def test_record_from_the_wheel_finds_its_shim_in_the_package(fresh, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    out = tmp_path / "traces"
    r = _run([fresh["kinetrace"], "record", "--iterations", "2", "-o", out, "--no-summary", "--",
              "python", "train.py"], fresh, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "preloaded %s\n" % (fresh["site"] / "kinetrace" / "libkinetrace.so"), r.stdout
    (trace,) = _traces(out)
    events = json.loads(trace.read_text())["traceEvents"]
    ops = collections.Counter(e["name"] for e in events if e.get("cat") == "cpu_op")
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#0", "ProfilerStep#1"], steps
    assert ops["aten::addmm"] >= 2 and ops["aten::mse_loss"] >= 1 and sum(ops.values()) > 30, ops
    # The op recorder was built on first use (a C++ compiler is here), not the NVTX fallback.
    assert "python: PyTorch ops through the compiled RecordFunction recorder" in r.stderr, r.stderr


GUIDE = r"""
import sys
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 10))
data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
loader = DataLoader(data, batch_size=32, shuffle=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

with profile(activities=[ProfilerActivity.CPU],
             schedule=schedule(wait=2, warmup=2, active=3),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1]),
             record_shapes=True) as prof:
    for step, (x, y) in enumerate(loader):
        if step == 9:
            break
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        prof.step()
print("trained")
"""
# The one change a user makes.
ONE_IMPORT = ("from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler",
              "from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler\n"
              "from kinetrace import profile")


def _ops_per_step(trace):
    """ProfilerStep#N -> Counter of (cat, name) of the cpu_op and user_annotation events inside
    it on its thread (module ranges, kinetrace's own, left out)."""
    events = json.loads(Path(trace).read_text())["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    out = {}
    for s in (e for e in xs if e["name"].startswith("ProfilerStep#")):
        inside = [e for e in xs if e is not s and e["tid"] == s["tid"] and s["ts"] <= e["ts"]
                  and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 0.002
                  and not e["name"].startswith(("ProfilerStep#", "nn.Module: "))]
        out[s["name"]] = collections.Counter((e["cat"], e["name"]) for e in inside)
    return out


def test_kinetrace_profile_writes_the_same_ops_per_step_as_torch_profiler(fresh, tmp_path):
    assert ONE_IMPORT[0] in GUIDE
    (tmp_path / "torch_profiler.py").write_text(GUIDE)
    (tmp_path / "kinetrace_profile.py").write_text(GUIDE.replace(*ONE_IMPORT))
    theirs = _run([fresh["python"], "torch_profiler.py", "tb-torch"], fresh, tmp_path)
    assert theirs.returncode == 0 and theirs.stdout == "trained\n", theirs.stderr
    ours = _run([fresh["python"], "kinetrace_profile.py", "tb-kinetrace"], fresh, tmp_path)
    assert ours.returncode == 0 and ours.stdout == "trained\n", ours.stderr
    # kinetrace says which route the ops took, and nothing else.
    assert ours.stderr == "kinetrace: python: PyTorch ops through the compiled RecordFunction recorder\n", \
        ours.stderr
    (peer,) = _traces(tmp_path / "tb-torch")
    (trace,) = _traces(tmp_path / "tb-kinetrace")
    a, b = _ops_per_step(peer), _ops_per_step(trace)
    assert sorted(b) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"], sorted(b)
    assert sorted(a) == sorted(b)
    for step in a:
        assert sum(a[step].values()) > 300, a[step]
        assert b[step] == a[step], (step, a[step] - b[step], b[step] - a[step])
    # Shapes as record_shapes writes them.
    events = json.loads(trace.read_text())["traceEvents"]
    layer_norm = next(e for e in events if e.get("name") == "aten::layer_norm")
    assert layer_norm["args"]["Input Dims"][0] == [32, 64], layer_norm


API = r"""
import json, os, sys, warnings
import kinetrace
from kinetrace import ProfilerAction
warnings.simplefilter("always")
seen = []

def handler(prof):
    path = os.path.join("exported", "cycle%d.json.gz" % len(seen))
    prof.export_chrome_trace(path)
    seen.append((prof.step_num, path))

# A schedule kinetrace cannot convert (a plain function): asked step by step.
def every_fourth(step):
    return {1: ProfilerAction.WARMUP, 2: ProfilerAction.RECORD,
            3: ProfilerAction.RECORD_AND_SAVE}.get(step % 4, ProfilerAction.NONE)

with warnings.catch_warnings(record=True) as w:
    with kinetrace.profile(activities=["CPU"], schedule=every_fourth, on_trace_ready=handler,
                           with_flops=True) as p:
        for step in range(9):
            p.step()
print("handled", seen)
print("warnings", [str(x.message) for x in w])

# A second profile in the same process starts afresh; a handler that raises is one warning, and
# the loop goes on.
def broken(prof):
    raise ValueError("disk full")

with warnings.catch_warnings(record=True) as w:
    with kinetrace.profile(activities=["CPU"], on_trace_ready=broken,
                           schedule=kinetrace.schedule(wait=0, warmup=0, active=1, repeat=3)) as p:
        for step in range(4):
            p.step()
print("broken", [str(x.message) for x in w])
"""


def test_kinetrace_profile_drives_other_schedules_and_calls_other_handlers(fresh, tmp_path):
    r = _run([fresh["python"], "-c", API], fresh, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    handled = eval(lines[0][len("handled "):])
    # Two captures (steps 2-3 and 6-7), each handed over once, at a step after it was written
    # or at stop().
    assert len(handled) == 2, r.stdout
    import gzip

    steps = []
    for _, path in handled:
        events = json.loads(gzip.open(tmp_path / path).read())["traceEvents"]
        steps.append(sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")))
    assert steps == [["ProfilerStep#2", "ProfilerStep#3"], ["ProfilerStep#6", "ProfilerStep#7"]]
    # What cannot be honoured: one warning, no exception.
    assert lines[1] == "warnings ['kinetrace.profile: with_flops is not honoured by kinetrace; ignored']", \
        lines[1]
    assert lines[2] == "broken ['kinetrace.profile: on_trace_ready raised ValueError: disk full']", \
        lines[2]


def test_auditwheel_reports_a_manylinux_tag_and_the_wheel_is_small(fresh):
    assert AUDITWHEEL, "KINETRACE_AUDITWHEEL names no auditwheel (scripts/wheel-tests.sh sets it)"
    r = subprocess.run([AUDITWHEEL, "show", WHEEL], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    tag = re.search(r'constrains the platform tag to "(manylinux_2_\d+_x86_64)"', text)
    assert tag, r.stdout
    assert Path(WHEEL).name.endswith("-py3-none-%s.whl" % tag.group(1)), (WHEEL, tag.group(1))
    assert Path(WHEEL).stat().st_size < 15 * 1024 * 1024
