"""r2ac.rl.runtimes.learner_carry: an actor that carries only the light state, and a learner that
carries the sensitivities, give the same start states (float64, 1e-10) and gradients as an
actor that carries everything, over segments with episode resets inside them; restarts and
gaps start from zero sensitivities."""

from __future__ import annotations

import logging

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import learner_carries, validate
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.runtimes.learner_carry import LearnerCarry

from .rl_helpers import tiny

SENSITIVITY_CORES = ["elstm-rtrl", "elstm-snap1", "felstm-snap1", "elman-rtrl", "fwp-rtrl",
                     "rtu-rtrl", "lru-rtrl", "mingru-rtrl"]  # fmt: skip


def _actors(core: str, segments: int):
    """Segments of the same streams, collected by a full actor and by a light one."""
    cfg = tiny(core=core, env_options=("delay=2",), num_envs=4, unroll_length=5)
    torch.manual_seed(0)
    env_full, env_light = make_env(cfg, 4, seed=3), make_env(cfg, 4, seed=3)
    agent = agent_for_env(cfg, env_full, torch.float64)
    full = Actor(agent, env_full, seed=3, unroll_length=5)
    light = Actor(agent, env_light, seed=3, unroll_length=5, sensitivities=False)
    pairs = [(full.collect()[0], light.collect()[0]) for _ in range(segments)]
    return cfg, agent, pairs


@pytest.mark.parametrize("core", SENSITIVITY_CORES)
def test_learner_carried_start_states_equal_the_actors(core):
    cfg, agent, pairs = _actors(core, segments=4)
    assert any(bool(light.reset[1:].any()) for _, light in pairs)  # resets inside segments
    carry = LearnerCarry(agent)
    for seq, (full_seg, light_seg) in enumerate(pairs, start=1):
        assert light_seg.state.sens is None
        done = carry.complete(actor=0, epoch=0, seq=seq, seg=light_seg)
        assert torch.equal(done.state[0], full_seg.state[0])  # the actor's hidden state
        ref = [t for _, t, _ in agent.core.state_tensors(full_seg.state, 4)]
        got = [t for _, t, _ in agent.core.state_tensors(done.state, 4)]
        assert len(got) == len(ref) > 1
        for a, b in zip(got, ref):
            assert (a - b).abs().max() < 1e-10
        if seq > 1:
            assert max(float(t.abs().max()) for t in ref[1:]) > 1e-3  # carried, not zero
    assert carry.gaps == 0


def test_learner_carried_gradient_equals_the_actors():
    cfg, agent, pairs = _actors("elstm-rtrl", segments=3)
    carry, learner = LearnerCarry(agent), Learner(agent, cfg)
    for seq, (full_seg, light_seg) in enumerate(pairs, start=1):
        done = carry.complete(0, 0, seq, light_seg)
        grads = []
        for seg in (full_seg, done):
            agent.zero_grad()
            learner.backward(seg)
            grads.append({n: p.grad.clone() for n, p in agent.named_parameters()})
        for name, g in grads[0].items():
            assert (grads[1][name] - g).abs().max() < 1e-10, (seq, name)


def test_a_restart_or_a_gap_starts_from_zero_sensitivities(caplog):
    cfg, agent, pairs = _actors("elstm-rtrl", segments=3)
    carry = LearnerCarry(agent)
    carry.complete(0, 0, 1, pairs[0][1])
    with caplog.at_level(logging.WARNING):
        gap = carry.complete(0, 0, 3, pairs[2][1])  # segment 2 never came
    assert carry.gaps == 1 and "arrived after segment 1" in caplog.text
    assert float(gap.state.sens.FZ.abs().max()) == 0.0
    carry.complete(1, 0, 1, pairs[0][1])
    second = carry.complete(1, 0, 2, pairs[1][1])
    assert float(second.state.sens.FZ.abs().max()) > 0
    restarted = carry.complete(1, 1, 1, pairs[0][1])  # a new epoch begins at seq 1
    assert float(restarted.state.sens.FZ.abs().max()) == 0.0 and carry.gaps == 1
    stale = carry.complete(1, 2, 2, pairs[1][1])  # epoch 2's first segment was never seen
    assert carry.gaps == 2 and float(stale.state.sens.FZ.abs().max()) == 0.0


def test_cores_without_sensitivities_pass_through():
    cfg, agent, pairs = _actors("elstm-bptt", segments=1)
    carry = LearnerCarry(agent)
    assert not carry.active
    assert carry.complete(0, 0, 1, pairs[0][1]) is pairs[0][1]


def test_the_option_resolves_per_runtime_and_refuses_the_others():
    assert learner_carries(tiny(runtime="ray")) and not learner_carries(tiny())
    assert not learner_carries(tiny(runtime="ray", sensitivity_carry="actor"))
    with pytest.raises(ConfigError, match="needs --runtime parallel or ray"):
        validate(tiny(sensitivity_carry="learner"))
    with pytest.raises(ConfigError, match="sensitivity_carry='both'"):
        validate(tiny(runtime="ray", sensitivity_carry="both"))
