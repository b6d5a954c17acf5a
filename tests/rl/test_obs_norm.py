"""--obs-norm: running observation normalisation before the stem (r2ac/rl/model/obs_norm.py)."""

from __future__ import annotations

import pytest
import torch

from r2ac.rl.model.obs_norm import RunningObsNorm


def test_running_stats_are_those_of_everything_seen_and_the_output_is_clipped():
    g = torch.Generator().manual_seed(0)
    a = 3.0 + 2.0 * torch.randn(40, 5, 4, generator=g)  # (T, B, D)
    b = -1.0 + 0.5 * torch.randn(7, 4, generator=g)  # another batch, another shape
    norm = RunningObsNorm(4)
    norm.update(a)
    norm.update(b)
    seen = torch.cat([a.reshape(-1, 4), b])
    torch.testing.assert_close(norm.mean, seen.mean(0), atol=1e-4, rtol=0)
    torch.testing.assert_close(norm.var, seen.var(0, unbiased=False), atol=1e-4, rtol=1e-4)
    assert float(norm.count) == pytest.approx(seen.shape[0], abs=1e-3)
    x = torch.stack([norm.mean, norm.mean + (norm.var + 1e-5).sqrt(), norm.mean + 100.0])
    torch.testing.assert_close(norm(x)[:2], torch.tensor([[0.0] * 4, [1.0] * 4]))
    assert torch.equal(norm(x)[2], torch.full((4,), 5.0))  # clipped at +-5


def test_obs_norm_off_adds_nothing_and_on_feeds_the_stem_the_normalised_obs():
    """Off: the agent's parameters and checkpoint keys are unchanged; on: three buffers more,
    the same parameters, and the core's input is the plain agent's on the normalised obs."""
    from .rl_helpers import agents_with, tiny

    plain, normed = agents_with(tiny(), "obs_norm", (False, True))
    assert plain.obs_norm is None
    assert set(normed.state_dict()) - set(plain.state_dict()) == {
        "obs_norm.mean",
        "obs_norm.var",
        "obs_norm.count",
    }
    assert all(
        torch.equal(p, dict(normed.named_parameters())[n]) for n, p in plain.named_parameters()
    )
    g = torch.Generator().manual_seed(1)
    obs = 4.0 + 3.0 * torch.randn(5, 3, plain.stem.in_features, generator=g)  # (T, B, D)
    normed.obs_norm.update(obs)
    last_reward = torch.randn(5, 3, generator=g)
    x_normed = normed.core_input(obs, last_reward, None)
    x_plain = plain.core_input(normed.obs_norm(obs), last_reward, None)
    torch.testing.assert_close(x_normed, x_plain)
    assert not torch.allclose(x_normed, plain.core_input(obs, last_reward, None))


def test_the_learner_moves_the_stats_once_per_batch_on_its_first_m_steps():
    """A batch's M acted steps (not the bootstrap step M, the next segment's first) move the
    statistics, once per update whatever the epochs and minibatches."""
    from r2ac.rl.learning.actor import Actor
    from r2ac.rl.learning.learner import Learner
    from r2ac.rl.model.build import agent_for_env, make_env

    from .rl_helpers import tiny

    cfg = tiny(obs_norm=True, algorithm="ppo", targets="gae", epochs=2, minibatches=3)
    torch.manual_seed(0)
    env = make_env(cfg, cfg.runtime.num_envs, seed=7)
    agent = agent_for_env(cfg, env)
    actor, learner = Actor(agent, env, seed=7, unroll_length=4), Learner(agent, cfg)
    seg, _ = actor.collect()
    learner.update(seg)
    env.close()
    M, B = seg.actions.shape[:2]
    assert float(agent.obs_norm.count) == pytest.approx(M * B, abs=1e-3)
    acted = seg.obs[:M].reshape(M * B, -1).to(torch.float32)
    torch.testing.assert_close(agent.obs_norm.mean, acted.mean(0), atol=1e-4, rtol=0)
