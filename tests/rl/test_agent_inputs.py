"""Agent inputs for standard memory benchmarks (previous action, reward scale) and PopArt."""

from dataclasses import replace

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import validate
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner, scaled_rewards_and_discounts, segment_losses
from r2ac.rl.model.agent import Agent, core_input_size
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.model.nets import MLPStem, PolicyValueHeads
from r2ac.rtrl.feedforward import Feedforward

from .rl_helpers import tiny

T, B, OBS, FEATURES, HIDDEN, ACTIONS = 5, 4, 3, 6, 7, 3


def _agent(prev_action=True, reward_scale=1.0, reward_clip=1.0):
    torch.manual_seed(0)
    stem = MLPStem(OBS, hidden=(5,), out_features=FEATURES)
    core = Feedforward(core_input_size(FEATURES, ACTIONS, prev_action), HIDDEN)
    return Agent(
        stem,
        core,
        ACTIONS,
        prev_action=prev_action,
        reward_scale=reward_scale,
        reward_clip=reward_clip,
    )


def _float64_segment(seed: int):
    """A tiny float64 agent's first segment and its outputs on it (no gradients)."""
    cfg = tiny(learning_rate=0.0, prev_action=True)
    env = make_env(cfg, cfg.runtime.num_envs, seed=seed)
    torch.manual_seed(0)
    agent = agent_for_env(cfg, env, dtype=torch.float64)
    seg, _ = Actor(agent, env, seed=seed, unroll_length=cfg.runtime.unroll_length).collect()
    with torch.no_grad():
        logits, values, _ = agent(
            seg.obs, seg.last_reward, seg.reset, seg.state, last_action=seg.last_action
        )
    return cfg, seg, logits, values


def test_previous_action_is_one_hot_and_zero_at_episode_starts():
    agent = _agent()
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(T, B, OBS, generator=g)
    last_reward = torch.randn(T, B, generator=g)
    last_action = torch.randint(0, ACTIONS, (T, B), generator=g)
    reset = torch.rand(T, B, generator=g) < 0.3
    x = agent.core_input(obs, last_reward, reset, last_action)  # (T, B, F + 1 + A)
    assert x.shape == (T, B, FEATURES + 1 + ACTIONS)
    code = x[..., FEATURES + 1 :]
    expected = torch.nn.functional.one_hot(last_action, ACTIONS).float()
    expected[reset] = 0.0
    torch.testing.assert_close(code, expected, rtol=0, atol=0)
    assert reset.any() and (~reset).any()


def test_previous_action_is_required_and_sizes_are_checked():
    agent = _agent()
    obs, last_reward = torch.zeros(T, B, OBS), torch.zeros(T, B)
    with pytest.raises(ValueError, match="last_action"):
        agent.core_input(obs, last_reward, None)
    with pytest.raises(ValueError, match=r"last_action must be \(T, B\)"):
        agent.core_input(obs, last_reward, None, torch.zeros(T, B + 1, dtype=torch.long))
    stem = MLPStem(OBS, hidden=(5,), out_features=FEATURES)
    with pytest.raises(ConfigError, match="previous-action"):
        Agent(stem, Feedforward(FEATURES + 1, HIDDEN), ACTIONS, prev_action=True)


def test_without_the_reward_input_the_reward_cannot_reach_the_policy():
    """--no-last-reward (the mujoco preset): the core input is the features and the
    previous action's code only, so two reward streams give the same outputs; with the
    input (the default) they do not."""
    stem = MLPStem(OBS, hidden=(5,), out_features=FEATURES)
    core = Feedforward(core_input_size(FEATURES, ACTIONS, True, last_reward=False), HIDDEN)
    without = Agent(stem, core, ACTIONS, prev_action=True, feed_last_reward=False)
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(T, B, OBS, generator=g)
    last_action = torch.randint(0, ACTIONS, (T, B), generator=g)
    rewards = [torch.randn(T, B, generator=g) for _ in range(2)]
    x = without.core_input(obs, rewards[0], None, last_action)
    assert x.shape == (T, B, FEATURES + ACTIONS)
    outs = [without(obs, r, None, None, last_action=last_action)[:2] for r in rewards]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    with_reward = _agent()
    outs = [with_reward(obs, r, None, None, last_action=last_action)[0] for r in rewards]
    assert not torch.allclose(outs[0], outs[1])
    with pytest.raises(ConfigError, match=r"input_size 10 != 9 \(stem features 6 \+ 3"):
        Agent(stem, Feedforward(10, HIDDEN), ACTIONS, prev_action=True, feed_last_reward=False)


def test_the_mujoco_preset_builds_an_agent_without_the_reward_input():
    cfg = tiny(last_reward=False)
    env = make_env(cfg, cfg.runtime.num_envs, seed=0)
    agent = agent_for_env(cfg, env)
    assert not agent.feed_last_reward
    assert agent.core.input_size == cfg.model.stem_features + (
        agent.action_space.code_size if cfg.model.prev_action else 0
    )
    from r2ac.rl.presets import PRESETS

    assert not PRESETS["mujoco"].model.last_reward and PRESETS["control"].model.last_reward


def test_reward_input_is_clipped_then_scaled():
    agent = _agent(prev_action=False, reward_scale=20.0)
    last_reward = torch.tensor([[0.02, -0.05, 3.0, -3.0]])  # (1, 4)
    x = agent.core_input(torch.zeros(1, 4, OBS), last_reward, None)
    torch.testing.assert_close(x[0, :, FEATURES], torch.tensor([0.4, -1.0, 20.0, -20.0]))


@pytest.mark.parametrize(
    "clip, expected", [(0.0, [0.002, -0.005, 0.3, -1.63]), (0.2, [0.002, -0.005, 0.02, -0.02])]
)
def test_reward_input_clip_is_an_option(clip, expected):
    """--reward-clip 0 feeds the raw reward (times the scale); another value clips there."""
    agent = _agent(prev_action=False, reward_scale=0.1, reward_clip=clip)
    last_reward = torch.tensor([[0.02, -0.05, 3.0, -16.3]])  # (1, 4)
    x = agent.core_input(torch.zeros(1, 4, OBS), last_reward, None)
    torch.testing.assert_close(x[0, :, FEATURES], torch.tensor(expected))


def test_the_learner_clips_rewards_as_configured():
    """reward_clip 1 (the default) is the old clamp(-1, 1) exactly; 0 leaves rewards raw."""
    cfg, seg, _, _ = _float64_segment(seed=3)
    M, B = seg.rewards.shape
    raw = torch.linspace(-16.3, 2.0, M * B, dtype=torch.float64).reshape(M, B)  # (M, B)
    seg = seg._replace(rewards=raw, truncated=torch.zeros_like(seg.truncated))
    for clip, want in [(1.0, raw.clamp(-1.0, 1.0)), (0.0, raw), (0.3, raw.clamp(-0.3, 0.3))]:
        loss = replace(cfg.loss, reward_clip=clip, reward_scale=0.1)
        rewards, _ = scaled_rewards_and_discounts(seg, loss, torch.float64)  # (M, B)
        assert torch.equal(rewards, want * 0.1)


def test_reward_clip_is_validated():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="reward_clip"):
            validate(tiny(reward_clip=bad))
    assert validate(tiny(reward_clip=0.0)).loss.reward_clip == 0.0


@pytest.mark.parametrize("head_hidden", [0, 9])
def test_popart_update_preserves_every_output(head_hidden):
    torch.manual_seed(0)
    heads = PolicyValueHeads(HIDDEN, ACTIONS, value_norm=True, hidden=head_hidden).double()
    h = torch.randn(50, HIDDEN, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        before = heads(h)[1]
        targets = 3.0 + 2.0 * torch.randn(64, generator=g, dtype=torch.float64)
        heads.update_value_stats(targets, beta=0.2)
        torch.testing.assert_close(heads(h)[1], before, rtol=1e-12, atol=1e-12)
    # the statistics track the targets: mean 3, std 2 (within sampling error)
    assert abs(float(heads.value_mean) - 3.0) < 0.4
    assert abs(float(heads.value_scale()) - 2.0) < 0.4


def test_popart_losses_are_invariant_to_the_reward_scale():
    """V-trace is linear in (rewards, values): rewards and values times s with value_scale s
    give exactly the losses of the unscaled problem (what makes tiny rewards train)."""
    cfg, seg, logits, values = _float64_segment(seed=3)
    plain = segment_losses(logits, values, seg, cfg.loss)
    s = 0.02
    scaled = segment_losses(logits, values * s, seg, replace(cfg.loss, reward_scale=s), s)
    assert plain["pg_loss"].abs() > 1e-3 and plain["baseline_loss"] > 1e-3
    for key in ("pg_loss", "baseline_loss", "entropy_loss"):
        torch.testing.assert_close(scaled[key], plain[key], rtol=1e-12, atol=1e-14)


def test_learner_moves_popart_statistics_and_actor_records_previous_actions():
    cfg = tiny(prev_action=True, popart=True)
    env = make_env(cfg, cfg.runtime.num_envs, seed=5)
    torch.manual_seed(0)
    agent = agent_for_env(cfg, env)
    actor, learner = Actor(agent, env, seed=5, unroll_length=cfg.runtime.unroll_length), None
    learner = Learner(agent, cfg)
    seg, _ = actor.collect()
    metrics = learner.update(seg)
    assert metrics["value_scale"] != 1.0 and metrics["value_mean"] != 0.0
    assert float(agent.heads.value_scale()) == pytest.approx(metrics["value_scale"])
    # last_action[t + 1] is actions[t] unless obs[t + 1] starts an episode (then 0)
    expected = seg.actions.masked_fill(seg.reset[1:], 0)
    assert torch.equal(seg.last_action[1:], expected)
    assert torch.equal(seg.last_action[0], torch.zeros_like(seg.last_action[0]))


def test_progress_lines_when_not_on_a_terminal():
    import io
    import time as _time

    from r2ac.rl.run.tracker import ProgressLines

    out = io.StringIO()
    lines = ProgressLines(total=1000, initial=0, every_s=0.05, stream=out)
    lines.set_postfix(ret="0.250")
    lines.update(100)  # too soon for a line
    assert out.getvalue() == ""
    _time.sleep(0.06)
    lines.update(100)
    lines.update(800)  # the last frames always print
    printed = out.getvalue().splitlines()
    assert len(printed) == 2
    assert (
        printed[0].startswith("[progress] 200/1000 frames (20%)") and "return 0.250" in printed[0]
    )
    assert printed[1].startswith("[progress] 1000/1000 frames (100%)")


def test_sigma_floor_bounds_the_advantage_scale_only():
    """--popart-sigma-floor: advantages / max(sigma, floor), the critic still / sigma; a
    floor below sigma changes nothing; without PopArt's advantages it is refused."""
    cfg, seg, logits, values = _float64_segment(seed=4)
    sigma = torch.tensor(2.0)
    plain = segment_losses(logits, values, seg, cfg.loss, sigma)
    floored = segment_losses(logits, values, seg, replace(cfg.loss, popart_sigma_floor=8.0), sigma)
    below = segment_losses(logits, values, seg, replace(cfg.loss, popart_sigma_floor=1.5), sigma)
    assert plain["pg_loss"].abs() > 1e-3
    torch.testing.assert_close(floored["pg_loss"], plain["pg_loss"] / 4.0, rtol=1e-12, atol=0)
    assert floored["baseline_loss"] == plain["baseline_loss"]
    assert floored["entropy_loss"] == plain["entropy_loss"]
    for key in ("pg_loss", "baseline_loss", "entropy_loss"):
        assert below[key] == plain[key]
    from r2ac.rl.config import validate

    validate(tiny(popart=True, popart_sigma_floor=10.0))
    for bad in (tiny(popart_sigma_floor=10.0),):
        with pytest.raises(ConfigError, match="popart-sigma-floor"):
            validate(bad)
    with pytest.raises(ConfigError, match="popart_sigma_floor"):
        validate(tiny(popart=True, popart_sigma_floor=-1.0))
