"""The learner: unroll the agent over a batch of segments, V-trace, one backward, RMSProp.

No process plumbing: the runtimes hand it `Segment` batches (see actor.py). The agent is
unrolled on all M+1 steps from the segment's start state (which carries the RTRL
sensitivities accumulated by the actor), so `values[M]` is the bootstrap value; the output
state is not used (the actor carries the state). One `loss.backward()` gives the
untruncated RTRL gradient for an RTRL core and the truncated one for a BPTT core.
"""

from __future__ import annotations

import torch

from r2ac.rl.actor import Segment
from r2ac.rl.agent import Agent
from r2ac.rl.config import TrainConfig
from r2ac.rl.losses import action_log_probs, compute_loss
from r2ac.rl.vtrace import VTraceReturns, bootstrap_truncation, discounts_from, vtrace


def segment_returns(
    logits: torch.Tensor,
    values: torch.Tensor,
    seg: Segment,
    discount: float,
    reward_scale: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and advantages of a segment (no gradients).

    logits ``(M+1, B, A)``, values ``(M+1, B)``. Rewards are clipped to [-1, 1], then
    multiplied by `reward_scale` (values learn the scaled returns); episode ends cut the
    bootstrap (`discounts_from`) and time-limit ends add gamma V(final_obs) back
    (`bootstrap_truncation`), so truncation is not treated as termination.
    """
    M = seg.actions.shape[0]
    if logits.shape[0] != M + 1 or values.shape[0] != M + 1:
        raise ValueError(f"expected outputs over M+1={M + 1} steps, got {tuple(logits.shape)}")
    rewards = seg.rewards.to(values.dtype).clamp(-1.0, 1.0) * reward_scale  # (M, B)
    rewards = bootstrap_truncation(
        rewards, seg.truncated, seg.final_values.to(values.dtype), discount
    )
    discounts = discounts_from(seg.terminated, seg.truncated, discount, dtype=values.dtype)
    target_log_pi = action_log_probs(logits[:M], seg.actions)  # (M, B)
    behaviour_log_pi = action_log_probs(seg.behaviour_logits.to(logits.dtype), seg.actions)
    return vtrace(
        (target_log_pi - behaviour_log_pi).detach(),
        discounts,
        rewards,
        values[:M].detach(),
        values[M].detach(),
    )


def segment_losses(
    logits: torch.Tensor,
    values: torch.Tensor,
    seg: Segment,
    discount: float,
    baseline_cost: float,
    entropy_cost: float,
    reward_scale: float = 1.0,
    value_scale: float | torch.Tensor = 1.0,
    returns: VTraceReturns | None = None,
    advantage_norm: bool = False,
    scale_advantages: bool = True,
    sigma_floor: float = 0.0,
) -> dict[str, torch.Tensor]:
    """IMPALA losses of a segment from the agent's outputs on its M+1 steps.

    The targets are `segment_returns` (pass `returns` if already computed). `value_scale`
    (PopArt's sigma) divides the value errors and the policy-gradient advantages, so that
    the losses are those of normalised returns; 1 gives IMPALA's losses unchanged;
    `scale_advantages=False` divides only the value errors (a normalised critic, the actor
    on the rewards' own scale); `sigma_floor` > 0 divides the advantages by
    max(value_scale, sigma_floor) instead. With
    `advantage_norm` the advantages are standardised over the batch instead (PPO's
    convention, which POPGym's baselines use): the policy gradient is then independent of
    the reward scale, whatever the spread of the returns.
    """
    M = seg.actions.shape[0]
    if returns is None:
        returns = segment_returns(logits, values, seg, discount, reward_scale)
    advantage_scale = value_scale if scale_advantages else 1.0
    if sigma_floor:
        advantage_scale = torch.as_tensor(advantage_scale).clamp(min=sigma_floor)
    advantages = returns.pg_advantages / advantage_scale  # (M, B)
    if advantage_norm:
        advantages = standardise(returns.pg_advantages)
    return compute_loss(
        logits[:M],
        seg.actions,
        values[:M] / value_scale,
        returns.vs / value_scale,
        advantages,
        baseline_cost=baseline_cost,
        entropy_cost=entropy_cost,
    )


def standardise(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps) over every element (one batch of advantages)."""
    return (x - x.mean()) / (x.std(unbiased=False) + eps)


def make_optimizer(agent: Agent, cfg: TrainConfig):
    """RMSProp (momentum 0) and a LambdaLR: constant or linear decay to 0 over the run, after
    an optional linear warm-up over `lr_warmup_updates` (RMSProp has no bias correction: its
    first steps are up to 1/sqrt(1 - alpha) = 10x the learning rate, which can make a policy
    deterministic within ten updates)."""
    params = [p for p in agent.parameters() if p.requires_grad]
    optimizer = torch.optim.RMSprop(
        params,
        lr=cfg.optim.learning_rate,
        alpha=cfg.optim.rms_alpha,
        eps=cfg.optim.rms_eps,
        momentum=0.0,
    )
    total, decay, warmup = cfg.updates_total, cfg.optim.lr_decay, cfg.optim.lr_warmup_updates

    def factor(update: int) -> float:
        ramp = min(1.0, (update + 1) / warmup) if warmup else 1.0
        return ramp * (max(0.0, 1.0 - update / total) if decay else 1.0)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Learner:
    """Owns the optimiser; `update(segment)` does one IMPALA step on the agent in place."""

    def __init__(self, agent: Agent, cfg: TrainConfig):
        self.agent, self.cfg = agent, cfg
        self.params = [p for p in agent.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = make_optimizer(agent, cfg)

    def backward(self, seg: Segment) -> dict[str, torch.Tensor]:
        """Unroll, compute the losses and call backward once (gradients accumulate).

        With PopArt (`value_norm`) the V-trace targets of this batch are kept for
        `update` to move the value statistics after the optimiser step."""
        cfg, heads = self.cfg, self.agent.heads
        logits, values, _ = self.agent(
            seg.obs, seg.last_reward, seg.reset, seg.state, carry=False, last_action=seg.last_action
        )
        returns = segment_returns(logits, values, seg, cfg.loss.discount, cfg.loss.reward_scale)
        losses = segment_losses(
            logits,
            values,
            seg,
            cfg.loss.discount,
            cfg.loss.baseline_cost,
            cfg.loss.entropy_cost,
            cfg.loss.reward_scale,
            value_scale=heads.value_scale().detach(),
            returns=returns,
            advantage_norm=cfg.loss.advantage_norm,
            scale_advantages=cfg.loss.popart_advantages,
            sigma_floor=cfg.loss.popart_sigma_floor,
        )
        losses["loss"].backward()
        self._targets = returns.vs
        return losses

    def update(self, seg: Segment) -> dict[str, float]:
        """zero_grad, backward, clip the global norm, RMSProp step, scheduler step; then,
        with PopArt, the value statistics move toward this batch's targets."""
        self.optimizer.zero_grad(set_to_none=True)
        losses = self.backward(seg)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        metrics = {k: float(v.detach()) for k, v in losses.items()}
        metrics.update(grad_norm=float(grad_norm), lr=lr)
        heads = self.agent.heads
        if heads.value_norm:
            heads.update_value_stats(self._targets, self.cfg.loss.popart_beta)
            metrics.update(
                value_mean=float(heads.value_mean), value_scale=float(heads.value_scale())
            )
        return metrics

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
