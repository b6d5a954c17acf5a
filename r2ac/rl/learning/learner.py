"""The learner: unroll the agent over a batch of segments, V-trace, one backward, RMSProp.

With `epochs` x `minibatches` > 1 or `algorithm ppo` it makes several optimiser steps per
batch instead, each on a minibatch of whole streams re-run from their stored start states
(`Learner.update` -> `_passes`; the pure parts are in r2ac/rl/learning/ppo.py).

No process plumbing: the runtimes hand it `Segment` batches (see actor.py). The agent is
unrolled on all M+1 steps from the segment's start state (which carries the RTRL
sensitivities accumulated by the actor), so `values[M]` is the bootstrap value; the output
state is not used (the actor carries the state). One `loss.backward()` gives the
untruncated RTRL gradient for an RTRL core and the truncated one for a BPTT core.
"""

from __future__ import annotations

import warnings

import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.rl.config import LossConfig, TrainConfig, multi_pass
from r2ac.rl.learning.actor import Segment
from r2ac.rl.learning.losses import action_log_probs, compute_loss
from r2ac.rl.learning.ppo import (
    BatchTargets,
    gae,
    ppo_losses,
    select_segment,
    stream_minibatches,
)
from r2ac.rl.learning.vtrace import VTraceReturns, bootstrap_truncation, discounts_from, vtrace
from r2ac.rl.model.agent import Agent, clip_rewards
from r2ac.rl.model.distributions import max_entropy
from r2ac.rtrl.core import project_cores_

RMS_ALPHA, RMS_EPS = 0.99, 0.01  # RMSProp's smoothing and epsilon (IMPALA's values)
POPART_BETA = 1e-3  # the step of PopArt's running target moments, one move per update
ENTROPY_FLOOR_RATE = 0.01  # --entropy-floor: the cost's move per nat of deficit and step


def segment_returns(
    logits: torch.Tensor,
    values: torch.Tensor,
    seg: Segment,
    loss: LossConfig,
    space: ActionSpace | None = None,
) -> VTraceReturns:
    """V-trace targets and advantages of a segment (no gradients).

    logits ``(M+1, B, P)`` (the distribution of `space`; None: Discrete), values ``(M+1, B)``.
    Rewards are clipped to [-reward_clip, reward_clip] (0: not clipped), then multiplied by
    `loss.reward_scale` (values learn the scaled returns); episode ends cut the bootstrap
    (`discounts_from`) and time-limit ends add gamma V(final_obs) back
    (`bootstrap_truncation`), so truncation is not treated as termination.
    """
    M = seg.actions.shape[0]
    if logits.shape[0] != M + 1 or values.shape[0] != M + 1:
        raise ValueError(f"expected outputs over M+1={M + 1} steps, got {tuple(logits.shape)}")
    rewards, discounts = scaled_rewards_and_discounts(seg, loss, values.dtype)  # (M, B) each
    target_log_pi = action_log_probs(logits[:M], seg.actions, space)  # (M, B)
    behaviour = seg.behaviour_logits.to(logits.dtype)  # (M, B, P)
    behaviour_log_pi = action_log_probs(behaviour, seg.actions, space)  # (M, B)
    return vtrace(
        (target_log_pi - behaviour_log_pi).detach(),
        discounts,
        rewards,
        values[:M].detach(),
        values[M].detach(),
    )


def scaled_rewards_and_discounts(
    seg: Segment, loss: LossConfig, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards clipped to [-reward_clip, reward_clip] (0: not clipped) and scaled, with
    gamma V(final_obs) added at time-limit ends, and the discounts (0 after a termination); ``(M, B)`` each."""
    rewards = clip_rewards(seg.rewards.to(dtype), loss.reward_clip) * loss.reward_scale  # (M, B)
    rewards = bootstrap_truncation(
        rewards, seg.truncated, seg.final_values.to(dtype), loss.discount
    )
    return rewards, discounts_from(seg.terminated, seg.truncated, loss.discount, dtype=dtype)


def segment_losses(
    logits: torch.Tensor,
    values: torch.Tensor,
    seg: Segment,
    loss: LossConfig,
    value_scale: float | torch.Tensor = 1.0,
    returns: VTraceReturns | None = None,
    space: ActionSpace | None = None,
    entropy_cost: float | None = None,
) -> dict[str, torch.Tensor]:
    """IMPALA losses of a segment from the agent's outputs on its M+1 steps.

    The targets are `segment_returns` (pass `returns` if already computed). `value_scale`
    (PopArt's sigma) divides the value errors and the policy-gradient advantages, so that
    the losses are those of normalised returns; 1 gives IMPALA's losses unchanged;
    `loss.popart_sigma_floor` > 0 divides the advantages by max(value_scale, floor)
    instead. `entropy_cost` (None:
    `loss.entropy_cost`) is the learner's, raised under an entropy floor.
    """
    M = seg.actions.shape[0]
    if returns is None:
        returns = segment_returns(logits, values, seg, loss, space)
    advantage_scale = value_scale
    if loss.popart_sigma_floor:
        advantage_scale = torch.as_tensor(advantage_scale).clamp(min=loss.popart_sigma_floor)
    advantages = returns.pg_advantages / advantage_scale  # (M, B)
    return compute_loss(
        logits[:M],
        seg.actions,
        values[:M] / value_scale,
        returns.vs / value_scale,
        advantages,
        baseline_cost=loss.baseline_cost,
        entropy_cost=loss.entropy_cost if entropy_cost is None else entropy_cost,
        space=space,
    )


def make_optimizer(agent: Agent, cfg: TrainConfig):
    """RMSProp (momentum 0) or Adam, and a LambdaLR: constant or linear decay to 0 over the
    run, after an optional linear warm-up over `lr_warmup_updates` (RMSProp has no bias
    correction: its first steps are up to 1/sqrt(1 - alpha) = 10x the learning rate, which
    can make a policy deterministic within ten updates). The schedule counts batches, not
    the optimiser steps of several passes."""
    params = [p for p in agent.parameters() if p.requires_grad]
    if cfg.optim.optimizer == "adam":
        optimizer = torch.optim.Adam(params, lr=cfg.optim.learning_rate, eps=cfg.optim.adam_eps)
    else:
        optimizer = torch.optim.RMSprop(
            params,
            lr=cfg.optim.learning_rate,
            alpha=RMS_ALPHA,
            eps=RMS_EPS,
            momentum=0.0,
        )
    total, decay, warmup = cfg.updates_total, cfg.optim.lr_decay, cfg.optim.lr_warmup_updates

    def factor(update: int) -> float:
        ramp = min(1.0, (update + 1) / warmup) if warmup else 1.0
        return ramp * (max(0.0, 1.0 - update / total) if decay else 1.0)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@torch.no_grad()
def batch_targets(
    logits: torch.Tensor,
    values: torch.Tensor,
    seg: Segment,
    cfg: TrainConfig,
    space: ActionSpace | None = None,
) -> BatchTargets:
    """PPO's per-batch constants from a forward on all M+1 steps before the passes: logits
    ``(M+1, B, A)``, values ``(M+1, B)``; GAE or V-trace targets (rewards clipped and
    scaled, time-limit ends bootstrapped, as for IMPALA)."""
    M = seg.actions.shape[0]
    behaviour_params = seg.behaviour_logits.to(logits.dtype)  # (M, B, P)
    behaviour = action_log_probs(behaviour_params, seg.actions, space)  # (M, B)
    if cfg.loss.targets == "vtrace":
        ret = segment_returns(logits, values, seg, cfg.loss, space)
        return BatchTargets(ret.pg_advantages, ret.vs, values[:M], behaviour)
    rewards, discounts = scaled_rewards_and_discounts(seg, cfg.loss, values.dtype)  # (M, B)
    advantages, returns = gae(rewards, discounts, values[:M], values[M], cfg.loss.gae_lambda)
    return BatchTargets(advantages, returns, values[:M], behaviour)


def raised_entropy_boost(boost: float, entropy: float, floor: float, rate: float) -> float:
    """One dual-ascent step of the entropy floor's multiplier: the cost added to the entropy
    cost grows by `rate` per nat the entropy is below `floor`, shrinks as much per nat above
    it, and never goes below 0 (above the floor the entropy cost is the configured one)."""
    return max(0.0, boost + rate * (floor - entropy))


def capped_entropy_floor(loss: LossConfig, space: ActionSpace) -> float:
    """--entropy-floor, at most --entropy-floor-cap times the space's largest entropy (an
    unreachable floor would raise the entropy cost without end). A floor that stays at or
    above the largest entropy gets one warning."""
    floor, largest = loss.entropy_floor, max_entropy(space)
    if loss.entropy_floor_cap:
        floor = min(floor, loss.entropy_floor_cap * largest)
    if floor and floor >= largest:
        warnings.warn(
            f"r2ac: entropy floor {floor:g} nats >= the largest entropy of {space.describe()}"
            f" ({largest:.3f}): it is never met, so its raise of the entropy cost grows without"
            " end; set --entropy-floor-cap (e.g. 0.6) or a lower --entropy-floor",
            RuntimeWarning,
            stacklevel=3,
        )
    return floor


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each metric over the steps of one batch."""
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


class Learner:
    """Owns the optimiser; `update(segment)` does one IMPALA step on the agent in place, or
    (`multi_pass`) epochs x minibatches steps of IMPALA or PPO."""

    def __init__(self, agent: Agent, cfg: TrainConfig):
        self.agent, self.cfg = agent, cfg
        self.params = [p for p in agent.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = make_optimizer(agent, cfg)
        # Shuffles the streams into minibatches; its own stream, so that acting and the
        # runtimes' RNG are untouched, and saved with the learner for a bit-exact resume.
        self.generator = torch.Generator().manual_seed(cfg.run.seed + 0x5EED)
        carries = agent.core.carries_sensitivities
        self.start_correction = cfg.optim.rtrl_start_correction and carries
        # --entropy-floor: what dual ascent adds to the entropy cost (0 while above the floor)
        self.entropy_boost = 0.0
        self.entropy_floor = capped_entropy_floor(cfg.loss, agent.action_space)

    def entropy_cost(self) -> float:
        """The entropy cost of the next step: the configured one plus the floor's raise."""
        return self.cfg.loss.entropy_cost + self.entropy_boost

    def _follow_entropy_floor(self, entropy: float) -> None:
        """After a step: move the raise toward keeping `entropy` (that step's mean) at the
        floor, which scales with the learning-rate schedule's factor of this batch."""
        loss, sched = self.cfg.loss, self.scheduler
        if not loss.entropy_floor:
            return
        floor = self.entropy_floor * sched.lr_lambdas[0](sched.last_epoch)
        self.entropy_boost = raised_entropy_boost(
            self.entropy_boost, entropy, floor, ENTROPY_FLOOR_RATE
        )

    def backward(self, seg: Segment) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Unroll, compute the losses and call backward once (gradients accumulate).

        Returns the losses and this batch's V-trace value targets vs ``(M, B)``, toward
        which PopArt (`value_norm`) moves its statistics after the optimiser step."""
        logits, values, _ = self.agent(
            seg.obs, seg.last_reward, seg.reset, seg.state, carry=False,
            last_action=seg.last_action,
        )  # fmt: skip
        space = self.agent.action_space
        returns = segment_returns(logits, values, seg, self.cfg.loss, space)
        scale = self.agent.heads.value_scale().detach()
        cost = self.entropy_cost()
        losses = segment_losses(logits, values, seg, self.cfg.loss, scale, returns, space, cost)
        losses["loss"].backward()
        return losses, returns.vs

    def ppo_backward(self, seg: Segment, targets: BatchTargets) -> dict[str, torch.Tensor]:
        """PPO's losses of a minibatch and one backward. The agent runs on the first M steps
        only: the bootstrap value is already in `targets`."""
        M = seg.actions.shape[0]
        logits, values, _ = self.agent(
            seg.obs[:M],
            seg.last_reward[:M],
            seg.reset[:M],
            seg.state,
            carry=False,
            last_action=seg.last_action[:M],
        )  # (M, B, A), (M, B), state
        losses = self.ppo_loss(logits, values, seg, targets)
        losses["loss"].backward()
        return losses

    def ppo_loss(
        self,
        logits,
        values,
        seg: Segment,
        targets: BatchTargets,
        keep_graph: bool = False,
    ) -> dict:
        """`ppo_losses` with this config (a test calls it on a reference's outputs, and
        differentiates its terms one at a time: `keep_graph`)."""
        cfg = self.cfg
        scale = self.agent.heads.value_scale().detach()
        return ppo_losses(
            logits, values, seg.actions, targets, cfg.loss.clip_coef, cfg.loss.value_clip,
            cfg.loss.baseline_cost, self.entropy_cost(), value_scale=scale,
            space=self.agent.action_space, keep_graph=keep_graph,
        )  # fmt: skip

    def prepare(self, seg: Segment) -> BatchTargets | None:
        """PPO: the batch's targets from a no-grad forward with the weights before the passes."""
        if self.cfg.loss.algorithm != "ppo":
            return None
        with torch.no_grad():
            logits, values, _ = self.agent(
                seg.obs, seg.last_reward, seg.reset, seg.state, carry=False,
                last_action=seg.last_action,
            )  # fmt: skip
        return batch_targets(logits, values, seg, self.cfg, self.agent.action_space)

    def _step(self) -> float:
        """Clip the global gradient norm, step the optimiser and put the cores' parameters back
        in their domain (`project_cores_`); the norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
        self.optimizer.step()
        project_cores_(self.agent)
        return float(grad_norm)

    def update(self, seg: Segment) -> dict[str, float]:
        """zero_grad, backward, clip the global norm, optimiser step, scheduler step; then,
        with PopArt, the value statistics move toward this batch's targets. With several
        passes (`multi_pass`) see `_passes`. With --obs-norm the observation statistics
        first move toward the batch's M acted steps (obs[M] is the next segment's first)."""
        if self.agent.obs_norm is not None:
            self.agent.obs_norm.update(seg.obs[: seg.actions.shape[0]])
        if multi_pass(self.cfg):
            return self._passes(seg)
        self.optimizer.zero_grad(set_to_none=True)
        losses, value_targets = self.backward(seg)
        lr, entropy_cost = self.optimizer.param_groups[0]["lr"], self.entropy_cost()
        grad_norm = self._step()
        metrics = {k: float(v.detach()) for k, v in losses.items()}
        self._follow_entropy_floor(metrics["entropy"])
        self.scheduler.step()
        metrics.update(grad_norm=grad_norm, lr=lr, entropy_cost=entropy_cost)
        return self._move_value_stats(metrics, value_targets)

    def _passes(self, seg: Segment) -> dict[str, float]:
        """`epochs` passes over the batch, each in `minibatches` steps on disjoint blocks of
        whole streams (visited in a fresh order per pass). IMPALA recomputes V-trace in every
        step (and moves PopArt after every step); PPO fixes its targets once (`prepare`) and
        moves PopArt once per batch. Each step re-runs its streams from their stored start
        state (`select_segment`: views, sensitivities included), which it only reads."""
        cfg, B, core = self.cfg, seg.actions.shape[1], self.agent.core
        targets, rows = self.prepare(seg), []
        lr = self.optimizer.param_groups[0]["lr"]
        # --rtrl-start-correction: the weights the stored states and sensitivities belong to
        snapshot = core.recurrent_snapshot() if self.start_correction else None
        for _ in range(cfg.optim.epochs):
            for block in stream_minibatches(B, cfg.optim.minibatches, self.generator):
                sub = select_segment(seg, block)
                self.optimizer.zero_grad(set_to_none=True)
                if snapshot is not None and rows:  # the weights have moved since the snapshot
                    sub = sub._replace(state=core.first_order_start(sub.state, snapshot))
                if targets is None:
                    losses, value_targets = self.backward(sub)
                else:
                    losses = self.ppo_backward(sub, targets.select(block))
                row = {k: float(v.detach()) for k, v in losses.items()}
                row.update(grad_norm=self._step(), entropy_cost=self.entropy_cost())
                self._follow_entropy_floor(row["entropy"])
                if targets is None:
                    row = self._move_value_stats(row, value_targets)
                rows.append(row)
        self.scheduler.step()
        metrics = mean_metrics(rows)
        metrics["lr"] = lr
        if targets is not None:
            metrics = self._move_value_stats(metrics, targets.returns)
        return metrics

    def _move_value_stats(self, metrics: dict, targets: torch.Tensor) -> dict:
        """With PopArt, move the value statistics toward `targets`; log them."""
        heads = self.agent.heads
        if heads.value_norm:
            heads.update_value_stats(targets, POPART_BETA)
            metrics.update(
                value_mean=float(heads.value_mean), value_scale=float(heads.value_scale())
            )
        return metrics

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            "entropy_boost": self.entropy_boost,
        }

    def load_state_dict(self, saved: dict) -> None:
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if "generator" in saved:  # checkpoints of earlier versions have none
            self.generator.set_state(saved["generator"])
        self.entropy_boost = float(saved.get("entropy_boost", 0.0))  # 0 in older checkpoints
