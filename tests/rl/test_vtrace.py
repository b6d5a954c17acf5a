"""V-trace against a slow numpy reference written from the paper's definition."""

import numpy as np
import pytest
import torch

from r2ac.rl.learning.vtrace import VTraceReturns, bootstrap_truncation, discounts_from, vtrace

T, B = 7, 5
GAMMA = 0.9


def _clip(x, threshold):
    return x if threshold is None else np.minimum(x, threshold)


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar, c_bar, pg_bar):
    """IMPALA Eq. (1) as explicit nested sums (no recursion), per-step discounts gamma_i.

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t,
    delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t), V(x_T) = bootstrap_value.
    """
    n_steps, n_batch = values.shape
    rhos = np.exp(log_rhos)
    v_ext = np.concatenate([values, bootstrap_value[None]], axis=0)  # (T + 1, B)
    vs = np.zeros_like(values)
    for b in range(n_batch):
        for s in range(n_steps):
            total = v_ext[s, b]
            for t in range(s, n_steps):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i, b] * _clip(rhos[i, b], c_bar)
                delta = rewards[t, b] + discounts[t, b] * v_ext[t + 1, b] - v_ext[t, b]
                total += weight * _clip(rhos[t, b], rho_bar) * delta
            vs[s, b] = total
    vs_ext = np.concatenate([vs, bootstrap_value[None]], axis=0)  # (T + 1, B)
    pg = _clip(rhos, pg_bar) * (rewards + discounts * vs_ext[1:] - values)
    return vs, pg


def _segment(seed, n_steps=T, n_batch=B):
    """Random float64 segment with episode ends (discount 0) inside it."""
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0.0, 1.0, size=(n_steps, n_batch))
    ends = rng.random((n_steps, n_batch)) < 0.25
    ends[2, 0] = True  # at least one episode end mid-segment
    discounts = GAMMA * (~ends).astype(np.float64)
    rewards = rng.normal(size=(n_steps, n_batch))
    values = rng.normal(size=(n_steps, n_batch))
    bootstrap_value = rng.normal(size=(n_batch,))
    return log_rhos, discounts, rewards, values, bootstrap_value


def _torch(*arrays):
    return [torch.from_numpy(a) for a in arrays]


@pytest.mark.parametrize(
    "thresholds",
    [(1.0, 1.0, 1.0), (0.7, 1.3, 2.0), (2.5, 0.5, 0.8), (None, None, None)],
)
def test_matches_reference_definition(thresholds):
    arrays = _segment(seed=0)
    rho_bar, c_bar, pg_bar = thresholds
    expected_vs, expected_pg = reference_vtrace(*arrays, rho_bar, c_bar, pg_bar)
    out = vtrace(*_torch(*arrays), rho_bar, c_bar, pg_bar)
    assert isinstance(out, VTraceReturns)
    assert out.vs.dtype == torch.float64
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=0, atol=1e-12)


def test_no_clipping_uses_raw_importance_weights():
    """With None thresholds large rhos enter unclipped, so results differ from clipping at 1."""
    log_rhos, discounts, rewards, values, bootstrap_value = _segment(seed=1)
    log_rhos = np.abs(log_rhos) + 0.5  # every rho > 1
    arrays = (log_rhos, discounts, rewards, values, bootstrap_value)
    unclipped = vtrace(*_torch(*arrays), None, None, None)
    clipped = vtrace(*_torch(*arrays))
    expected_vs, expected_pg = reference_vtrace(*arrays, None, None, None)
    np.testing.assert_allclose(unclipped.vs.numpy(), expected_vs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(unclipped.pg_advantages.numpy(), expected_pg, rtol=0, atol=1e-12)
    # Last step: vs = V + rho (r + gamma V_T - V), linear in rho.
    rho_last = np.exp(log_rhos[-1])
    delta_last = rewards[-1] + discounts[-1] * bootstrap_value - values[-1]
    np.testing.assert_allclose(
        unclipped.vs[-1].numpy(), values[-1] + rho_last * delta_last, atol=1e-12
    )
    np.testing.assert_allclose(clipped.vs[-1].numpy(), values[-1] + delta_last, atol=1e-12)


def test_on_policy_reduces_to_n_step_returns():
    _, discounts, rewards, values, bootstrap_value = _segment(seed=2)
    log_rhos = np.zeros_like(rewards)
    # n-step return, written as a sum of discounted rewards plus a discounted bootstrap.
    returns = np.zeros_like(rewards)
    for b in range(B):
        for s in range(T):
            total, scale = 0.0, 1.0
            for t in range(s, T):
                total += scale * rewards[t, b]
                scale *= discounts[t, b]
            returns[s, b] = total + scale * bootstrap_value[b]
    out = vtrace(*_torch(log_rhos, discounts, rewards, values, bootstrap_value))
    np.testing.assert_allclose(out.vs.numpy(), returns, rtol=0, atol=1e-12)
    next_returns = np.concatenate([returns[1:], bootstrap_value[None]], axis=0)
    expected_pg = rewards + discounts * next_returns - values
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=0, atol=1e-12)


def test_hand_computed_two_steps():
    # T = 2, B = 1; rho_0 = 2 (clipped to 1), rho_1 = 0.5; gamma = 0.5 everywhere.
    log_rhos = torch.log(torch.tensor([[2.0], [0.5]], dtype=torch.float64))
    discounts = torch.full((2, 1), 0.5, dtype=torch.float64)
    rewards = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    values = torch.tensor([[0.0], [4.0]], dtype=torch.float64)
    bootstrap = torch.tensor([8.0], dtype=torch.float64)
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap)
    # delta_1 = 0.5 (2 + 0.5 * 8 - 4) = 1;  v_1 = 4 + 1 = 5
    # delta_0 = 1 (1 + 0.5 * 4 - 0) = 3;    v_0 = 0 + 3 + 0.5 * 1 * (v_1 - V_1) = 3.5
    assert out.vs[:, 0].tolist() == [3.5, 5.0]
    # pg_0 = 1 (1 + 0.5 * 5 - 0) = 3.5;  pg_1 = 0.5 (2 + 0.5 * 8 - 4) = 1
    assert out.pg_advantages[:, 0].tolist() == [3.5, 1.0]


def test_split_at_episode_end_changes_nothing():
    """The part before a discount-0 step does not see anything after it."""
    log_rhos, discounts, rewards, values, bootstrap_value = _torch(*_segment(seed=3))
    discounts[3] = 0.0
    full = vtrace(log_rhos, discounts, rewards, values, bootstrap_value)
    head = vtrace(
        log_rhos[:4], discounts[:4], rewards[:4], values[:4], torch.randn(B, dtype=torch.float64)
    )
    tail = vtrace(log_rhos[4:], discounts[4:], rewards[4:], values[4:], bootstrap_value)
    torch.testing.assert_close(full.vs, torch.cat([head.vs, tail.vs]), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        full.pg_advantages, torch.cat([head.pg_advantages, tail.pg_advantages]), rtol=0, atol=1e-12
    )


def test_no_gradient_flows():
    arrays = [t.requires_grad_() for t in _torch(*_segment(seed=4))]
    out = vtrace(*arrays)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


@pytest.mark.parametrize(
    ("position", "shape", "match"),
    [
        (0, (T, B + 1), "log_rhos"),
        (1, (T + 1, B), "discounts"),
        (2, (T, B, 1), "rewards"),
        (3, (T,), "values must be"),
        (4, (B, 1), "bootstrap_value"),
        (4, (B + 1,), "bootstrap_value"),
    ],
)
def test_shape_errors(position, shape, match):
    args = [torch.zeros(T, B) for _ in range(4)] + [torch.zeros(B)]
    args[position] = torch.zeros(shape)
    with pytest.raises(ValueError, match=match):
        vtrace(*args)


def test_discounts_from_cuts_both_episode_ends():
    terminated = torch.tensor([[False, True], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [True, False], [False, False]])
    discounts = discounts_from(terminated, truncated, 0.99, dtype=torch.float64)
    assert discounts.dtype == torch.float64
    assert discounts.tolist() == [[0.99, 0.0], [0.0, 0.99], [0.99, 0.99]]
    with pytest.raises(ValueError, match="terminated and truncated"):
        discounts_from(terminated, truncated[:2], 0.99)


def test_bootstrap_truncation_restores_the_one_step_target():
    """On-policy, at a truncation step the target becomes r_t + gamma V(x_final)."""
    _, _, rewards, values, bootstrap_value = _torch(*_segment(seed=5))
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    truncated[4, 1] = True
    final_values = torch.full((T, B), 3.0, dtype=torch.float64, requires_grad=True)
    discounts = discounts_from(terminated, truncated, GAMMA, dtype=torch.float64)
    fixed_rewards = bootstrap_truncation(rewards, truncated, final_values, GAMMA)
    assert not fixed_rewards.requires_grad
    changed = (fixed_rewards != rewards).nonzero().tolist()
    assert changed == [[4, 1]]
    out = vtrace(
        torch.zeros(T, B, dtype=torch.float64), discounts, fixed_rewards, values, bootstrap_value
    )
    assert out.vs[4, 1].item() == pytest.approx(rewards[4, 1].item() + GAMMA * 3.0, abs=1e-12)
    with pytest.raises(ValueError, match="final_values"):
        bootstrap_truncation(rewards, truncated, final_values[:, :1], GAMMA)


def test_continuous_ratios_match_reference_definition():
    """Importance ratios of a diagonal Gaussian policy (a Box action space): V-trace takes
    log pi(a) - log mu(a) whatever the distribution, against the nested-sums reference."""
    from r2ac.envs.spaces import ActionSpace
    from r2ac.rl.learning.losses import action_log_probs

    space = ActionSpace.box([-1.0, -2.0], [1.0, 2.0])
    g = torch.Generator().manual_seed(4)
    target, behaviour = (torch.randn(T, B, 4, generator=g, dtype=torch.float64) for _ in "ab")
    actions = behaviour[..., :2] + behaviour[..., 2:].exp() * torch.randn(
        T, B, 2, generator=g, dtype=torch.float64
    )
    log_rhos = action_log_probs(target, actions, space) - action_log_probs(
        behaviour, actions, space
    )
    assert log_rhos.abs().max() > 1.0  # ratios far from 1 on both sides, so clipping acts
    _, discounts, rewards, values, bootstrap_value = _segment(seed=2)
    arrays = (log_rhos.numpy(), discounts, rewards, values, bootstrap_value)
    for thresholds in [(1.0, 1.0, 1.0), (None, None, None)]:
        expected_vs, expected_pg = reference_vtrace(*arrays, *thresholds)
        out = vtrace(*_torch(*arrays), *thresholds)
        np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-12, atol=1e-12)
