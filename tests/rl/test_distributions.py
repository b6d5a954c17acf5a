"""Each action distribution against torch.distributions in float64 (log-prob, entropy, mode),
sampling from the given generator, previous-action codes, and the env-side Box bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import distributions as D

from r2ac.envs.spaces import ActionSpace, box_to_env, check_actions
from r2ac.rl.learning.losses import action_log_probs, entropy_loss
from r2ac.rl.model.distributions import action_code, distribution, zero_where

T, B = 5, 4
SPACES = {
    "discrete": ActionSpace.discrete(5),
    "multi_discrete": ActionSpace.multi_discrete([3, 1, 4]),
    "multi_binary": ActionSpace.multi_binary(3),
    "box": ActionSpace.box([-2.0, 0.0], [2.0, 1.0]),
}


def _params(space, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, space.param_size, generator=g, dtype=torch.float64) * 1.5


def _reference(space, params):
    """The same distribution from torch.distributions (independent parts as a list)."""
    if space.kind == "discrete":
        return [D.Categorical(logits=params)]
    if space.kind == "multi_discrete":
        return [D.Categorical(logits=x) for x in params.split(list(space.nvec), -1)]
    if space.kind == "multi_binary":
        return [D.Bernoulli(logits=params[..., k]) for k in range(space.dims)]
    mean, log_std = params.chunk(2, -1)
    return [D.Normal(mean[..., k], log_std[..., k].exp()) for k in range(space.dims)]


def _component(space, actions, k):
    a = actions if space.kind == "discrete" else actions[..., k]
    return a.double() if space.kind == "multi_binary" else a  # torch's Bernoulli takes floats


@pytest.mark.parametrize("kind", sorted(SPACES))
def test_log_prob_entropy_mode_match_torch_distributions(kind):
    space = SPACES[kind]
    params = _params(space)
    dist, parts = distribution(space, params), _reference(space, params)
    actions = dist.sample(torch.Generator().manual_seed(1))
    assert actions.shape == (T, B, *space.action_shape)
    log_prob = sum(p.log_prob(_component(space, actions, k)) for k, p in enumerate(parts))
    entropy = sum(p.entropy() for p in parts)
    torch.testing.assert_close(dist.log_prob(actions), log_prob, rtol=0, atol=1e-12)
    torch.testing.assert_close(dist.entropy(), entropy, rtol=0, atol=1e-12)
    assert torch.equal(action_log_probs(params, actions, space), dist.log_prob(actions))
    torch.testing.assert_close(entropy_loss(params, space), -entropy.sum(), rtol=0, atol=1e-12)
    modes = [p.mode for p in parts]
    expected_mode = modes[0] if kind == "discrete" else torch.stack(modes, -1)
    torch.testing.assert_close(dist.mode().to(expected_mode.dtype), expected_mode)


def test_discrete_samples_are_todays_multinomial_draws():
    logits = _params(SPACES["discrete"])[0]  # (B, A)
    drawn = distribution(None, logits).sample(torch.Generator().manual_seed(3))
    probs = torch.softmax(logits, dim=-1)
    expected = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(3)).squeeze(1)
    assert torch.equal(drawn, expected)


def test_discrete_draws_of_a_time_batch_equal_those_of_its_rows():
    """(T, B, A) logits take the flattened path, (B, A) the actor's short one: the same
    draws from the same generator state."""
    logits = torch.randn(3, 5, 4, dtype=torch.float64)
    drawn = distribution(None, logits).sample(torch.Generator().manual_seed(7))  # (T, B)
    rows = distribution(None, logits.reshape(15, 4)).sample(torch.Generator().manual_seed(7))
    assert drawn.shape == (3, 5) and torch.equal(drawn.reshape(15), rows)
    done = torch.tensor([True, False, True, False, False])
    assert torch.equal(zero_where(drawn[0], done), drawn[0].masked_fill(done, 0))


@pytest.mark.parametrize("kind", sorted(SPACES))
def test_samples_follow_the_distribution_and_the_generator(kind):
    space = SPACES[kind]
    params = _params(space)[0, :1].expand(20_000, -1)  # one distribution, many draws
    dist = distribution(space, params)
    a = dist.sample(torch.Generator().manual_seed(5))
    assert torch.equal(a, dist.sample(torch.Generator().manual_seed(5)))
    assert a.dtype == (torch.float64 if space.is_float else torch.int64)
    # the sample mean of log p is minus the entropy (up to Monte-Carlo error)
    mc = -dist.log_prob(a).mean()
    assert abs(float(mc - dist.entropy()[0])) < 0.05


def test_gaussian_log_std_gets_gradients_and_mode_is_the_mean():
    space = SPACES["box"]
    params = _params(space).requires_grad_()
    dist = distribution(space, params)
    a = dist.sample(torch.Generator().manual_seed(0)).detach()
    (dist.log_prob(a).sum() + dist.entropy().sum()).backward()
    assert params.grad[..., 2:].abs().sum() > 0  # the log-std half
    torch.testing.assert_close(dist.mode(), params[..., :2].detach())


def test_wrong_param_or_action_shapes_are_refused():
    space = SPACES["multi_discrete"]
    with pytest.raises(ValueError, match="parameters per step"):
        distribution(space, torch.zeros(T, B, 3))
    with pytest.raises(ValueError, match="logits must be"):
        action_log_probs(_params(space), torch.zeros(T, B, dtype=torch.long), space)


def test_box_to_env_clips_then_scales_and_passes_unbounded_dims():
    low, high = np.array([-2.0, 0.0, -np.inf]), np.array([2.0, 1.0, np.inf])
    a = np.array([[-1.0, 0.0, 7.0], [3.0, -5.0, -9.0], [0.5, 1.0, 0.0]])
    out = box_to_env(a, low, high)
    np.testing.assert_allclose(out, [[-2.0, 0.5, 7.0], [2.0, 0.0, -9.0], [1.0, 1.0, 0.0]])


def test_env_side_action_checks():
    space = SPACES["multi_discrete"]
    assert check_actions(space, np.array([[2, 0, 3]]), 1).dtype == np.int64
    with pytest.raises(ValueError, match="lie in"):
        check_actions(space, np.array([[0, 1, 0]]), 1)  # the second has one category
    with pytest.raises(ValueError, match="shape"):
        check_actions(space, np.array([1, 0, 3]), 1)
    with pytest.raises(ValueError, match="finite"):
        check_actions(SPACES["box"], np.array([[np.nan, 0.0]]), 1)


def test_previous_action_codes_per_kind():
    f64 = torch.float64
    md = action_code(SPACES["multi_discrete"], torch.tensor([[2, 0, 1]]), f64)
    assert md.tolist() == [[0, 0, 1, 1, 0, 1, 0, 0]]
    assert action_code(SPACES["discrete"], torch.tensor([3]), f64).tolist() == [[0, 0, 0, 1, 0]]
    assert action_code(SPACES["multi_binary"], torch.tensor([[1, 0, 1]]), f64).tolist() == [
        [1, 0, 1]
    ]
    box = action_code(SPACES["box"], torch.tensor([[-3.0, 0.25]], dtype=f64), f64)
    assert box.tolist() == [[-1.0, 0.25]]  # the normalised action the env executed
    unbounded = ActionSpace.box([-np.inf], [np.inf])
    assert action_code(unbounded, torch.tensor([[4.0]]), f64).tolist() == [[4.0]]
    rows = zero_where(torch.ones(3, 2), torch.tensor([False, True, False]))
    assert rows.tolist() == [[1, 1], [0, 0], [1, 1]]
