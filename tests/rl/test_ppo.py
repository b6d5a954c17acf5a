"""The pieces of the multi-pass learner against slow references (float64), and its config
errors: GAE, the PPO-clip losses, the stream minibatches, the copied start state."""

from __future__ import annotations

import math

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import validate
from r2ac.rl.learning.ppo import (
    BatchTargets,
    gae,
    ppo_losses,
    select_segment,
    stream_minibatches,
)

from .rl_helpers import tiny

T, B, A = 5, 3, 4


def _slow_gae(rewards, discounts, values, bootstrap, lam):
    """A_t = sum_k (prod_{j<k} gamma_{t+j} lambda) delta_{t+k}, element by element."""
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            weight, total = 1.0, 0.0
            for k in range(t, T):
                v_next = bootstrap[b] if k == T - 1 else values[k + 1, b]
                delta = rewards[k, b] + discounts[k, b] * v_next - values[k, b]
                total += weight * float(delta)
                weight *= float(discounts[k, b]) * lam
            adv[t, b] = total
    return adv


def test_gae_equals_a_slow_loop_with_episode_ends():
    g = torch.Generator().manual_seed(0)
    rewards, values = (
        torch.randn(T, B, generator=g, dtype=torch.float64),
        torch.randn(T, B, generator=g, dtype=torch.float64),
    )
    discounts = torch.full((T, B), 0.9, dtype=torch.float64)
    discounts[1, 0] = discounts[3, 2] = 0.0  # episode ends
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    adv, ret = gae(rewards, discounts, values, bootstrap, 0.8)
    slow = _slow_gae(rewards, discounts, values, bootstrap, 0.8)
    torch.testing.assert_close(adv, slow, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, adv + values, rtol=0, atol=0)
    # lambda 0: one-step TD errors
    adv0, _ = gae(rewards, discounts, values, bootstrap, 0.0)
    v_next = torch.cat([values[1:], bootstrap[None]])
    torch.testing.assert_close(adv0, rewards + discounts * v_next - values, rtol=0, atol=1e-15)


def _slow_ppo(logits, values, actions, tg, clip, vclip, bcost, ecost):
    """The PPO-clip loss step by step with python floats."""
    n, adv = T * B, tg.advantages.flatten().tolist()
    mean = sum(adv) / n
    std = math.sqrt(sum((a - mean) ** 2 for a in adv) / n)
    policy = value = neg_entropy = 0.0
    for t in range(T):
        for b in range(B):
            p = torch.softmax(logits[t, b], -1).tolist()
            a = (float(tg.advantages[t, b]) - mean) / (std + 1e-8)
            ratio = p[int(actions[t, b])] / math.exp(float(tg.behaviour_log_pi[t, b]))
            policy -= min(ratio * a, min(max(ratio, 1 - clip), 1 + clip) * a) / n
            v, r, old = float(values[t, b]), float(tg.returns[t, b]), float(tg.old_values[t, b])
            v_clipped = old + min(max(v - old, -vclip), vclip)
            value += 0.5 * max((v - r) ** 2, (v_clipped - r) ** 2) / n
            neg_entropy += sum(q * math.log(q) for q in p) / n
    return policy + bcost * value + ecost * neg_entropy


def test_ppo_losses_equal_a_slow_closed_form():
    g = torch.Generator().manual_seed(1)
    f64 = {"dtype": torch.float64, "generator": g}
    logits, values = torch.randn(T, B, A, **f64), torch.randn(T, B, **f64)
    actions = torch.randint(0, A, (T, B), generator=g)
    behaviour = torch.log_softmax(logits + 0.5 * torch.randn(T, B, A, **f64), -1)
    behaviour_log_pi = behaviour.gather(-1, actions[..., None]).squeeze(-1)
    tg = BatchTargets(
        torch.randn(T, B, **f64), torch.randn(T, B, **f64), values + 0.3 * torch.randn(T, B, **f64),
        behaviour_log_pi,
    )  # fmt: skip
    losses = ppo_losses(logits, values, actions, tg, 0.1, 0.2, 0.5, 0.01)
    slow = _slow_ppo(logits, values, actions, tg, 0.1, 0.2, 0.5, 0.01)
    assert 0 < float(losses["clip_fraction"]) < 1  # both branches of the clip are exercised
    assert abs(float(losses["loss"]) - slow) < 1e-12, (float(losses["loss"]), slow)
    parts = sum(float(losses[k]) for k in ("pg_loss", "baseline_loss", "entropy_loss"))
    assert abs(parts - slow) < 1e-12


def test_stream_minibatches_are_blocks_in_a_deterministic_random_order():
    parts = stream_minibatches(12, 3, torch.Generator().manual_seed(5))
    again = stream_minibatches(12, 3, torch.Generator().manual_seed(5))
    assert parts == again and len(parts) == 3
    assert sorted((p.start, p.stop) for p in parts) == [(0, 4), (4, 8), (8, 12)]
    orders = {
        tuple(p.start for p in stream_minibatches(12, 3, g)) for g in [torch.Generator()] * 20
    }
    assert len(orders) > 1  # a fresh order per call (per pass)
    with pytest.raises(ValueError, match="12 streams do not split into 5"):
        stream_minibatches(12, 5, None)


def _segment_with_state():
    from r2ac.rl.learning.actor import Actor
    from r2ac.rl.model.build import agent_for_env, make_env

    cfg = tiny(num_envs=4, batch_size=4)
    env = make_env(cfg, 4, seed=0)
    agent = agent_for_env(cfg, env, dtype=torch.float64)
    seg, _ = Actor(agent, env, seed=0, unroll_length=4).collect()
    assert any(t.numel() for t in torch.utils._pytree.tree_leaves(seg.state))
    return seg


def test_select_segment_of_a_block_is_a_view_of_the_start_state():
    seg = _segment_with_state()
    sub = select_segment(seg, slice(2, 4))
    assert torch.equal(sub.obs, seg.obs[:, 2:4]) and sub.actions.shape == (4, 2)
    for whole, part in zip(
        torch.utils._pytree.tree_leaves(seg.state), torch.utils._pytree.tree_leaves(sub.state)
    ):
        assert torch.equal(part, whole[2:4])
        assert part.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()


def test_select_segment_of_an_index_tensor_copies_the_start_state():
    seg = _segment_with_state()
    sub = select_segment(seg, torch.tensor([2, 0]))
    for whole, part in zip(
        torch.utils._pytree.tree_leaves(seg.state), torch.utils._pytree.tree_leaves(sub.state)
    ):
        assert torch.equal(part, whole[[2, 0]]) and part.data_ptr() != whole.data_ptr()


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"epochs": 0}, "--epochs (0)"),
        ({"minibatches": 0}, "--minibatches (0)"),
        ({"batch_size": 6, "minibatches": 4}, "must divide into --minibatches (4)"),
        ({"clip_coef": 0.1}, "--clip-coef: PPO options"),
        ({"targets": "gae", "gae_lambda": 0.9}, "--targets, --gae-lambda: PPO options"),
        ({"value_clip": 0.2}, "--value-clip: PPO options"),
        ({"algorithm": "ppo", "gae_lambda": 1.5}, "gae_lambda=1.5"),
        ({"optimizer": "adam", "adam_eps": 0.0}, "adam_eps=0.0"),
        (
            {"rtrl_start_correction": True, "epochs": 2, "core": "gru-bptt"},
            "elstm-rtrl or elstm-snap1, not gru-bptt",
        ),
        (
            {"rtrl_start_correction": True, "epochs": 2, "core": "elstm-bptt"},
            "elstm-rtrl or elstm-snap1, not elstm-bptt",
        ),
        (
            {"rtrl_start_correction": True, "core": "elstm-rtrl"},
            "needs --algorithm ppo or --epochs / --minibatches above 1",
        ),
        (
            {"algorithm": "ppo", "popart": True, "popart_sigma_floor": 15.0},
            "--popart-sigma-floor: IMPALA's options",
        ),
    ],
)
def test_bad_learner_options_are_one_line_errors(kw, words):
    with pytest.raises(ConfigError) as err:
        validate(tiny(**{"num_envs": 3, "batch_size": 6, **kw}))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_good_learner_options_validate():
    validate(tiny(algorithm="ppo", targets="gae", epochs=2, minibatches=3, optimizer="adam"))
    validate(tiny(epochs=3))  # IMPALA with several passes
    validate(tiny(core="elstm-snap1", algorithm="ppo", rtrl_start_correction=True))
