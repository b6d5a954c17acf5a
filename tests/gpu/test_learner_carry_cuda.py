"""The learner's carry of the sensitivities (r2ac/rl/runtimes/learner_carry.py) on a CUDA learner:
light segments collected by a CPU actor, completed and carried by a learner agent on CUDA,
give the start states a CPU actor that carries everything gives (every sensitivity core,
resets inside segments), to the GPU tests' tolerances."""

from __future__ import annotations

import copy

import pytest
import torch

from r2ac.rl.learning.actor import Actor
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.runtimes.learner_carry import LearnerCarry

from ..rl.rl_helpers import tiny
from ..rl.test_learner_carry import SENSITIVITY_CORES
from .common import F32, F64, TOLERANCE, needs_cuda, rel_error

pytestmark = needs_cuda


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("core", SENSITIVITY_CORES)
def test_the_learner_carry_on_cuda_equals_the_cpu_actors(core, dtype):
    cfg = tiny(core=core, env_options=("delay=2",), num_envs=4, unroll_length=5)
    torch.manual_seed(0)
    env_full, env_light = make_env(cfg, 4, seed=3), make_env(cfg, 4, seed=3)
    agent = agent_for_env(cfg, env_full, dtype)
    full = Actor(agent, env_full, seed=3, unroll_length=5)
    light = Actor(agent, env_light, seed=3, unroll_length=5, sensitivities=False)
    carry = LearnerCarry(copy.deepcopy(agent).cuda())
    for seq in range(1, 5):
        want, got = full.collect()[0], light.collect()[0]
        done = carry.complete(actor=0, epoch=0, seq=seq, seg=got)
        assert done.obs.is_cuda
        ref = [t for _, t, _ in agent.core.state_tensors(want.state, 4)]
        out = [t for _, t, _ in agent.core.state_tensors(done.state, 4)]
        assert len(out) == len(ref) > 1
        for a, b in zip(out, ref):
            assert rel_error(a, b) < TOLERANCE[dtype], (core, seq)
