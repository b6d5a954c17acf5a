"""The R2AC learner with the RTU, LRU and minGRU cores (lr 0, float64): rtrl == full BPTT over
each stream's history, through the actor's segment-wise carry (advance_state) and the learner's
carry=False unroll, with episode ends inside segments (as test_learner_exact.py for the eLSTM)."""

from __future__ import annotations

import pytest
import torch

from r2ac.rl.model.build import agent_for_env, make_env

from .rl_helpers import tiny
from .test_learner_exact import (
    ENVS,
    B,
    M,
    _full_bptt,
    _max_rel_error,
    _run_learner,
    _truncated_bptt,
)

RECURRENT = {
    "rtu": ["core.W1", "core.nu_log"],
    "lru": ["core.B_re", "core.nu_log"],
    "mingru": ["core.W_z", "core.b_z"],
}


def _reference(cfg, agent, kind):
    ref_cfg = cfg.updated(core=f"{kind}-bptt")
    ref = agent_for_env(ref_cfg, make_env(ref_cfg, B, seed=7), dtype=torch.float64)
    ref.load_state_dict(agent.state_dict())
    return ref


@pytest.mark.parametrize("kind", ["rtu", "lru", "mingru"])
@pytest.mark.parametrize("case", sorted(ENVS))
def test_rtrl_learner_gradient_equals_full_bptt(kind, case):
    env, options = ENVS[case]
    cfg = tiny(
        env=env,
        env_options=options,
        core=f"{kind}-rtrl",
        learning_rate=0.0,
        grad_clip=1e12,
        unroll_length=M,
        num_envs=B,
        batch_size=B,
    )
    agent, segments, grads = _run_learner(cfg)
    ref = _reference(cfg, agent, kind)
    full = _full_bptt(cfg, ref, segments)
    core = [n for n in full if n.startswith("core.")]
    err = _max_rel_error(grads, full, core + ["heads.policy.weight", "heads.baseline.weight"])
    print(f"{kind}-rtrl/{case}: max rel error vs full BPTT {err:.2e}")
    assert err < 1e-10, err
    gap = _max_rel_error(_truncated_bptt(cfg, ref, segments), full, RECURRENT[kind])
    assert gap > 1e-4  # the truncated gradient differs: the check has teeth
