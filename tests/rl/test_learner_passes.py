"""Several passes per batch (epochs x stream minibatches, IMPALA or PPO), lr 0, float64:
every optimiser step's gradient of an RTRL core equals full BPTT over its streams' whole
history (the stored start state re-used by every pass, sensitivities included), and a BPTT
core's equals BPTT truncated at the segment start."""

from __future__ import annotations

import pytest
import torch

import r2ac.rl.learning.learner as learner_module
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner, segment_losses
from r2ac.rl.learning.ppo import select_segment
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rtrl.elstm import math as elstm_math

from .rl_helpers import tiny
from .test_learner_exact import ENVS, _max_rel_error

M, B, K = 4, 4, 3  # steps, streams, segments
REFERENCE = {"elstm-rtrl": "elstm-bptt", "rtu-rtrl": "rtu-bptt", "gru-bptt": "gru-bptt"}


def _config(core, algorithm, case, optimizer="rmsprop"):
    env, options = ENVS[case]
    return tiny(
        env=env,
        env_options=options,
        core=core,
        learning_rate=0.0,
        grad_clip=1e12,
        unroll_length=M,
        num_envs=B,
        batch_size=B,
        prev_action=True,
        algorithm=algorithm,
        epochs=2,
        minibatches=2,
        optimizer=optimizer,
        **({"targets": "gae"} if algorithm == "ppo" else {}),
    )


def _record_steps(learner, monkeypatch):
    """Every optimiser step of `learner`: (stream index, {name: grad})."""
    indices, steps = [], []
    shuffle = learner_module.stream_minibatches

    def recording_shuffle(*args):
        out = shuffle(*args)
        indices.extend(out)
        return out

    monkeypatch.setattr(learner_module, "stream_minibatches", recording_shuffle)
    step = learner._step

    def recording_step():
        grads = {n: p.grad.clone() for n, p in learner.agent.named_parameters()}
        steps.append((indices[len(steps)], grads))
        return step()

    learner._step = recording_step
    return steps


def _run(cfg, monkeypatch):
    """K segments, one multi-pass update each; the steps of every update, by segment."""
    torch.manual_seed(0)
    env = make_env(cfg, B, seed=7)
    agent = agent_for_env(cfg, env, dtype=torch.float64)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    actor, learner = Actor(agent, env, seed=7, unroll_length=M), Learner(agent, cfg)
    steps = _record_steps(learner, monkeypatch)
    segments, per_segment = [], []
    for _ in range(K):
        seg, _ = actor.collect()
        segments.append(seg)
        done = len(steps)
        start = [t.clone() for t in torch.utils._pytree.tree_leaves(seg.state)]
        learner.update(seg)
        # The passes read the start state through views (select_segment of a block) and
        # never write it: every leaf, sensitivities included, is as the actor left it.
        after = torch.utils._pytree.tree_leaves(seg.state)
        assert all(torch.equal(a, b) for a, b in zip(start, after, strict=True))
        per_segment.append(steps[done:])
    for k, v in agent.state_dict().items():  # lr = 0: the weights stayed fixed
        assert torch.equal(v, before[k]), k
    assert all(len(s) == cfg.optim.epochs * cfg.optim.minibatches for s in per_segment)
    return agent, learner, segments, per_segment


def _reference(cfg, agent):
    ref_cfg = cfg.updated(core=REFERENCE[cfg.model.core])
    ref = agent_for_env(ref_cfg, make_env(ref_cfg, B, seed=7), dtype=torch.float64)
    ref.load_state_dict(agent.state_dict())
    return ref


def _history(ref, segments):
    """One unroll of every stream's whole history from the zero state: (K M + 1, B) outputs."""

    def cat(name):
        return torch.cat(
            [getattr(s, name)[:M] for s in segments] + [getattr(segments[-1], name)[M:]]
        )

    args = (cat("obs"), cat("last_reward"), cat("reset"), ref.initial_state(B))
    logits, values, _ = ref(*args, last_action=cat("last_action"))
    return logits, values


def _truncated(ref, seg):
    """The unroll of one segment from its stored start state (BPTT truncated there)."""
    logits, values, _ = ref(
        seg.obs, seg.last_reward, seg.reset, seg.state, last_action=seg.last_action
    )
    return logits, values


def _step_loss(cfg, learner, seg, index, logits, values):
    """The loss of one step on streams `index`, from outputs over the segment's M+1 steps."""
    sub = select_segment(seg, index)
    logits, values = logits[:, index], values[:, index]
    if cfg.loss.algorithm == "ppo":
        targets = learner.prepare(seg).select(index)  # lr 0: what the update fixed
        return learner.ppo_loss(logits[:M], values[:M], sub, targets)["loss"]
    return segment_losses(logits, values, sub, cfg.loss)["loss"]


def _check_steps(cfg, learner, ref, segments, per_segment, full: bool) -> float:
    """The largest relative error of any step's gradient against the reference's."""
    if full:
        logits, values = _history(ref, segments)
    worst, params = 0.0, dict(ref.named_parameters())
    for k, (seg, steps) in enumerate(zip(segments, per_segment)):
        if full:
            out = logits[k * M : k * M + M + 1], values[k * M : k * M + M + 1]
        else:
            out = _truncated(ref, seg)
        for index, grads in steps:
            loss = _step_loss(cfg, learner, seg, index, *out)
            ref_grads = torch.autograd.grad(loss, list(params.values()), retain_graph=True)
            ref_grads = dict(zip(params, ref_grads))
            # RTRL is exact for the core and the heads (the stem's gradient stops at the
            # core input of each step, as in test_learner_exact.py)
            names = [
                n for n in params if n.startswith(("core.", "heads.")) and ref_grads[n].norm() > 0
            ]
            worst = max(worst, _max_rel_error(grads, ref_grads, names))
    return worst


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
@pytest.mark.parametrize("core", ["elstm-rtrl", "rtu-rtrl"])
@pytest.mark.parametrize("case", sorted(ENVS))
def test_every_pass_of_an_rtrl_core_equals_full_bptt(case, core, algorithm, monkeypatch):
    cfg = _config(core, algorithm, case, optimizer="adam" if algorithm == "ppo" else "rmsprop")
    agent, learner, segments, per_segment = _run(cfg, monkeypatch)
    ends = torch.stack([s.terminated | s.truncated for s in segments]).sum()
    assert ends >= K  # episode ends inside the history
    ref = _reference(cfg, agent)
    err = _check_steps(cfg, learner, ref, segments, per_segment, full=True)
    print(f"{core}/{algorithm}/{case}: max rel error of any pass vs full BPTT {err:.2e}")
    assert err < 1e-10, err
    # Truncating at the stored state differs measurably: the check has teeth.
    gap = _check_steps(cfg, learner, ref, segments[-1:], per_segment[-1:], full=False)
    assert gap > 1e-4, gap


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_every_pass_of_a_bptt_core_equals_truncated_bptt(algorithm, monkeypatch):
    cfg = _config("gru-bptt", algorithm, "terminations")
    agent, learner, segments, per_segment = _run(cfg, monkeypatch)
    ref = _reference(cfg, agent)
    err = _check_steps(cfg, learner, ref, segments, per_segment, full=False)
    assert err < 1e-10, err


def _count_corrections(core, monkeypatch):
    """The calls of core.first_order_start: (state given, state returned, snapshot, weights now)."""
    calls, correct = [], core.first_order_start

    def recording(state, snapshot):
        out = correct(state, snapshot)
        calls.append((state, out, snapshot, core.recurrent_snapshot()))
        return out

    monkeypatch.setattr(core, "first_order_start", recording)
    return calls


@pytest.mark.parametrize("case", sorted(ENVS))
def test_the_start_correction_leaves_every_pass_exact_at_lr_0(case, monkeypatch):
    """--rtrl-start-correction moves the start state by S(t0) . (theta - theta before the
    passes): zero at lr 0, so every step still equals full BPTT over the history."""
    cfg = _config("elstm-rtrl", "ppo", case, optimizer="adam").updated(rtrl_start_correction=True)
    calls = []
    real_init = Learner.__init__

    def init(self, agent, cfg):
        real_init(self, agent, cfg)
        calls.append(_count_corrections(agent.core, monkeypatch))

    monkeypatch.setattr(Learner, "__init__", init)
    agent, learner, segments, per_segment = _run(cfg, monkeypatch)
    assert len(calls[0]) == K * (cfg.optim.epochs * cfg.optim.minibatches - 1)
    assert all(torch.equal(given.c, out.c) for given, out, _, _ in calls[0])
    err = _check_steps(cfg, learner, _reference(cfg, agent), segments, per_segment, full=True)
    assert err < 1e-10, err


def test_the_start_correction_moves_each_later_step_by_the_updates_since_the_batch_began(
    monkeypatch,
):
    cfg = _config("elstm-rtrl", "ppo", "terminations", optimizer="adam")
    cfg = cfg.updated(rtrl_start_correction=True, learning_rate=1e-2, epochs=3)
    torch.manual_seed(0)
    env = make_env(cfg, B, seed=7)
    agent = agent_for_env(cfg, env, dtype=torch.float64)
    actor, learner = Actor(agent, env, seed=7, unroll_length=M), Learner(agent, cfg)
    calls = _count_corrections(agent.core, monkeypatch)
    learner.update(actor.collect()[0])  # the first batch starts from zero sensitivities
    seg, _ = actor.collect()
    calls.clear()
    before = agent.core.recurrent_snapshot()
    learner.update(seg)
    assert len(calls) == cfg.optim.epochs * cfg.optim.minibatches - 1  # all but the first step
    for given, out, snapshot, now in calls:
        assert all(torch.equal(s, b) for s, b in zip(snapshot, before))  # the batch's weights
        moved = elstm_math.first_order_start(given.sens, now[0] - before[0], now[1] - before[1])
        assert torch.allclose(out.c - given.c, moved, rtol=1e-12, atol=1e-15)
        assert moved.abs().max() > 1e-6 and out.sens is given.sens
