"""With lr 0, the learner's gradient for Box (diagonal Gaussian) and MultiDiscrete agents on
an RTRL core equals full BPTT over each stream's history (float64, < 1e-10), the previous
action fed back; IMPALA's single step and PPO's passes. Modelled on test_learner_exact.py."""

from __future__ import annotations

import pytest
import torch

from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner, segment_losses
from r2ac.rl.model.build import agent_for_env, make_env

from .rl_helpers import run_learner_lr0, tiny

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
pytest.importorskip("gymnasium")

M, B, K = 4, 3, 5
ENVS = {  # 6-step episodes: truncations inside segments; MineSweeper: terminations
    "box": ("gym/Pendulum-v1", ("max_episode_steps=6",)),
    "box, no reward input": ("gym/Pendulum-v1", ("max_episode_steps=6",)),  # the mujoco preset
    "multi_discrete": ("gym/popgym-MineSweeperEasy-v0", ()),
}


def _run_learner(cfg):
    return run_learner_lr0(cfg, M, B, K)


def _full_bptt(cfg, agent, segments):
    """A BPTT twin unrolled once over the whole history; the same per-segment losses."""
    ref_cfg = cfg.updated(core="elstm-bptt")
    ref = agent_for_env(ref_cfg, make_env(ref_cfg, B, seed=7), dtype=torch.float64)
    ref.load_state_dict(agent.state_dict())

    def cat(name):
        return torch.cat(
            [getattr(s, name)[:M] for s in segments] + [getattr(segments[-1], name)[M:]]
        )

    logits, values, _ = ref(
        cat("obs"), cat("last_reward"), cat("reset"), ref.initial_state(B),
        last_action=cat("last_action"),
    )  # fmt: skip
    space = ref.action_space
    loss = sum(
        segment_losses(
            logits[k * M : k * M + M + 1], values[k * M : k * M + M + 1], s, cfg.loss, space=space
        )["loss"]
        for k, s in enumerate(segments)
    )
    loss.backward()
    return {n: p.grad for n, p in ref.named_parameters()}


@pytest.mark.parametrize("case", sorted(ENVS))
def test_rtrl_learner_gradient_equals_full_bptt(case):
    if case == "multi_discrete":
        pytest.importorskip("popgym")
    env, options = ENVS[case]
    cfg = tiny(
        env=env, env_options=options, core="elstm-rtrl", learning_rate=0.0, grad_clip=1e12,
        unroll_length=M, num_envs=B, batch_size=B, prev_action=True,
        last_reward="no reward input" not in case,
    )  # fmt: skip
    agent, segments, grads = _run_learner(cfg)
    assert torch.stack([s.reset[1:M] for s in segments]).sum() > 0  # episode ends inside
    full = _full_bptt(cfg, agent, segments)
    names = [n for n in full if n.startswith("core.")] + ["heads.policy.weight"]
    names += ["heads.log_std"] if case.startswith("box") else []
    err = max(float((grads[n] - full[n]).norm() / full[n].norm()) for n in names)
    print(f"{case}: max rel error vs full BPTT {err:.2e}")
    assert err < 1e-10, err


def test_box_ppo_runs_and_moves_the_log_std():
    """PPO's passes on a Box agent: finite losses, the log-std parameter is trained."""
    env, options = ENVS["box"]
    cfg = tiny(
        env=env, env_options=options, core="elstm-rtrl", unroll_length=M, num_envs=B,
        batch_size=B, algorithm="ppo", epochs=2, minibatches=3, learning_rate=1e-2,
    )  # fmt: skip
    torch.manual_seed(0)
    agent = agent_for_env(cfg, make_env(cfg, B, seed=1))
    actor, learner = Actor(agent, make_env(cfg, B, seed=1), 1, M), Learner(agent, cfg)
    before = agent.heads.log_std.detach().clone()
    for _ in range(3):
        metrics = learner.update(actor.collect()[0])
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    assert not torch.equal(agent.heads.log_std.detach(), before)
