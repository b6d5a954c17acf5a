"""The R2AC learner's gradient on CUDA equals the CPU's for elstm-rtrl: segments collected by
a CPU actor (resets and time-limit truncations inside them, each starting from a state with
carried sensitivities), each given to a learner on either device, gradients summed over
several segments (tests/rl/test_learner_exact.py builds them the same way)."""

from __future__ import annotations

import copy

import pytest
import torch

from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rtrl.elstm import gpu_carry

from ..rl.rl_helpers import tiny
from .common import F32, F64, TOLERANCE, needs_cuda, rel_error, to_device

pytestmark = needs_cuda

M, B, K = 4, 3, 5
ENVS = {
    "terminations": ("builtin/delayed-cue", ("delay=3",)),
    "truncations": ("builtin/watermaze", ("size=3", "episode_steps=6")),
}


def _segments(cfg, dtype):
    torch.manual_seed(0)
    env = make_env(cfg, B, seed=7)
    agent = agent_for_env(cfg, env, dtype=dtype)
    actor = Actor(agent, env, seed=7, unroll_length=M)
    return agent, [actor.collect()[0] for _ in range(K)]


def _summed_gradients(agent, cfg, segments, device):
    learner = Learner(agent, cfg)
    agent.zero_grad(set_to_none=True)
    for seg in segments:
        learner.backward(to_device(seg, device))  # gradients accumulate
    return {name: p.grad for name, p in agent.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", sorted(ENVS))
def test_the_rtrl_learner_gradient_on_cuda_equals_the_cpu(case, dtype):
    env, options = ENVS[case]
    cfg = tiny(
        env=env, env_options=options, core="elstm-rtrl", learning_rate=0.0, grad_clip=1e12,
        unroll_length=M, num_envs=B, batch_size=B,
    )  # fmt: skip
    agent, segments = _segments(cfg, dtype)
    assert torch.stack([s.reset[1:M] for s in segments]).any()  # episodes end inside
    on_gpu = copy.deepcopy(agent).to("cuda")
    want = _summed_gradients(agent, cfg, segments, "cpu")
    got = _summed_gradients(on_gpu, cfg, segments, "cuda")
    assert got.keys() == want.keys() and any(k.startswith("core.") for k in want)
    errors = {k: rel_error(got[k], want[k]) for k in want}
    worst = max(errors, key=errors.get)
    print(f"learner {case} {dtype}: max rel error cuda vs cpu {errors[worst]:.1e} ({worst})")
    assert errors[worst] < TOLERANCE[dtype], errors
    assert {s.op for s in gpu_carry.selections()} == {"history"}  # the learner's history term
    assert not [s.failed for s in gpu_carry.selections() if s.failed]  # no candidate dropped


def _weights_after_updates(agent, cfg, segments, device):
    """The weights after one multi-pass update per segment, the learner on `device`."""
    learner = Learner(agent, cfg)
    for seg in segments:
        learner.update(to_device(seg, device))
    return {name: p.detach() for name, p in agent.named_parameters()}


def test_the_ppo_passes_with_the_start_correction_on_cuda_equal_the_cpu():
    """`--preset popgym`'s elstm-rtrl learner in small (PPO-clip with GAE, Adam, 2 epochs x 2
    minibatches, the first-order start state, the entropy floor): the weights after two
    batches on CUDA equal the CPU's. On CUDA the start sums take the blocked torch path (the
    native kernel is the CPU's), which `r2ac bench rtrl-e2e --device cuda` times. float64
    only: eight Adam steps divide each gradient by its own running norm, which in float32
    would turn the two devices' rounding in near-zero gradients into differences of order
    the learning rate."""
    dtype = F64
    env, options = ENVS["terminations"]
    cfg = tiny(
        env=env, env_options=options, core="elstm-rtrl", unroll_length=M, num_envs=4,
        batch_size=4, prev_action=True, algorithm="ppo", targets="gae", epochs=2,
        minibatches=2, optimizer="adam", learning_rate=1e-2, rtrl_start_correction=True,
        entropy_floor=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    env = make_env(cfg, 4, seed=7)
    agent = agent_for_env(cfg, env, dtype=dtype)
    actor = Actor(agent, env, seed=7, unroll_length=M)
    segments = [actor.collect()[0] for _ in range(2)]  # the second starts from S(t0) != 0
    assert segments[1].state.sens.FZ.abs().max() > 0
    on_gpu = copy.deepcopy(agent).to("cuda")
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    want = _weights_after_updates(agent, cfg, segments, "cpu")
    got = _weights_after_updates(on_gpu, cfg, segments, "cuda")
    moved = max(rel_error(want[k], before[k]) for k in want)
    errors = {k: rel_error(got[k], want[k]) for k in want}
    worst = max(errors, key=errors.get)
    print(
        f"passes {dtype}: max rel error cuda vs cpu {errors[worst]:.1e} ({worst}), moved {moved:.1e}"
    )
    assert moved > 1e-3  # the updates did move the weights
    assert errors[worst] < TOLERANCE[dtype], errors
