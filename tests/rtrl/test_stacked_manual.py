"""The stacked cores' hand-written gradients (forward_manual / backward_manual, the streaming
agent's path) equal autograd of step() in float64, and peek_manual equals peek."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r2ac.envs.spaces import as_action_space
from r2ac.rl.stream import ac as S
from r2ac.rl.stream import nets as N
from r2ac.rtrl.stacked import STACKED_CORES, make_stacked_core
from r2ac.rtrl.stacked.base import StackedCore

F64 = torch.float64


@pytest.mark.parametrize("name", list(STACKED_CORES))
def test_manual_gradients_equal_autograd(name):
    K, D, N = 3, 5, 6
    core = make_stacked_core(name, K, D, N, F64)
    params = core.init_params(torch.Generator().manual_seed(1))
    state = core.initial_state()
    gen = torch.Generator().manual_seed(2)
    for t in range(6):
        x = torch.randn(K, D, dtype=F64, generator=gen)
        reset = torch.tensor([t == 0, t == 3, False])
        g_h = torch.randn(K, core.output_size, dtype=F64, generator=gen)
        h, new, saved = core.forward_manual(params, x, state, reset)
        h_ref, new_ref, saved_ref = StackedCore.forward_manual(core, params, x, state, reset)
        grads = {n: torch.zeros_like(v) for n, v in params.items()}
        grads_ref = {n: torch.zeros_like(v) for n, v in params.items()}
        g_x = core.backward_manual(saved, g_h, grads)
        g_x_ref = StackedCore.backward_manual(core, saved_ref, g_h, grads_ref)
        assert (h - h_ref).abs().max() < 1e-12
        assert (g_x - g_x_ref).abs().max() < 1e-12
        for n in params:
            assert (grads[n] - grads_ref[n]).abs().max() < 1e-12, n
        for a, b in zip(new, new_ref, strict=True):
            assert (a - b).abs().max() < 1e-12
        state = new


@pytest.mark.parametrize("name", list(STACKED_CORES))
def test_peek_manual_equals_peek(name):
    """In the agent's layout (both networks' cores as 2K rows of one buffer)."""
    agent = S.StreamAC(
        lambda k, d: make_stacked_core(name, k, d, 6, F64), as_action_space(2), 3, [0, 1],
        S.StreamSettings(), mlp=(5,), dtype=F64,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    agent.observe_first(rng.normal(size=(2, 3)))
    for t in range(5):
        agent.act()
        state, core_saved = agent._pending[4], agent._pending[5][1]
        body = agent.params.second_parts
        core_p = body.core
        feat, _ = N.mlp_forward(body.ws, body.bs, torch.as_tensor(rng.normal(size=(2, 3))))
        critic_state = N.state_rows(state, 2, 4)
        got = agent.body_core.peek_manual(core_p, feat, critic_state, core_saved, slice(2, 4))
        want = agent.critic.core.peek(core_p, feat, critic_state, torch.zeros(2, dtype=bool))
        assert (got - want).abs().max() < 1e-12
        obs = rng.normal(size=(2, 3))
        agent.learn(rng.normal(size=2), obs, obs, [False, t == 2], [False, False])
