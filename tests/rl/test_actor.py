"""Actor segments: layout, reset / last-reward / truncation bookkeeping, carried state."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.rl.learning.actor import Actor, cat_segments
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rtrl import core_names, make_core

from .rl_helpers import tiny

M, B = 7, 4


def _actor(cfg, seed=3, dtype=torch.float64):
    torch.manual_seed(0)
    env = make_env(cfg, B, seed)
    agent = agent_for_env(cfg, env, dtype=dtype)
    return Actor(agent, env, seed, M), agent, env


CARRYING = [n for n in core_names() if make_core(n, 2, 2).carries_sensitivities]


def test_segment_layout_and_episode_bookkeeping():
    cfg = tiny(env="builtin/watermaze", env_options=("size=3", "episode_steps=5"))
    actor, agent, env = _actor(cfg)
    seg, log = actor.collect()
    A = env.num_actions
    assert seg.obs.shape == (M + 1, B, 7) and seg.last_reward.shape == (M + 1, B)
    assert seg.reset.shape == (M + 1, B) and seg.actions.shape == (M, B)
    assert seg.behaviour_logits.shape == (M, B, A) and seg.final_values.shape == (M, B)
    assert seg.reset[0].all()  # the first observation of every stream starts an episode
    done = seg.terminated | seg.truncated
    assert torch.equal(seg.reset[1:], done)
    assert seg.truncated[4].all() and not seg.truncated[:4].any()  # time limit after 5 steps
    expect_last = torch.where(done, torch.zeros_like(seg.rewards), seg.rewards)
    assert torch.equal(seg.last_reward[1:], expect_last) and (seg.last_reward[0] == 0).all()
    # final_values: V(final_obs) from the state after the truncation step; 0 elsewhere.
    assert (seg.final_values[~seg.truncated] == 0).all()
    assert len(log.returns) == B and all(length == 5 for length in log.lengths)
    # The next segment continues where this one stopped.
    nxt, _ = actor.collect()
    assert torch.equal(nxt.obs[0], seg.obs[M]) and torch.equal(nxt.reset[0], seg.reset[M])
    assert torch.equal(nxt.last_reward[0], seg.last_reward[M])


def test_final_values_match_a_manual_unroll():
    """V(final_obs) of a truncated episode from the state after its last step."""
    cfg = tiny(
        env="builtin/watermaze", env_options=("size=3", "episode_steps=5"), core="elstm-bptt"
    )
    actor, agent, env = _actor(cfg)
    infos, step = [], env.step
    env.step = lambda actions: infos.append(step(actions)) or infos[-1]
    state0 = actor.state
    seg, _ = actor.collect()
    final_obs = torch.from_numpy(infos[4].info["final_obs"])  # (B, 7) truncation at t = 4
    with torch.no_grad():
        _, _, state = agent(seg.obs[:5], seg.last_reward[:5], seg.reset[:5], state0)
        _, v, _ = agent(final_obs[None], seg.rewards[4][None], None, state)
    assert torch.allclose(v[0], seg.final_values[4], atol=1e-12)
    assert not torch.equal(final_obs, seg.obs[5])  # the next obs starts a new episode


def test_rtrl_actor_carries_sensitivities_and_matches_a_per_step_carry():
    cfg = tiny(env="builtin/delayed-cue", env_options=("delay=4",))
    actor, agent, env = _actor(cfg)
    seg1, _ = actor.collect()
    seg2, _ = actor.collect()
    assert seg1.state.sens is not None and seg2.state.sens is not None
    assert seg2.state.sens.FZ.abs().sum() > 0
    # Per-step carry with the full state over the recorded inputs gives the same state.
    state = seg1.state
    with torch.no_grad():
        for t in range(M):
            _, _, state = agent(
                seg1.obs[t : t + 1], seg1.last_reward[t : t + 1], seg1.reset[t : t + 1], state
            )
    assert torch.allclose(state.c, seg2.state.c, atol=1e-12)
    assert torch.allclose(state.sens.FZ, seg2.state.sens.FZ, atol=1e-12)
    assert torch.allclose(state.sens.wb, seg2.state.sens.wb, atol=1e-12)
    both = cat_segments([seg1, seg2])
    assert both.obs.shape[1] == 2 * B and both.state.c.shape[0] == 2 * B


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("core", CARRYING)
def test_carry_from_traces_equals_the_segment_recompute(core, dtype, tol):
    """The actor's carried state (act + carry_traces) against the segment-wise recompute
    (advance_state from the start state over the recorded core inputs), chained separately
    over 6 segments with episode ends inside them: equal to `tol` relative (the largest
    difference over the largest entry, per state tensor)."""
    cfg = tiny(env="builtin/watermaze", env_options=("size=3", "episode_steps=5"), core=core)
    actor, agent, _ = _actor(cfg, dtype=dtype)
    recomputed, resets = actor.state, 0
    for _ in range(6):
        seg, _ = actor.collect()
        resets += int(seg.reset[1:M].sum())
        inputs = (seg.obs[:M], seg.last_reward[:M], seg.reset[:M], seg.last_action[:M])
        with torch.no_grad():
            x = agent.core_input(*inputs)
        recomputed = agent.core.advance_state(x, recomputed, reset=seg.reset[:M])
        got, want = pytree.tree_leaves(actor.state), pytree.tree_leaves(recomputed)
        assert len(got) == len(want) and all(t is not None for t in got)
        for a, b in zip(got, want):
            assert a.dtype == dtype
            err = float((a - b).abs().max() / b.abs().max())
            assert err < tol, (core, err)
    assert resets > 0  # episodes ended inside segments


def test_a_deferred_carry_is_refused_where_it_cannot_run():
    """`defer_carry` needs carry slots (where the carry writes) and a core whose carry reads
    only its traces and the weights kept with them: otherwise one clear error."""
    cfg = tiny(core="gru-bptt")
    env = make_env(cfg, 2, 0)
    agent = agent_for_env(cfg, env)
    with pytest.raises(ValueError, match="defers_carry is False"):
        Actor(agent, env, 0, 4, carry_slots=(agent.initial_state(2),), defer_carry=True)
    elstm = tiny(core="elstm-rtrl")
    with pytest.raises(ValueError, match="defer_carry needs carry slots"):
        Actor(agent_for_env(elstm, env), env, 0, 4, defer_carry=True)
