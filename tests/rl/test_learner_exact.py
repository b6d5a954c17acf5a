"""The learner's core gradient with lr 0: RTRL == full BPTT over each stream's history,
BPTT == the gradient truncated at segment starts (float64, several segments, resets and
time-limit truncations inside segments)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from r2ac.rl.learning.learner import segment_losses
from r2ac.rl.model.build import agent_for_env, make_env

from .rl_helpers import run_learner_lr0, tiny

M, B, K = 4, 3, 5
ENVS = {
    "terminations": ("builtin/delayed-cue", ("delay=3",)),  # 5-step episodes
    "truncations": ("builtin/watermaze", ("size=3", "episode_steps=6")),
}


def _run_learner(cfg):
    return run_learner_lr0(cfg, M, B, K)


def _reference_agent(cfg, env_agent):
    ref_cfg = cfg.updated(core="elstm-bptt")
    env = make_env(ref_cfg, B, seed=7)
    ref = agent_for_env(ref_cfg, env, dtype=torch.float64)
    ref.load_state_dict(env_agent.state_dict())
    return ref


def _losses(cfg, logits, values, seg):
    return segment_losses(logits, values, seg, cfg.loss)["loss"]


def _full_bptt(cfg, ref, segments):
    """One unroll of the whole history from the zero state; the same per-segment losses."""

    def cat(name):
        return torch.cat(
            [getattr(s, name)[:M] for s in segments] + [getattr(segments[-1], name)[M:]]
        )

    logits, values, _ = ref(
        cat("obs"),
        cat("last_reward"),
        cat("reset"),
        ref.initial_state(B),
        last_action=cat("last_action"),
    )
    loss = sum(
        _losses(cfg, logits[k * M : k * M + M + 1], values[k * M : k * M + M + 1], s)
        for k, s in enumerate(segments)
    )
    ref.zero_grad()
    loss.backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def _truncated_bptt(cfg, ref, segments):
    state, loss = ref.initial_state(B), 0.0
    for seg in segments:
        logits, values, _ = ref(
            seg.obs, seg.last_reward, seg.reset, state, last_action=seg.last_action
        )
        loss = loss + _losses(cfg, logits, values, seg)
        with torch.no_grad():
            _, _, state = ref(
                seg.obs[:M],
                seg.last_reward[:M],
                seg.reset[:M],
                state,
                last_action=seg.last_action[:M],
            )
    ref.zero_grad()
    loss.backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def _max_rel_error(grads, ref_grads, names):
    return max(float((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm()) for n in names)


@pytest.mark.parametrize("prev_action", [False, True], ids=["reward-input", "prev-action-input"])
@pytest.mark.parametrize("case", sorted(ENVS))
def test_rtrl_learner_gradient_equals_full_bptt(case, prev_action):
    env, options = ENVS[case]
    cfg = tiny(
        env=env,
        env_options=options,
        core="elstm-rtrl",
        learning_rate=0.0,
        grad_clip=1e12,
        unroll_length=M,
        num_envs=B,
        batch_size=B,
        prev_action=prev_action,
    )
    agent, segments, grads = _run_learner(cfg)
    resets = torch.stack([s.reset[1:M] for s in segments]).sum()  # episode ends inside
    ends = torch.stack([s.terminated | s.truncated for s in segments]).sum()
    assert resets > 0 and ends >= K
    ref = _reference_agent(cfg, agent)
    full = _full_bptt(cfg, ref, segments)
    core = [n for n in full if n.startswith("core.")]
    err = _max_rel_error(grads, full, core + ["heads.policy.weight", "heads.baseline.weight"])
    print(f"rtrl/{case}: max rel error vs full BPTT {err:.2e}")
    assert err < 1e-10, err
    # The truncated gradient is measurably different, so the test has teeth.
    trunc = _truncated_bptt(cfg, ref, segments)
    gap = _max_rel_error(trunc, full, ["core.F", "core.w_f"])
    print(f"rtrl/{case}: truncated vs full differ by {gap:.2e}")
    assert gap > 1e-4


@pytest.mark.parametrize("case", sorted(ENVS))
def test_bptt_learner_gradient_equals_truncated_bptt(case):
    env, options = ENVS[case]
    cfg = tiny(
        env=env,
        env_options=options,
        core="elstm-bptt",
        learning_rate=0.0,
        grad_clip=1e12,
        unroll_length=M,
        num_envs=B,
        batch_size=B,
    )
    agent, segments, grads = _run_learner(cfg)
    ref = _reference_agent(cfg, agent)
    trunc = _truncated_bptt(cfg, ref, segments)
    err = _max_rel_error(grads, trunc, list(trunc))
    print(f"bptt/{case}: max rel error vs truncated BPTT {err:.2e}")
    assert err < 1e-10


def test_reward_scale_scales_the_value_targets():
    """V-trace is linear in (rewards, values): with rewards and values both times s, the
    policy-gradient loss scales by s and the baseline loss by s^2 (entropy is unchanged)."""
    cfg = tiny(
        env="builtin/delayed-cue",
        env_options=("delay=3",),
        core="elstm-rtrl",
        learning_rate=0.0,
        unroll_length=M,
        num_envs=B,
        batch_size=B,
    )
    agent, segments, _ = _run_learner(cfg)
    seg, s = segments[-1], 0.01
    with torch.no_grad():
        logits, values, _ = agent(seg.obs, seg.last_reward, seg.reset, seg.state, carry=False)
    plain = segment_losses(logits, values, seg, cfg.loss)
    scaled = segment_losses(logits, values * s, seg, replace(cfg.loss, reward_scale=s))
    assert plain["pg_loss"].abs() > 1e-3 and plain["baseline_loss"] > 1e-3
    torch.testing.assert_close(scaled["pg_loss"], s * plain["pg_loss"], rtol=1e-12, atol=0)
    torch.testing.assert_close(
        scaled["baseline_loss"], s * s * plain["baseline_loss"], rtol=1e-12, atol=0
    )
    torch.testing.assert_close(scaled["entropy_loss"], plain["entropy_loss"], rtol=0, atol=0)
