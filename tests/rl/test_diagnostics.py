"""r2ac/rl/harness/diagnostics.py: the gradient split and the Monte-Carlo returns, and the script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from r2ac.rl.harness.diagnostics import (
    gradient_split,
    monte_carlo_returns,
    parameter_groups,
    steps_to_end,
    without_history,
)
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import actor_seed, agent_for_env, make_env
from tests.rl.rl_helpers import tiny

ROOT = Path(__file__).resolve().parents[2]


def _third_segment(core: str, dtype=torch.float64, **kw):
    """An agent, its learner and an actor's third segment (sensitivities carried over two)."""
    cfg = tiny(core=core, **kw)
    env = make_env(cfg, cfg.runtime.num_envs, actor_seed(cfg.run.seed, 0))
    torch.manual_seed(0)
    agent = agent_for_env(cfg, env, dtype)
    actor = Actor(agent, env, actor_seed(cfg.run.seed, 0), cfg.runtime.unroll_length)
    for _ in range(2):
        actor.collect()
    seg, _ = actor.collect()
    env.close()
    return agent, Learner(agent, cfg), seg


def test_monte_carlo_returns_and_steps_to_end_by_hand():
    rewards = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]])  # (T=4, B=2)
    terminated = torch.tensor([[False, False], [True, False], [False, False], [False, True]])
    returns, complete = monte_carlo_returns(rewards, terminated, 0.5)
    # stream 0: episode ends at t=1 (G1 = 2, G0 = 1 + 0.5 * 2); t=2, 3 never end in the window
    # stream 1: ends at t=3: G3 = 1, G2 = 1.5, G1 = 1.75, G0 = 0.875
    assert returns[:2, 0].tolist() == [2.0, 2.0]
    assert returns[:, 1].tolist() == [0.875, 1.75, 1.5, 1.0]
    assert complete[:, 0].tolist() == [True, True, False, False]
    assert complete[:, 1].all()
    assert steps_to_end(terminated).tolist() == [[1, 3], [0, 2], [-1, 1], [-1, 0]]
    with pytest.raises(ValueError, match=r"\(T, B\)"):
        monte_carlo_returns(rewards[0], terminated[0], 0.5)


def test_in_segment_part_is_the_truncated_gradient():
    """Zeroed start sensitivities give exactly TBPTT over the segment: the eLSTM's rtrl
    in-segment gradient equals its bptt gradient with the same weights, float64 1e-12;
    the history part is not zero, and a bptt core has none."""
    agent, learner, seg = _third_segment("elstm-rtrl")
    split = gradient_split(learner, seg)
    full, inseg, hist = split["all"]["total"].tolist()
    assert hist > 1e-3 * full  # sensitivities carried over two segments

    bptt_agent, bptt_learner, _ = _third_segment("elstm-bptt")
    bptt_agent.load_state_dict(agent.state_dict())
    light = seg._replace(state=agent.core.light_state(seg.state))
    for p in bptt_agent.parameters():
        p.grad = None
    bptt_learner.backward(light)
    for p in agent.parameters():
        p.grad = None
    learner.backward(seg._replace(state=without_history(seg.state)))
    for (name, p), q in zip(agent.named_parameters(), bptt_agent.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-12), name
    assert abs(bptt_norm(bptt_agent) - inseg) < 1e-10 * inseg

    bptt_split = gradient_split(bptt_learner, light)
    assert bptt_split["all"]["total"][2] == 0.0


def bptt_norm(agent) -> float:
    return float(torch.cat([p.grad.flatten() for p in agent.parameters()]).norm())


def test_split_groups_and_terms():
    """Per group: only the core's recurrent parameters have a history part. Per term: each
    loss term is the one named (a zero cost zeroes exactly its term) and they add up."""
    agent, learner, seg = _third_segment("elstm-rtrl")
    split = gradient_split(learner, seg)
    assert set(split["all"]) == set(parameter_groups(agent)) | {"total"}
    for group in ("stem", "heads", "core.O", "core.W_o", "core.b_o"):
        assert split["all"][group][2] == 0.0, group
    for group in ("core.F", "core.Z", "core.b_f", "core.b_z"):
        assert split["all"][group][2] > 0.0, group
    for term in ("policy", "critic", "entropy"):
        assert split[term]["total"][0] > 1e-6, term
    for cost, term in (("entropy_cost", "entropy"), ("baseline_cost", "critic")):
        _, zeroed, seg0 = _third_segment("elstm-rtrl", **{cost: 0.0})
        terms = gradient_split(zeroed, seg0)
        assert terms[term]["total"][0] == 0.0, term
        others = [t for t in ("policy", "critic", "entropy") if t != term]
        assert all(terms[t]["total"][0] > 1e-6 for t in others)
        assert abs(terms["all"]["total"][0] - gradient_norm_of(zeroed, seg0)) < 1e-10


def gradient_norm_of(learner, seg) -> float:
    for p in learner.agent.parameters():
        p.grad = None
    learner.backward(seg)
    return bptt_norm(learner.agent)


def test_without_history_leaves_light_states_alone():
    agent, _, seg = _third_segment("elstm-rtrl")
    zeroed = without_history(seg.state)
    assert all(float(t.abs().sum()) == 0.0 for t in zeroed.sens)
    assert torch.equal(zeroed.c, seg.state.c)
    light = agent.core.light_state(seg.state)
    assert without_history(light) is light


def test_diagnose_command_on_a_checkpoint(tmp_path):
    """`r2ac diagnose` reads a real run's checkpoint and prints both reports (a tiny run)."""
    out = tmp_path / "run"
    train = [
        sys.executable,
        "-m",
        "r2ac.cli",
        "train",
        "--env",
        "builtin/delayed-cue",
        "--env-options",
        "delay=3",
        "--hidden-size",
        "8",
        "--num-envs",
        "4",
        "--batch-size",
        "4",
        "--unroll-length",
        "4",
        "--total-frames",
        "320",
        "--eval-episodes",
        "2",
        "--eval-sets",
        "1",
        "--out-dir",
        str(out),
        "--no-progress",
    ]
    subprocess.run(train, check=True, cwd=ROOT, capture_output=True, timeout=300)
    diagnose = [sys.executable, "-m", "r2ac.cli", "diagnose"]
    result = subprocess.run(
        [*diagnose, str(out), "--batches", "30", "--grad-batches", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "mean value" in result.stdout and "core.b_z" in result.stdout
    assert "policy" in result.stdout.split("by loss term")[1]
    missing = subprocess.run(
        [*diagnose, str(tmp_path / "nowhere")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "not a run directory" in missing.stderr
