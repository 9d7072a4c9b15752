"""Shapes as torch.profiler records them, and collectives with their args, on real PyTorch (CPU).

- The guide's script (an MLP with LayerNorm, a DataLoader, AdamW, cross-entropy) under
  `kinetrace record --record-shapes` and under `torch.profiler(record_shapes=True)` over the same
  iterations: every op has the same `Input Dims`, `Input type`, `Input Strides`, `Concrete Inputs`
  and `Sequence number` (autograd's `evaluate_function` ranges included), op by op.
- A 2-process `torchrun` job (gloo, DistributedDataParallel) under `kinetrace record
  --record-shapes` and under torch.profiler: one trace per rank, `distributedInfo` equal to
  torch.profiler's, every `c10d::allreduce_` with its collective args (the sizes add up to the
  model's parameters per step), and HolisticTraceAnalysis 0.5.0 reads those args and runs its
  communication analysis on the pair.

Same venv rules as test_torch_record.py (whose build this file shares).
"""

import json
import re
import socket
from pathlib import Path

import pytest

import test_torch_record as base
from test_torch_record import REQUIRED, STAMP, TORCH_PYTHON, VENV, _env, _run, _steps, _traces

pytestmark = [
    pytest.mark.skipif(
        not REQUIRED and not STAMP.exists(),
        reason=f"no torch venv at {VENV}: run scripts/torch-venv.sh (or set KINETRACE_TORCH_TESTS=1)",
    ),
]

SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Sequence number")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    b = base.build_once(tmp_path_factory)
    if not b["recorder"]:
        base._no_recorder(b)
    return b


GUIDE = r"""
import sys
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
X = torch.randn(256, 32)
Y = torch.randint(0, 10, (256,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16,
                                     shuffle=True)
model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()


def train(after_step):
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        after_step()


if sys.argv[1] == "torch.profiler":
    from torch.profiler import ProfilerActivity, profile, schedule

    # Steps 2, 3 and 4, as `record --iterations 3 --start-iteration 2` records them.
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        train(prof.step)
    prof.export_chrome_trace(sys.argv[2])
else:
    train(lambda: None)
print("trained")
"""


def _load(path):
    return json.loads(Path(path).read_text())


def _op_args(doc):
    """(name, each record_shapes arg) -> count, for every cpu_op."""
    out = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            args = e.get("args", {})
            key = (e["name"],) + tuple(json.dumps(args.get(k)) for k in SHAPE_ARGS)
            out[key] = out.get(key, 0) + 1
    return out


def test_the_guides_ops_have_torch_profilers_shapes_op_by_op(built, tmp_path):
    script = tmp_path / "guide.py"
    script.write_text(GUIDE)
    env = _env(tmp_path)
    theirs = tmp_path / "torch.json"
    peer = _run([str(TORCH_PYTHON), str(script), "torch.profiler", str(theirs)], env, tmp_path)
    assert peer.returncode == 0, peer.stderr
    out, log = tmp_path / "traces", tmp_path / "kinetrace.log"
    rec = _run(
        [str(built["kinetrace"]), "record", "--iterations", "3", "--start-iteration", "2",
         "--record-shapes", "-o", str(out), "--log", str(log), "--no-summary", "--",
         str(TORCH_PYTHON), str(script), "record"],
        env, tmp_path,
    )
    assert rec.returncode == 0 and rec.stdout == "trained\n", rec.stderr
    (trace,) = _traces(out)
    assert _steps(trace) == [2, 3, 4]
    assert base.RECORDER_LINE in log.read_text(), log.read_text()
    ours, peer_doc = _load(trace), _load(theirs)

    # The head says so, as torch.profiler's does.
    assert ours.get("record_shapes") == peer_doc.get("record_shapes") == 1

    mine, torchs = _op_args(ours), _op_args(peer_doc)
    assert sum(torchs.values()) > 1000, sum(torchs.values())
    assert mine == torchs, {k: (mine.get(k), torchs.get(k)) for k in set(mine) | set(torchs)
                            if mine.get(k) != torchs.get(k)}

    # What the comparison covers: nested TensorLists (the DataLoader's collate stacks 16 rows),
    # scalars as torch prints them, and autograd's evaluate_function ranges with the sequence
    # number of the backward function they run.
    stacks = [(json.loads(k[1]), json.loads(k[2])) for k in mine if k[0] == "aten::stack"]
    assert ([[[32]] * 16, []], ["TensorList", "Scalar"]) in stacks, stacks
    assert ([[[]] * 16, []], ["TensorList", "Scalar"]) in stacks, stacks
    eps = {json.loads(k[4])[4] for k in mine if k[0] == "aten::layer_norm"}
    assert eps == {"1.0000000000000001e-05"}, eps
    evaluate = [k for k in mine if k[0].startswith("autograd::engine::evaluate_function: ")
                and "AccumulateGrad" not in k[0]]
    assert evaluate and all(json.loads(k[5]) is not None for k in evaluate), evaluate
    accumulate = [k for k in mine if k[0].endswith(" torch::autograd::AccumulateGrad")]
    assert accumulate and all(k[5] == "null" for k in accumulate), accumulate

    # Without --record-shapes: none of it (and nothing in the head).
    out2 = tmp_path / "traces-plain"
    rec = _run(
        [str(built["kinetrace"]), "record", "--iterations", "3", "--start-iteration", "2",
         "-o", str(out2), "--log", str(log), "--no-summary", "--",
         str(TORCH_PYTHON), str(script), "record"],
        env, tmp_path,
    )
    assert rec.returncode == 0, rec.stderr
    (plain,) = _traces(out2)
    doc = _load(plain)
    assert "record_shapes" not in doc
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and not any(k in e.get("args", {}) for e in ops for k in SHAPE_ARGS[:4])


DDP = r"""
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 10)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 32) + rank
y = torch.randint(0, 10, (64,))


def train(after_step):
    for step in range(8):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        after_step()


if sys.argv[1] == "torch.profiler":
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        train(prof.step)
    prof.export_chrome_trace(sys.argv[2] % rank)
else:
    train(lambda: None)
print(f"rank {rank} params {sum(p.numel() for p in model.parameters())}", flush=True)
dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script, args):
    torchrun = VENV / "bin" / "torchrun"
    return [str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()), str(script)] + args


COLLECTIVE_ARGS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size",
                   "In split size", "Out split size", "Process Group Name",
                   "Process Group Description", "Process Group Ranks")


def test_a_gloo_ddp_job_has_torch_profilers_distributed_info_and_collective_args(built, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    env = _env(tmp_path)
    env.pop("OMP_NUM_THREADS", None)
    peer = _run(_torchrun(script, ["torch.profiler", str(tmp_path / "torch-%d.json")]), env, tmp_path)
    assert peer.returncode == 0, peer.stderr
    # Both ranks share torchrun's stdout, so their lines can interleave mid-line.
    params = {int(r): int(n) for r, n in re.findall(r"rank (\d+) params (\d+)", peer.stdout)}
    assert sorted(params) == [0, 1] and len(set(params.values())) == 1, peer.stdout
    n_params = params[0]

    out, log = tmp_path / "traces", tmp_path / "kinetrace.log"
    rec = _run(
        [str(built["kinetrace"]), "record", "--iterations", "3", "--start-iteration", "2",
         "--record-shapes", "-o", str(out), "--log", str(log), "--no-summary", "--"]
        + _torchrun(script, ["record"]),
        env, tmp_path,
    )
    assert rec.returncode == 0, rec.stderr
    traces = _traces(out)
    assert len(traces) == 2, (rec.stderr, log.read_text() if log.exists() else "")
    by_rank = {}
    for t in traces:
        doc = _load(t)
        by_rank[doc["distributedInfo"]["rank"]] = doc
    assert sorted(by_rank) == [0, 1]

    for rank, doc in by_rank.items():
        torchs = _load(tmp_path / f"torch-{rank}.json")
        # distributedInfo as torch.profiler writes it for this job (gloo: no nccl_version).
        assert doc["distributedInfo"] == torchs["distributedInfo"], (doc["distributedInfo"],
                                                                     torchs["distributedInfo"])
        assert doc["distributedInfo"]["backend"] == "gloo"
        assert doc["distributedInfo"]["pg_config"][0]["ranks"] == [0, 1]

        # Every c10d collective with its args; DDP's buckets add up to the model's parameters
        # once per step (3 steps).
        colls = [e for e in doc["traceEvents"]
                 if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")]
        assert colls, rank
        for e in colls:
            a = e["args"]
            assert all(k in a for k in COLLECTIVE_ARGS), e
            assert (a["Group size"], a["Process Group Ranks"], a["Process Group Name"],
                    a["Process Group Description"]) == (2, "[0, 1]", "0", "default_pg"), e
        allreduce = [e["args"] for e in colls if e["name"] == "c10d::allreduce_"]
        assert {a["Collective name"] for a in allreduce} == {"allreduce"}
        assert {a["dtype"] for a in allreduce} == {"Float"}
        assert sum(a["In msg nelems"] for a in allreduce) == 3 * n_params, allreduce
        assert all(a["In msg nelems"] == a["Out msg nelems"] for a in allreduce)
        # Their shapes are torch.profiler's too (the list nested: [[[N]], [], …]).
        peer_ops = _op_args(torchs)
        for e in colls:
            key = (e["name"],) + tuple(json.dumps(e["args"].get(k)) for k in SHAPE_ARGS)
            assert key in peer_ops, key

    # HolisticTraceAnalysis 0.5.0 reads the pair: the ranks, the collective args it parses
    # (ParserConfig.ARGS_COMMUNICATION), and its communication/computation overlap runs (no GPU
    # kernels here, so no overlap to measure: NaN per rank).
    from hta.analyzers.communication_analysis import CommunicationAnalysis
    from hta.common.trace import Trace
    from hta.configs.parser_config import ParserConfig

    cfg = ParserConfig.get_default_cfg()
    cfg.add_args(ParserConfig.ARGS_COMMUNICATION)
    t = Trace(trace_dir=str(out), parser_config=cfg)
    t.load_traces(include_last_profiler_step=True)
    assert sorted(t.traces) == [0, 1]
    names = t.symbol_table.get_sym_table()
    for rank, df in t.traces.items():
        rows = df[df["name"].map(lambda i: names[i]) == "c10d::allreduce_"]
        assert len(rows) >= 3, rank
        assert int(rows["in_msg_nelems"].sum()) == 3 * n_params
        assert set(rows["group_size"]) == {2}
        assert set(rows["collective_name"]) == {"allreduce"}
    overlap = CommunicationAnalysis.get_comm_comp_overlap(t, visualize=False)
    assert sorted(overlap["rank"]) == [0, 1]
