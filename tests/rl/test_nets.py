"""Stems, heads and the memoryless core."""

import numpy as np
import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.model.nets import (
    ImpalaResNetStem,
    MLPStem,
    PolicyValueHeads,
    ShallowConvStem,
    make_stem,
)
from r2ac.rtrl.feedforward import Feedforward, FeedforwardState


@pytest.mark.parametrize(
    ("shape", "flat_features"),
    [
        ((3, 96, 72), 32 * 12 * 9),  # DMLab: 96x72 -> 48x36 -> 24x18 -> 12x9
        ((4, 84, 84), 32 * 11 * 11),  # Atari: 84 -> 42 -> 21 -> 11
        ((3, 64, 64), 32 * 8 * 8),  # ProcGen: 64 -> 32 -> 16 -> 8
    ],
)
def test_resnet_stem_shapes(shape, flat_features):
    torch.manual_seed(0)
    stem = ImpalaResNetStem(*shape)
    assert stem.fc.in_features == flat_features
    obs = torch.randint(0, 256, (2, *shape), dtype=torch.uint8)
    with torch.no_grad():
        features = stem(obs)
    assert features.shape == (2, 256)
    assert (features >= 0).all()


def test_resnet_stem_structure_and_scaling():
    torch.manual_seed(0)
    stem = ImpalaResNetStem(3, 16, 12, channels=(4, 8, 8), out_features=10)
    convs = [m for m in stem.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 3 * 5 and all(c.kernel_size == (3, 3) for c in convs)
    obs = torch.randint(0, 256, (3, 3, 16, 12), dtype=torch.uint8)
    with torch.no_grad():
        # Written out: stage = conv, pool, residual x2; then ReLU, flatten, Linear, ReLU.
        x = obs.float() / 255.0
        for stage in stem.stages:
            x = torch.nn.functional.max_pool2d(stage.conv(x), 3, stride=2, padding=1)
            for block in (stage.res0, stage.res1):
                x = x + block.conv1(torch.relu(block.conv0(torch.relu(x))))
        expected = torch.relu(stem.fc(torch.relu(x).flatten(1)))
        torch.testing.assert_close(stem(obs), expected, rtol=0, atol=1e-6)


def test_resnet_stem_rejects_bad_input():
    stem = ImpalaResNetStem(3, 16, 12, channels=(4,), out_features=8)
    with pytest.raises(ValueError, match="shape"):
        stem(torch.zeros(2, 3, 12, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="dtype"):
        stem(torch.zeros(2, 3, 16, 12))


def test_shallow_stem_matches_its_written_out_layers():
    torch.manual_seed(0)
    stem = ShallowConvStem(4, 84, 84, out_features=12)
    assert (
        stem.fc.in_features == 32 * 9 * 9
    )  # 84 -> (84 - 8) // 4 + 1 = 20 -> (20 - 4) // 2 + 1 = 9
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        x = obs.float() / 255.0
        x = torch.nn.functional.conv2d(x, stem.conv0.weight, stem.conv0.bias, stride=4).relu()
        x = torch.nn.functional.conv2d(x, stem.conv1.weight, stem.conv1.bias, stride=2).relu()
        expected = torch.relu(x.flatten(1) @ stem.fc.weight.T + stem.fc.bias)
        torch.testing.assert_close(stem(obs), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        stem(torch.zeros(2, 4, 64, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="dtype"):
        stem(torch.zeros(2, 4, 84, 84))
    with pytest.raises(ConfigError, match="too small"):
        ShallowConvStem(3, 10, 10)


def _conv_multiply_adds(stem: torch.nn.Module, obs: torch.Tensor) -> int:
    total = 0

    def count(module, _inputs, output):
        nonlocal total
        total += (
            output[0].numel() * module.in_channels * module.kernel_size[0] * module.kernel_size[1]
        )

    hooks = [
        m.register_forward_hook(count) for m in stem.modules() if isinstance(m, torch.nn.Conv2d)
    ]
    with torch.no_grad():
        stem(obs)
    for hook in hooks:
        hook.remove()
    return total


def test_make_stem_picks_the_image_stem_by_name_and_shallow_is_cheap():
    shallow, resnet = (
        make_stem((4, 84, 84), torch.uint8, image_stem="shallow"),
        make_stem((4, 84, 84), torch.uint8, image_stem="resnet"),
    )
    assert isinstance(shallow, ShallowConvStem) and isinstance(resnet, ImpalaResNetStem)
    obs = torch.zeros(1, 4, 84, 84, dtype=torch.uint8)
    # Its reason to exist: 16*4*64*400 + 32*16*16*81 = 2.3 M conv multiply-adds vs 53 M.
    assert _conv_multiply_adds(shallow, obs) == 16 * 4 * 64 * 400 + 32 * 16 * 16 * 81
    assert _conv_multiply_adds(resnet, obs) > 20 * _conv_multiply_adds(shallow, obs)
    with pytest.raises(ConfigError, match="image stem"):
        make_stem((4, 84, 84), torch.uint8, image_stem="vgg")


def test_mlp_stem():
    torch.manual_seed(0)
    stem = MLPStem(5, hidden=(7, 6), out_features=4)
    linears = [m for m in stem.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(5, 7), (7, 6), (6, 4)]
    obs = torch.randn(3, 5)
    x = obs
    for layer in linears:
        x = torch.relu(layer(x))
    torch.testing.assert_close(stem(obs), x)
    with pytest.raises(ValueError, match=r"\(N, 5\)"):
        stem(torch.randn(3, 4))


@pytest.mark.parametrize("dtype", [torch.uint8, np.uint8, "uint8"])
def test_make_stem_picks_resnet_for_images(dtype):
    stem = make_stem((3, 64, 64), dtype, out_features=32)
    assert isinstance(stem, ImpalaResNetStem) and stem.out_features == 32


@pytest.mark.parametrize("dtype", [torch.float32, np.float64, "float32"])
def test_make_stem_picks_mlp_for_vectors(dtype):
    stem = make_stem((9,), dtype, out_features=16, mlp_hidden=(8,))
    assert isinstance(stem, MLPStem) and stem.in_features == 9 and stem.out_features == 16


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((84, 84), torch.uint8),
        ((3, 64, 64), torch.float32),
        ((9,), torch.int64),
        ((9,), "nonsense"),
    ],
)
def test_make_stem_rejects_unknown_observations(shape, dtype):
    with pytest.raises(ConfigError):
        make_stem(shape, dtype)


def test_policy_value_heads():
    heads = PolicyValueHeads(6, 4)
    h = torch.randn(5, 3, 6)
    logits, values = heads(h)
    assert logits.shape == (5, 3, 4) and values.shape == (5, 3)
    torch.testing.assert_close(values, h @ heads.baseline.weight[0] + heads.baseline.bias[0])


def test_policy_value_heads_with_a_shared_hidden_layer():
    torch.manual_seed(0)
    heads = PolicyValueHeads(6, 4, hidden=9).double()
    h = torch.randn(5, 3, 6, dtype=torch.float64)
    logits, values = heads(h)
    z = torch.relu(h @ heads.torso[0].weight.T + heads.torso[0].bias)  # (5, 3, 9)
    torch.testing.assert_close(logits, z @ heads.policy.weight.T + heads.policy.bias)
    torch.testing.assert_close(values, z @ heads.baseline.weight[0] + heads.baseline.bias[0])
    assert heads.policy.in_features == heads.baseline.in_features == 9


def test_feedforward_core_contract():
    core = Feedforward(input_size=3, hidden_size=5)
    state = core.initial_state(batch_size=4)
    assert state == FeedforwardState() and len(state) == 0
    x = torch.randn(6, 4, 3)
    reset = torch.zeros(6, 4, dtype=torch.bool)
    reset[2, 1] = True
    y, new_state = core(x, state, reset=reset)
    assert y.shape == (6, 4, 5) and new_state == state
    torch.testing.assert_close(y, torch.relu(core.linear(x)))
    torch.testing.assert_close(core(x, state, reset=None)[0], y)
    # Steps are independent: a later segment gives the same outputs as the whole.
    torch.testing.assert_close(core(x[3:], state)[0], y[3:])
    with pytest.raises(ValueError, match="reset"):
        core(x, state, reset=reset[:, :2])
    with pytest.raises(ValueError, match="x must be"):
        core(x[0], state)
