"""The history term of exact RTRL, isolated: the PPO loss's gradient from a stored start state
is the learner's own with the sensitivities, and an elstm-bptt agent's (same weights) under
`core.without_history()` from the light state; the loss's terms differentiate one at a time
(`keep_graph`) and add up to the loss's gradient."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.runtimes.serial import SerialRuntime
from tests.rl.rl_helpers import tiny

TERMS = ("loss", "pg_loss", "baseline_loss", "entropy_loss")


def flat_grad(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
         for p in module.parameters() if p.requires_grad]
    )  # fmt: skip


def gradient(runtime, seg, term: str, with_history: bool) -> torch.Tensor:
    """The whole agent's flat gradient of `term` on `seg`, the first pass."""
    agent, learner, core = runtime.agent, runtime.learner, runtime.agent.core
    targets = learner.prepare(seg)
    M = seg.actions.shape[0]
    agent.zero_grad(set_to_none=True)
    state = seg.state if with_history else core.light_state(seg.state)
    with nullcontext() if with_history else core.without_history():
        logits, values, _ = agent(
            seg.obs[:M], seg.last_reward[:M], seg.reset[:M], state, carry=False,
            last_action=seg.last_action[:M],
        )  # fmt: skip
        losses = learner.ppo_loss(logits, values, seg, targets, keep_graph=True)
        losses[term].backward()
    return flat_grad(agent)


def test_without_history_is_the_bptt_agents_gradient_and_with_it_the_learners():
    torch.manual_seed(0)
    cfg = tiny(algorithm="ppo", epochs=1, minibatches=1, batch_size=6)
    runtime = SerialRuntime(cfg)
    runtime.start()
    for _ in range(3):  # sensitivities away from zero
        runtime.next_batch()
    seg = runtime.next_batch().segment
    rtrl = gradient(runtime, seg, "loss", with_history=True)
    runtime.agent.zero_grad(set_to_none=True)
    runtime.learner.ppo_backward(seg, runtime.learner.prepare(seg))
    torch.testing.assert_close(rtrl, flat_grad(runtime.agent), rtol=0, atol=0)

    tbptt = gradient(runtime, seg, "loss", with_history=False)
    bptt_cfg = cfg.updated(core="elstm-bptt")
    env = make_env(bptt_cfg, 1, 0)
    bptt = agent_for_env(bptt_cfg, env)
    env.close()
    bptt.load_state_dict(runtime.agent.state_dict())
    learner = Learner(bptt, bptt_cfg)
    light = seg._replace(state=runtime.agent.core.light_state(seg.state))
    learner.ppo_backward(light, learner.prepare(light))
    torch.testing.assert_close(tbptt, flat_grad(bptt))
    assert (rtrl - tbptt).abs().max() > 0  # the sensitivities did carry something

    for with_history in (True, False):
        whole = gradient(runtime, seg, "loss", with_history)
        parts = [gradient(runtime, seg, t, with_history) for t in TERMS[1:]]
        torch.testing.assert_close(sum(parts), whole, rtol=1e-5, atol=1e-7)
        assert all(p.abs().max() > 0 for p in parts[:2])
