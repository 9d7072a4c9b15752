"""docs/pytorch.md cannot rot: every command on the page runs here, in order, on the CPU, with real
PyTorch.

The page's fenced blocks are read in order:
- the `python` block is the job, written to `train.py` in a scratch directory;
- each `sh` block runs there with `bash -euo pipefail` (a block after `<!-- from the checkout -->`
  runs in the kinetrace checkout), with `kinetrace` (the release build) and the torch venv's
  `python` / `torchrun` first on `PATH`, and must succeed;
- each `text` block after an `sh` block is output the reader is told to read: every line of it must
  be found in that block's output (stdout and stderr), its words in order, numbers aside (they
  differ run to run). `console` blocks are samples (findings depend on the machine) and are not
  checked.

Required (a missing venv fails) when `KINETRACE_TORCH_TESTS=1` or `CI=true`; otherwise skipped with
the reason when the torch venv is missing (as tests/preload/test_torch_record.py).
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pytorch.md"
VENV = Path(os.environ.get("TORCH_VENV", ROOT / "target" / "torch-venv"))
STAMP = VENV / ".kinetrace-torch-venv-stamp"
REQUIRED = os.environ.get("KINETRACE_TORCH_TESTS") == "1" or os.environ.get("CI") == "true"
# Per block (a cold op-recorder build or a torchrun included).
DEADLINE = 900

pytestmark = [
    pytest.mark.skipif(
        not REQUIRED and not STAMP.exists(),
        reason=f"no torch venv at {VENV}: run scripts/torch-venv.sh (or set KINETRACE_TORCH_TESTS=1)",
    ),
]

BLOCK = re.compile(r"(<!-- from the checkout -->\n)?```([A-Za-z]*)\n(.*?)```", re.S)


def blocks(text):
    """(info string, body, runs in the checkout) of each fenced block, in order."""
    for m in BLOCK.finditer(text):
        yield m.group(2), m.group(3), bool(m.group(1))


def found(expected: str, output: list) -> bool:
    """Whether some output line holds the words of `expected` without digits, in order (each may
    be part of a longer word: a path where the page shows a relative one)."""
    words = [w for w in expected.split() if not any(c.isdigit() for c in w)]
    if len(words) < 2:
        return True
    for line in output:
        at = 0
        for w in words:
            i = line.find(w, at)
            if i < 0:
                break
            at = i + len(w)
        else:
            return True
    return False


def test_the_matcher_reads_words_in_order_and_ignores_numbers():
    out = ["kinetrace: 2 trace(s) in /tmp/x/traces:", "  straggler: rank 1 is slow (5 ms)"]
    assert found("kinetrace: 1 trace(s) in traces:", out)
    assert found("  straggler: rank 0 is slow (7 ms)", out)
    assert not found("straggler: rank is fast", out)
    assert not found("trace(s) kinetrace:", out)


def test_every_command_of_the_guide_runs_and_says_what_the_page_says(tmp_path):
    subprocess.run(
        ["cargo", "build", "--quiet", "--release", "-p", "kinetrace-preload", "-p", "kinetrace-cli"],
        cwd=ROOT, check=True, timeout=1800,
    )
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT,
                          check=True, capture_output=True, text=True, timeout=300).stdout
    release = Path(__import__("json").loads(meta)["target_directory"]) / "release"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KINETRACE_", "KINETO_", "CUDA_INJECTION", "NVTX_INJECTION"))
        and k not in ("LD_PRELOAD", "PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env["PATH"] = f"{release}:{VENV / 'bin'}:{env.get('PATH', '')}"
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    env["KINETRACE_CONTROL_DIR"] = str(tmp_path / "ctl")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    work = tmp_path / "work"
    work.mkdir()

    page = PAGE.read_text()
    last = None
    ran = checked = 0
    jobs = [body for info, body, _ in blocks(page) if info == "python"]
    assert len(jobs) == 1, "the page has one job script"
    (work / "train.py").write_text(jobs[0])
    for info, body, in_checkout in blocks(page):
        if info == "sh":
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", body],
                               cwd=ROOT if in_checkout else work, env=env, capture_output=True,
                               text=True, timeout=DEADLINE)
            assert r.returncode == 0, f"{body}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
            last = (body, (r.stdout + r.stderr).splitlines())
            ran += 1
        elif info == "text":
            assert last is not None, f"output before any command:\n{body}"
            command, output = last
            for line in body.splitlines():
                assert found(line, output), \
                    f"the page says `{line}` after\n{command}\nbut it printed:\n" + "\n".join(output)
                checked += 1
    assert ran >= 10 and checked >= 15, (ran, checked)
