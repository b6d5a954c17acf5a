"""--device: the learner on one device, the actors on the CPU with their own copy.

Without a GPU the plumbing runs on the CPU (a separate acting agent, segments moved with
their RTRL state to another device); the `gpu` tests train on CUDA and compare the first
update's gradient with the CPU's in float64."""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.cli import main
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.runtimes.base import segment_to, to_cpu
from r2ac.rl.runtimes.serial import SerialRuntime
from r2ac.rtrl.elstm.deferred import CarriedBuffer

from .rl_helpers import tiny

CUDA = torch.cuda.is_available()


class _SeparateAgents(SerialRuntime):
    share_agent_on_cpu = False  # the path a GPU learner takes: actors act on a CPU copy


def _train(runtime_class, **kw):
    runtime = runtime_class(tiny(batch_size=6, total_frames=4 * 6 * 12, **kw))
    runtime.train()
    return runtime


def test_actors_on_a_copy_of_the_learner_train_bit_identically():
    shared, separate = _train(SerialRuntime), _train(_SeparateAgents)
    assert shared.acting_agent is shared.agent
    assert separate.acting_agent is not separate.agent
    a, b = shared.agent.state_dict(), separate.agent.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # weights published after every update
    acting = separate.acting_agent.state_dict()
    assert all(torch.equal(acting[k], b[k]) for k in b)


def _segment(core="elstm-rtrl", dtype=torch.float32, segments=2):
    cfg = tiny(core=core)
    env = make_env(cfg, 3, seed=5)
    torch.manual_seed(0)
    agent = agent_for_env(cfg, env, dtype=dtype)
    actor = Actor(agent, env, seed=5, unroll_length=cfg.runtime.unroll_length)
    for _ in range(segments):  # from the second on, the start state carries sensitivities
        seg, _ = actor.collect()
    return cfg, agent, seg


def test_a_segment_moves_with_its_rtrl_state():
    _, _, seg = _segment()
    assert segment_to(seg, torch.device("cpu")) is seg  # already there: no copy
    moved = segment_to(seg, torch.device("meta"))
    assert type(moved.state) is type(seg.state)
    assert any(isinstance(x, CarriedBuffer) for x in moved.state)  # the sensitivities
    leaves = [t for t in pytree.tree_leaves(moved) if t is not None]
    assert len(leaves) == len([t for t in pytree.tree_leaves(seg) if t is not None]) > 11
    assert all(t.device.type == "meta" for t in leaves)
    assert [t.shape for t in leaves] == [t.shape for t in pytree.tree_leaves(seg) if t is not None]


def test_checkpoint_payloads_are_moved_to_the_cpu_whole():
    tree = {"a": [torch.ones(2, dtype=torch.float64)], "b": 3, "c": (torch.zeros(1), "x")}
    out = to_cpu(tree)
    assert out["b"] == 3 and out["c"][1] == "x" and out["a"][0].dtype == torch.float64
    assert torch.equal(out["a"][0], tree["a"][0]) and out["c"][0].device.type == "cpu"


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA device")
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--device", "cuda", "--out-dir", str(out)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [
        "r2ac train: error: --device cuda: torch sees no CUDA device here; use --device cpu"
    ]
    assert not out.exists()


def test_runtime_ray_without_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    out = tmp_path / "run"
    assert main(["train", "--runtime", "ray", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("r2ac train: error: --runtime ray needs Ray: install the ray extra")
    assert "\n" not in err and not out.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("core", ["elstm-rtrl", "elstm-bptt"])
def test_the_first_update_gradient_on_cuda_equals_the_cpu_one(core):
    cfg, agent, seg = _segment(core, dtype=torch.float64)
    on_gpu = copy.deepcopy(agent).to("cuda")
    Learner(agent, cfg).backward(seg)
    Learner(on_gpu, cfg).backward(segment_to(seg, torch.device("cuda")))
    for (name, p), q in zip(agent.named_parameters(), on_gpu.parameters(), strict=True):
        if p.grad is not None:
            assert (p.grad - q.grad.cpu()).abs().max() < 1e-10, name


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("runtime", ["serial", "parallel"])
def test_training_on_cuda_updates_and_checkpoints_cpu_tensors(tmp_path, runtime):
    from r2ac.rl.harness.trainers import make_trainer
    from r2ac.rl.run.run_dir import RunDir
    from r2ac.runs import checkpoint

    cfg = tiny(device="cuda", runtime=runtime, num_actors=2, total_frames=4 * 3 * 6)
    run = RunDir.create(tmp_path / "run", cfg)
    rt = make_trainer(cfg, run)
    before = {k: v.cpu().clone() for k, v in rt.agent.state_dict().items()}
    assert next(rt.agent.parameters()).is_cuda
    assert rt.train().update == 6
    saved = checkpoint.load(run.checkpoint_path)
    tensors = [t for t in pytree.tree_leaves(saved) if isinstance(t, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert any(not torch.equal(saved["agent"][k], before[k]) for k in before)


def _learner_columns(tmp_path, **kw) -> list[dict[str, float]]:
    from r2ac.rl.harness.trainers import make_trainer
    from r2ac.rl.run.run_dir import RunDir, read_metrics

    cfg = tiny(log_every=1, total_frames=4 * 3 * 6, **kw)
    run = RunDir.create(tmp_path / "run", cfg)
    make_trainer(cfg, run).train()
    return read_metrics(run.metrics_path)


def test_metrics_record_the_learner_update_time_and_no_cuda_peak_on_the_cpu(tmp_path):
    rows = _learner_columns(tmp_path)
    assert len(rows) == 6
    assert all(0.0 < r["learner_ms"] < 60_000 for r in rows)
    assert all(math.isnan(r["learner_cuda_peak_mib"]) for r in rows)  # a blank cell


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_metrics_record_the_learner_cuda_peak_memory(tmp_path):
    rows = _learner_columns(tmp_path, device="cuda")
    peaks = [r["learner_cuda_peak_mib"] for r in rows]
    assert peaks[0] > 0 and peaks == sorted(peaks)  # a running peak never falls
    assert all(r["learner_ms"] > 0 for r in rows)
