"""The agent with the memoryless core and a small recurrent test core."""

import math
from typing import NamedTuple

import pytest
import torch
from torch import nn

from r2ac.errors import ConfigError
from r2ac.rl.model.agent import Agent
from r2ac.rl.model.nets import ImpalaResNetStem, MLPStem
from r2ac.rtrl import RecurrentCore
from r2ac.rtrl.feedforward import Feedforward
from r2ac.runs import checkpoint

T, B, OBS, FEATURES, HIDDEN, ACTIONS = 6, 3, 5, 8, 7, 4


class LSTMState(NamedTuple):
    h: torch.Tensor  # (B, N)
    c: torch.Tensor  # (B, N)


class LSTMCore(RecurrentCore):
    """Test-only adapter: torch's LSTMCell behind the core contract."""

    State = LSTMState

    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size, "bptt")
        self.cell = nn.LSTMCell(input_size, hidden_size)

    def initial_state(self, batch_size, with_sensitivities=None):
        zeros = torch.zeros(batch_size, self.hidden_size)
        return LSTMState(zeros, zeros.clone())

    def forward(self, x, state, reset=None, carry=True):
        h, c = state
        outputs = []
        for t in range(x.shape[0]):
            if reset is not None:
                keep = (~reset[t]).to(x.dtype).unsqueeze(-1)  # (B, 1)
                h, c = h * keep, c * keep
            h, c = self.cell(x[t], (h, c))
            outputs.append(h)
        return torch.stack(outputs), LSTMState(h.detach(), c.detach())


def _agent(core_cls=LSTMCore, freeze_stem=False, seed=0):
    torch.manual_seed(seed)
    stem = MLPStem(OBS, hidden=(6,), out_features=FEATURES)
    return Agent(stem, core_cls(FEATURES + 1, HIDDEN), ACTIONS, freeze_stem=freeze_stem)


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, OBS, generator=g)
    last_reward = 3.0 * torch.randn(T, B, generator=g)  # some beyond [-1, 1]
    return obs, last_reward


@pytest.mark.parametrize("core_cls", [Feedforward, LSTMCore])
def test_shapes(core_cls):
    agent = _agent(core_cls)
    obs, last_reward = _inputs()
    logits, values, state = agent(obs, last_reward, None, agent.initial_state(B))
    assert logits.shape == (T, B, ACTIONS) and values.shape == (T, B)
    assert type(state) is type(agent.initial_state(B))


def test_image_observations():
    torch.manual_seed(0)
    stem = ImpalaResNetStem(3, 16, 12, channels=(4, 8, 8), out_features=FEATURES)
    agent = Agent(stem, Feedforward(FEATURES + 1, HIDDEN), ACTIONS)
    obs = torch.randint(0, 256, (T, B, 3, 16, 12), dtype=torch.uint8)
    logits, values, _ = agent(obs, torch.zeros(T, B), None, agent.initial_state(B))
    # Each (t, b) is processed independently by the stem and the memoryless core.
    single_logits, single_values, _ = agent(obs[2:3, 1:2], torch.zeros(1, 1), None, ())
    torch.testing.assert_close(single_logits[0, 0], logits[2, 1])
    torch.testing.assert_close(single_values[0, 0], values[2, 1])


def test_core_input_is_features_and_clipped_last_reward():
    agent = _agent(Feedforward)
    obs, last_reward = _inputs()
    seen = []
    agent.core.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    agent(obs, last_reward, None, ())
    x = seen[0]  # (T, B, F + 1)
    torch.testing.assert_close(x[..., :FEATURES], agent.stem(obs.flatten(0, 1)).view(T, B, -1))
    torch.testing.assert_close(x[..., -1], last_reward.clamp(-1.0, 1.0))


def test_reset_stream_equals_fresh_start():
    agent = _agent(LSTMCore)
    obs, last_reward = _inputs()
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 1] = True
    logits, values, _ = agent(obs, last_reward, reset, agent.initial_state(B))
    fresh_logits, fresh_values, _ = agent(
        obs[3:, 1:2], last_reward[3:, 1:2], reset[3:, 1:2], agent.initial_state(1)
    )
    torch.testing.assert_close(logits[3:, 1:2], fresh_logits)
    torch.testing.assert_close(values[3:, 1:2], fresh_values)
    # Without the reset the stream remembers its past: outputs differ.
    carried_logits, _, _ = agent(obs, last_reward, None, agent.initial_state(B))
    assert not torch.allclose(carried_logits[3:, 1], logits[3:, 1])
    torch.testing.assert_close(carried_logits[3:, 0], logits[3:, 0])


def test_carried_state_splits_segments():
    agent = _agent(LSTMCore)
    obs, last_reward = _inputs()
    whole, _, _ = agent(obs, last_reward, None, agent.initial_state(B))
    head, _, state = agent(obs[:2], last_reward[:2], None, agent.initial_state(B))
    tail, _, _ = agent(obs[2:], last_reward[2:], None, state)
    torch.testing.assert_close(torch.cat([head, tail]), whole)


@pytest.mark.parametrize("freeze_stem", [False, True])
def test_freeze_stem(freeze_stem):
    agent = _agent(LSTMCore, freeze_stem=freeze_stem)
    obs, last_reward = _inputs()
    logits, values, _ = agent(obs, last_reward, None, agent.initial_state(B))
    (logits.sum() + values.sum()).backward()
    stem_grads = [p.grad for p in agent.stem.parameters()]
    assert all((g is None) == freeze_stem for g in stem_grads)
    assert all(p.grad is not None for p in agent.core.parameters())
    assert all(p.grad is not None for p in agent.heads.parameters())


def test_load_stem(tmp_path):
    source = _agent(Feedforward, seed=1)
    path = checkpoint.save_atomic({"agent": source.state_dict(), "step": 3}, tmp_path / "a.pt")
    target = _agent(LSTMCore, freeze_stem=True, seed=2)  # a different core is fine
    target.load_stem(path)
    for (name, p), q in zip(target.stem.named_parameters(), source.stem.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)
        assert not p.requires_grad
    # A bare agent state_dict works too.
    bare = checkpoint.save_atomic(source.state_dict(), tmp_path / "b.pt")
    _agent(Feedforward, seed=3).load_stem(bare)


def test_load_stem_mismatch_errors(tmp_path):
    torch.manual_seed(0)
    other = Agent(
        MLPStem(OBS + 1, hidden=(6,), out_features=FEATURES),
        Feedforward(FEATURES + 1, HIDDEN),
        ACTIONS,
    )
    path = checkpoint.save_atomic(other.state_dict(), tmp_path / "other.pt")
    with pytest.raises(
        ConfigError, match=r"layers\.0\.weight: checkpoint \(6, 6\) != model \(6, 5\)"
    ):
        _agent(Feedforward).load_stem(path)
    no_stem = checkpoint.save_atomic({"core.linear.weight": torch.zeros(1)}, tmp_path / "c.pt")
    with pytest.raises(ConfigError, match="missing layers.0.weight"):
        _agent(Feedforward).load_stem(no_stem)
    not_a_dict = checkpoint.save_atomic(torch.zeros(2), tmp_path / "t.pt")
    with pytest.raises(ConfigError, match="state_dict"):
        _agent(Feedforward).load_stem(not_a_dict)
    with pytest.raises(ConfigError, match="cannot load"):
        _agent(Feedforward).load_stem(tmp_path / "absent.pt")
    pickled = tmp_path / "p.pt"
    torch.save({"agent": _arbitrary_object()}, pickled)  # a bare pickle, as a stranger wrote it
    with pytest.raises(ConfigError, match="cannot load"):
        _agent(Feedforward).load_stem(pickled)


def _arbitrary_object():
    """Something a weights-only load refuses: an arbitrary object."""
    return LSTMCore(2, 2)


def test_config_and_shape_errors():
    stem = MLPStem(OBS, out_features=FEATURES)
    with pytest.raises(ConfigError, match="input_size"):
        Agent(stem, Feedforward(FEATURES, HIDDEN), ACTIONS)
    agent = _agent(Feedforward)
    obs, last_reward = _inputs()
    with pytest.raises(ValueError, match="last_reward"):
        agent(obs, last_reward[:, :2], None, ())
    with pytest.raises(ValueError, match="reset"):
        agent(obs, last_reward, torch.zeros(T, B + 1, dtype=torch.bool), ())


def test_agent_takes_only_recurrent_cores():
    stem = MLPStem(OBS, hidden=(6,), out_features=FEATURES)
    with pytest.raises(ConfigError, match="not an r2ac.rtrl.RecurrentCore"):
        Agent(stem, nn.LSTM(FEATURES + 1, HIDDEN), ACTIONS)


@pytest.mark.parametrize("core", ["elstm-rtrl", "elstm-bptt", "felstm-bptt"])
def test_chrono_span_spreads_the_forget_biases(core):
    """--chrono-span S: b_f = log(U(1, S - 1)) per cell (memory time scales 2..S steps) instead
    of one value for every cell; nothing else of the core changes."""
    from .rl_helpers import agents_with, tiny

    agents = agents_with(tiny(core=core, hidden_size=64), "chrono_span", (0, 8))
    default, chrono = (dict(a.core.named_parameters()) for a in agents)
    assert torch.equal(default["b_f"], torch.ones_like(default["b_f"]))
    b_f = chrono["b_f"]
    assert b_f.min() >= 0.0 and b_f.max() <= math.log(7.0) + 1e-6
    assert b_f.std() > 0.3  # spread, not one value
    assert all(torch.equal(p, chrono[n]) for n, p in default.items() if n != "b_f")


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"chrono_span": 2}, "--chrono-span must be 0 (off) or >= 3, got 2"),
        ({"chrono_span": 8, "core": "gru-bptt"}, "an elstm or felstm core's, not gru-bptt's"),
        ({"chrono_span": 8, "forget_bias": 1.0}, "give one of them"),
    ],
)
def test_bad_chrono_span_is_a_one_line_error(kw, words):
    from r2ac.rl.config import validate

    from .rl_helpers import tiny

    with pytest.raises(ConfigError) as err:
        validate(tiny(**kw))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_stem_norm_normalises_the_features_only_and_adds_nothing_when_off():
    """--stem-norm: the core sees the stem's features through a LayerNorm (each step's features
    at mean 0 and variance 1 at the init's gain 1 and bias 0, however large the stem's output),
    the last reward as before; off, the agent's parameters and checkpoint keys are unchanged."""
    from .rl_helpers import agents_with, tiny

    plain, normed = agents_with(tiny(), "stem_norm", (False, True))
    assert not any(n.startswith("stem_norm") for n in plain.state_dict())
    assert {n for n in normed.state_dict()} - {n for n in plain.state_dict()} == {
        "stem_norm.weight",
        "stem_norm.bias",
    }
    assert all(
        torch.equal(p, dict(normed.named_parameters())[n]) for n, p in plain.named_parameters()
    )
    with torch.no_grad():  # a stem whose output has grown large
        for agent in (plain, normed):
            agent.stem.layers[-2].weight.mul_(100.0)
    g = torch.Generator().manual_seed(4)
    obs = torch.randn(5, 3, plain.stem.layers[0].in_features, generator=g)  # (T, B, obs)
    last_reward = 3.0 * torch.randn(5, 3, generator=g)
    features = plain.stem.out_features
    x_plain = plain.core_input(obs, last_reward, None)  # (T, B, F + 1)
    x_normed = normed.core_input(obs, last_reward, None)
    assert x_plain[..., :features].abs().max() > 10.0
    mean, var = x_normed[..., :features].mean(-1), x_normed[..., :features].var(-1, unbiased=False)
    torch.testing.assert_close(mean, torch.zeros_like(mean), atol=1e-5, rtol=0)
    torch.testing.assert_close(var, torch.ones_like(var), atol=1e-3, rtol=0)
    torch.testing.assert_close(x_normed[..., features:], x_plain[..., features:])
    expected = torch.nn.functional.layer_norm(x_plain[..., :features], (features,))
    torch.testing.assert_close(x_normed[..., :features], expected)
