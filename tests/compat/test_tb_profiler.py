"""torch-tb-profiler 0.4.3 (TensorBoard's PyTorch profiler plugin) parses kinetrace traces.

It loads a run the way its `RunLoader` does: file names matched with `consts.WORKER_PATTERN`, each file
through `RunProfileData.parse(worker, span, path, cache_dir)`, then
`RunGenerator(worker, span, data).generate_run_profile()` (no torch needed).

Traces: the constructed two-rank workload of `examples/hta_fixture.rs` (exact numbers, see its module
docs) and the demo's traces. Binaries as in test_hta.py: `KINETRACE_HTA_FIXTURE` / `KINETRACE_DEMO`, else
`cargo run --release --example ...`.

Known 0.4.3 limitations, true of current PyTorch traces too (it predates the `cuda_runtime` category):
runtime time shows 0 (`has_runtime` is False) and kernels are not attributed to operators.
"""

import os
import subprocess
from pathlib import Path

import pytest

# Imported outright: these tests run in the venv scripts/compat-venv.sh prepares, and a missing
# package there is a failure, never a reason to skip.
from torch_tb_profiler import consts
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.event_parser import CommLibTypes, ProfileRole
from torch_tb_profiler.profiler.run_generator import RunGenerator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ROOT = Path(__file__).resolve().parents[2]

# A deadline for the example run (or its cold release build on a loaded 2-core machine): a hung child
# fails the test instead of hanging CI.
BUILD_TIMEOUT = 1800

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def run_example(name: str, env_var: str, out_dir: Path) -> None:
    binary = os.environ.get(env_var)
    if binary:
        cmd = [binary, str(out_dir)]
    else:
        cmd = ["cargo", "run", "--quiet", "--release", "--example", name, "--", str(out_dir)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=BUILD_TIMEOUT)


def load(directory: Path, cache_dir: Path):
    """Every trace in `directory` as tb-profiler's RunLoader sees it: {worker: (span, data, profile)}."""
    loaded = {}
    for path in sorted(directory.iterdir()):
        match = consts.WORKER_PATTERN.match(path.name)
        if not match:
            continue
        worker, span = match.group(1), match.group(2)
        span = span[1:] if span else None
        data = RunProfileData.parse(worker, span, str(path), str(cache_dir))
        profile = RunGenerator(worker, span, data).generate_run_profile()
        loaded.setdefault(worker, []).append((span, data, profile))
    return loaded


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hta_fixture")
    run_example("hta_fixture", "KINETRACE_HTA_FIXTURE", out)
    return load(out, tmp_path_factory.mktemp("tb_cache"))


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    run_example("demo", "KINETRACE_DEMO", out)
    return load(out, tmp_path_factory.mktemp("tb_cache"))


def test_fixture_workers_and_ranks(fixture_runs):
    assert sorted(fixture_runs) == ["rank0", "rank1"]
    for rank in (0, 1):
        [(span, data, _)] = fixture_runs[f"rank{rank}"]
        assert span and span.isdigit()
        assert data.distributed_info == {"rank": rank, "world_size": 2}
        assert data.used_devices == [0]
        assert data.device_props[0]["name"] == "kinetrace Simulated GPU"


def test_fixture_steps(fixture_runs):
    for worker, [(_, data, _)] in fixture_runs.items():
        # ProfilerStep#1..#4 are the constructed steps. (A "0" may precede them: the session's own
        # ProfilerStep#0, which spans the whole window because the fixture never calls step().)
        assert {"1", "2", "3", "4"} <= set(data.steps_names), worker
        assert data.has_kernel and data.has_communication and data.has_memcpy_or_memset, worker
        assert data.comm_lib == {CommLibTypes.Nccl}, worker
        costs = dict(zip(data.steps_names, data.steps_costs))
        for step in ("1", "2", "3"):
            c = costs[step].costs
            # Step span [S, S+1075): gemms 2 × 250; memcpy 125; NCCL's 125 µs not under a gemm plus
            # the 10 µs `nccl:all_reduce` cpu_op; the 20 µs `aten::mm` cpu_op; the rest is "other".
            assert c[ProfileRole.Kernel] == 500, (worker, step)
            assert c[ProfileRole.Memcpy] == 125, (worker, step)
            assert c[ProfileRole.Memset] == 0, (worker, step)
            assert c[ProfileRole.Communication] == 135, (worker, step)
            assert c[ProfileRole.CpuOp] == 20, (worker, step)
            assert c[ProfileRole.Other] == 295, (worker, step)
            assert c[ProfileRole.Total] == 1075, (worker, step)
        # Step 4 adds the first 75 µs of its 5000 µs kernel [S+1000, S+6000) inside the step span.
        assert costs["4"].costs[ProfileRole.Kernel] == 575, worker


def test_fixture_kernels(fixture_runs):
    for worker, [(_, data, profile)] in fixture_runs.items():
        # tb-profiler keeps every step's kernels (it drops no last step here).
        kernels = {k.name: (k.calls, k.total_duration) for k in data.kernel_list_groupby_name_op}
        assert kernels == {
            "sm90_xmma_gemm_fwd_A": (4, 1000),
            "sm90_xmma_gemm_bwd_B": (4, 1000),
            NCCL: (4, 1000),
            "sm90_xmma_gemm_last_step_only": (1, 5000),
        }, worker
        rows = {row[0]: row for row in profile.kernel_table["data"]["rows"]}
        assert rows["sm90_xmma_gemm_fwd_A"][2:] == [4, 1000, 250, 250, 250], worker
        assert rows[NCCL][2:] == [4, 1000, 250, 250, 250], worker
        ops = {op.name: op.calls for op in data.op_list_groupby_name}
        assert ops == {"aten::mm": 4, "nccl:all_reduce": 4}, worker
        step_rows = [row[0] for row in profile.overview["steps"]["rows"]]
        assert {"1", "2", "3", "4"} <= set(step_rows), worker


def test_demo_parses(demo_runs):
    assert list(demo_runs) == ["demo"]
    spans = demo_runs["demo"]
    assert len(spans) >= 1
    for span, data, profile in spans:
        assert data.steps_names, span
        assert all(s.isdigit() for s in data.steps_names), (span, data.steps_names)
        assert data.has_kernel and data.has_memcpy_or_memset, span
        names = {k.name for k in data.kernel_list_groupby_name_op}
        assert any(n.startswith("ampere_sgemm") for n in names), (span, names)
        assert profile.kernel_table["data"]["rows"], span
        assert len(profile.overview["steps"]["rows"]) == len(data.steps_names), span


# A ROCm trace written through the real ROCm backend from the fake rocprofiler-sdk (SDK 1.1
# layouts): `crates/rocm/examples/rocm_fixture.rs`, four ProfilerSteps, each with a 50 µs
# `_Z4gemmPKfS0_Pf`, a 30 µs `_Z4axpyPfS_f`, a 40 µs RCCL all-reduce on a second stream and a 3 µs
# 1 MiB host-to-device copy on GPU 0, on the exact timeline its module docs give.
GEMM = "_Z4gemmPKfS0_Pf"
AXPY = "_Z4axpyPfS_f"
ALLREDUCE = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"


@pytest.fixture(scope="module")
def rocm_runs(tmp_path_factory):
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
    return load(out, tmp_path_factory.mktemp("tb_cache"))


def test_rocm_trace_parses_with_steps_kernels_and_copies(rocm_runs):
    [(worker, spans)] = list(rocm_runs.items())
    [(_, data, profile)] = spans
    assert {"1", "2", "3", "4"} <= set(data.steps_names), data.steps_names
    assert data.has_kernel and data.has_memcpy_or_memset
    assert data.used_devices == [0]
    # The SDK's GPU agents as deviceProperties (the fake has two GPUs).
    assert len(data.device_props) == 2, data.device_props
    kernels = {k.name: (k.calls, k.total_duration) for k in data.kernel_list_groupby_name_op}
    # Every step's kernels, with the constructed durations (µs; tb-profiler keeps all four steps).
    assert kernels == {GEMM: (4, 200), AXPY: (4, 120), ALLREDUCE: (4, 160)}, kernels
    rows = {row[0]: row for row in profile.kernel_table["data"]["rows"]}
    assert rows[GEMM][2:] == [4, 200, 50, 50, 50], rows[GEMM]
    # The fixture's exact GPU timeline: per step the kernels' union is t+100 – t+200 µs (the
    # all-reduce runs past the axpy), then the 3 µs copy on its own.
    costs = dict(zip(data.steps_names, data.steps_costs))
    for step in ("1", "2", "3", "4"):
        c = costs[step].costs
        assert c[ProfileRole.Kernel] == pytest.approx(100, abs=0.01), (step, c)
        assert c[ProfileRole.Memcpy] == pytest.approx(3, abs=0.01), (step, c)
        assert c[ProfileRole.Memset] == 0, (step, c)
