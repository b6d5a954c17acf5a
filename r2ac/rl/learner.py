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
from r2ac.rl.vtrace import bootstrap_truncation, discounts_from, vtrace


def segment_losses(
    logits: torch.Tensor,
    values: torch.Tensor,
    seg: Segment,
    discount: float,
    baseline_cost: float,
    entropy_cost: float,
    reward_scale: float = 1.0,
) -> dict[str, torch.Tensor]:
    """IMPALA losses of a segment from the agent's outputs on its M+1 steps.

    logits ``(M+1, B, A)``, values ``(M+1, B)``. Rewards are clipped to [-1, 1], then
    multiplied by `reward_scale` (values learn the scaled returns); episode
    ends cut the bootstrap (`discounts_from`) and time-limit ends add gamma V(final_obs)
    back (`bootstrap_truncation`), so truncation is not treated as termination.
    """
    M = seg.actions.shape[0]
    if logits.shape[0] != M + 1 or values.shape[0] != M + 1:
        raise ValueError(f"expected outputs over M+1={M + 1} steps, got {tuple(logits.shape)}")
    rewards = seg.rewards.to(values.dtype).clamp(-1.0, 1.0) * reward_scale  # (M, B)
    rewards = bootstrap_truncation(rewards, seg.truncated, seg.final_values.to(values.dtype),
                                   discount)
    discounts = discounts_from(seg.terminated, seg.truncated, discount, dtype=values.dtype)
    target_log_pi = action_log_probs(logits[:M], seg.actions)  # (M, B)
    behaviour_log_pi = action_log_probs(seg.behaviour_logits.to(logits.dtype), seg.actions)
    returns = vtrace(
        (target_log_pi - behaviour_log_pi).detach(), discounts, rewards,
        values[:M].detach(), values[M].detach(),
    )
    return compute_loss(
        logits[:M], seg.actions, values[:M], returns.vs, returns.pg_advantages,
        baseline_cost=baseline_cost, entropy_cost=entropy_cost,
    )


def make_optimizer(agent: Agent, cfg: TrainConfig):
    """RMSProp (momentum 0) and a LambdaLR: constant, or linear decay to 0 over the run."""
    params = [p for p in agent.parameters() if p.requires_grad]
    optimizer = torch.optim.RMSprop(
        params, lr=cfg.learning_rate, alpha=cfg.rms_alpha, eps=cfg.rms_eps, momentum=0.0
    )
    total = cfg.updates_total
    decay = cfg.lr_decay

    def factor(update: int) -> float:
        return max(0.0, 1.0 - update / total) if decay else 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Learner:
    """Owns the optimiser; `update(segment)` does one IMPALA step on the agent in place."""

    def __init__(self, agent: Agent, cfg: TrainConfig):
        self.agent, self.cfg = agent, cfg
        self.params = [p for p in agent.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = make_optimizer(agent, cfg)

    def backward(self, seg: Segment) -> dict[str, torch.Tensor]:
        """Unroll, compute the losses and call backward once (gradients accumulate)."""
        cfg = self.cfg
        logits, values, _ = self.agent(seg.obs, seg.last_reward, seg.reset, seg.state, carry=False)
        losses = segment_losses(
            logits, values, seg, cfg.discount, cfg.baseline_cost, cfg.entropy_cost,
            cfg.reward_scale,
        )
        losses["loss"].backward()
        return losses

    def update(self, seg: Segment) -> dict[str, float]:
        """zero_grad, backward, clip the global norm, RMSProp step, scheduler step."""
        self.optimizer.zero_grad(set_to_none=True)
        losses = self.backward(seg)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        metrics = {k: float(v.detach()) for k, v in losses.items()}
        metrics.update(grad_norm=float(grad_norm), lr=lr)
        return metrics

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
