"""IMPALA losses against hand-computed values."""

import math

import pytest
import torch

from r2ac.rl.learning.losses import (
    action_log_probs,
    baseline_loss,
    compute_loss,
    entropy_loss,
    policy_gradient_loss,
)

LN2 = math.log(2.0)


def _example():
    """T = 2, B = 1, A = 3 with probabilities (1/2, 1/4, 1/4) and (1/4, 1/4, 1/2)."""
    probs = torch.tensor([[[0.5, 0.25, 0.25]], [[0.25, 0.25, 0.5]]], dtype=torch.float64)
    logits = probs.log().requires_grad_()  # (2, 1, 3)
    actions = torch.tensor([[0], [2]])  # both taken actions have pi = 1/2
    values = torch.tensor([[1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    vs = torch.tensor([[3.0], [1.0]], dtype=torch.float64, requires_grad=True)
    pg_advantages = torch.tensor([[2.0], [-1.0]], dtype=torch.float64, requires_grad=True)
    return logits, actions, values, vs, pg_advantages


def test_parts_by_hand():
    logits, actions, values, vs, pg_advantages = _example()
    assert action_log_probs(logits, actions)[:, 0].tolist() == pytest.approx([-LN2, -LN2])
    # -(ln(1/2) * 2 + ln(1/2) * (-1)) = ln 2
    assert policy_gradient_loss(logits, actions, pg_advantages).item() == pytest.approx(LN2)
    # 0.5 * ((3 - 1)^2 + (1 - 2)^2) = 2.5
    assert baseline_loss(values, vs).item() == pytest.approx(2.5)
    # each step has entropy 1.5 ln 2; the loss is the negative sum
    assert entropy_loss(logits).item() == pytest.approx(-3.0 * LN2)


def test_compute_loss_combines_with_costs():
    logits, actions, values, vs, pg_advantages = _example()
    out = compute_loss(logits, actions, values, vs, pg_advantages)
    assert out["pg_loss"].item() == pytest.approx(LN2)
    assert out["baseline_loss"].item() == pytest.approx(0.5 * 2.5)
    assert out["entropy_loss"].item() == pytest.approx(0.01 * -3.0 * LN2)
    assert out["entropy"].item() == pytest.approx(1.5 * LN2)
    assert out["loss"].item() == pytest.approx(0.97 * LN2 + 1.25)
    assert all(out[k].dim() == 0 for k in out)
    assert out["loss"].requires_grad
    assert not any(out[k].requires_grad for k in out if k != "loss")


def test_gradients_by_hand():
    logits, actions, values, vs, pg_advantages = _example()
    compute_loss(logits, actions, values, vs, pg_advantages, entropy_cost=0.0)["loss"].backward()
    # d/dV of 0.5 * 0.5 * (vs - V)^2 = 0.5 * (V - vs)
    assert values.grad[:, 0].tolist() == pytest.approx([-1.0, 0.5])
    # d/dlogits of -adv * log pi(a) = -adv * (onehot(a) - pi)
    expected = torch.tensor([[[-1.0, 0.5, 0.5]], [[-0.25, -0.25, 0.5]]], dtype=torch.float64)
    torch.testing.assert_close(logits.grad, expected)
    # targets are constants
    assert vs.grad is None and pg_advantages.grad is None


def test_losses_are_sums_not_means():
    logits, actions, values, vs, pg_advantages = _example()
    doubled = [torch.cat([t, t], dim=1) for t in (logits, actions, values, vs, pg_advantages)]
    single = compute_loss(logits, actions, values, vs, pg_advantages)
    double = compute_loss(*doubled)
    assert double["loss"].item() == pytest.approx(2.0 * single["loss"].item())
    assert double["entropy"].item() == pytest.approx(single["entropy"].item())


def test_shape_errors():
    logits, actions, values, vs, pg_advantages = _example()
    with pytest.raises(ValueError, match="equal shapes"):
        compute_loss(logits, actions, values, vs[:1], pg_advantages)
    with pytest.raises(ValueError, match="logits must be"):
        compute_loss(logits[:1], actions, values, vs, pg_advantages)
    with pytest.raises(ValueError, match="equal shapes"):
        baseline_loss(values, vs.squeeze(1))
