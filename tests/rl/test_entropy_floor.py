"""--entropy-floor: the learner raises the entropy cost by dual ascent while the policy's
entropy is below the floor, and the raise is the only thing that changes."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import validate
from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import ENTROPY_FLOOR_RATE, Learner, raised_entropy_boost
from r2ac.rl.model.build import agent_for_env, make_env

from .rl_helpers import tiny


def test_the_raise_grows_below_the_floor_shrinks_above_it_and_stays_non_negative():
    assert math.isclose(raised_entropy_boost(0.0, 0.3, 0.8, 0.01), 0.005)
    assert math.isclose(raised_entropy_boost(0.005, 1.3, 0.8, 0.01), 0.0)  # 0.005 - 0.005
    assert raised_entropy_boost(0.002, 1.3, 0.8, 0.01) == 0.0  # clamped, not -0.003
    assert math.isclose(raised_entropy_boost(0.1, 0.8, 0.8, 0.01), 0.1)  # at the floor: kept


def _learner_and_batches(cfg, batches: int):
    """A learner and `batches` segments collected with the weights before any update."""
    torch.manual_seed(0)
    env = make_env(cfg, cfg.runtime.num_envs, seed=3)
    agent = agent_for_env(cfg, env, torch.float64)
    actor = Actor(agent, env, seed=3, unroll_length=cfg.runtime.unroll_length)
    segments = [actor.collect()[0] for _ in range(batches)]
    env.close()
    return Learner(agent, cfg), segments


@pytest.mark.parametrize("algorithm, steps", [("impala", 1), ("ppo", 1), ("ppo", 2)])
def test_below_the_floor_each_step_raises_the_cost_and_trains_as_that_entropy_cost(
    algorithm, steps
):
    """A floor above any reachable entropy: every optimiser step's raise is rate x (floor x
    schedule - that step's entropy), and with one step a batch the weights after it are
    those of a learner configured with entropy_cost = base + the raise it had."""
    kw = dict(batch_size=3, num_envs=3, learning_rate=1e-2, lr_decay=True, total_frames=3 * 4 * 4)
    if algorithm == "ppo":
        kw.update(algorithm="ppo", targets="gae", epochs=steps, minibatches=1)
    floor, rate = 5.0, ENTROPY_FLOOR_RATE  # delayed cue has 2 actions: entropy <= ln 2 < 5
    cfg = tiny(entropy_floor=floor, **kw)
    validate(cfg)
    learner, segments = _learner_and_batches(cfg, 3)
    boost = 0.0
    for update, seg in enumerate(segments):
        schedule = 1.0 - update / cfg.updates_total  # the linear decay, no warm-up
        before = learner.entropy_boost
        twin_cfg = cfg.updated(entropy_floor=0.0, entropy_cost=cfg.loss.entropy_cost + before)
        twin, _ = _learner_and_batches(twin_cfg, 0)
        twin.agent.load_state_dict(learner.agent.state_dict())
        # a copy: the optimiser would share the moment tensors, which step in place
        twin.optimizer.load_state_dict(copy.deepcopy(learner.optimizer.state_dict()))
        twin.scheduler.load_state_dict(learner.scheduler.state_dict())
        twin.generator.set_state(learner.generator.get_state())
        metrics = learner.update(seg)
        if steps == 1:  # one step: the twin's is the same step exactly
            twin.update(seg)
            mine, its = learner.agent.state_dict(), twin.agent.state_dict()
            assert all(torch.equal(mine[k], its[k]) for k in mine)
        assert metrics["entropy"] < math.log(2) + 1e-9
        # each step raised the cost by rate x (floor x schedule - its entropy) > 0
        assert learner.entropy_boost > before + steps * rate * (floor * schedule - math.log(2))
        boost = learner.entropy_boost
    assert metrics["entropy_cost"] > cfg.loss.entropy_cost
    assert boost > 0


def test_above_the_floor_nothing_changes():
    """A floor of 0.01 nats under a near-uniform policy: the cost stays the configured one,
    and training is bit-identical to training without a floor."""
    cfg = tiny(batch_size=3, num_envs=3, algorithm="ppo", targets="gae", epochs=2)
    with_floor = cfg.updated(entropy_floor=0.01)
    a, segments = _learner_and_batches(cfg, 3)
    b, _ = _learner_and_batches(with_floor, 0)
    b.agent.load_state_dict(a.agent.state_dict())
    for seg in segments:
        ma, mb = a.update(seg), b.update(seg)
        assert mb["entropy_cost"] == ma["entropy_cost"] == cfg.loss.entropy_cost
    assert b.entropy_boost == 0.0
    wa, wb = a.agent.state_dict(), b.agent.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_raise_travels_in_the_learner_state():
    cfg = tiny(entropy_floor=5.0)
    learner, segments = _learner_and_batches(cfg, 1)
    learner.update(segments[0])
    assert learner.entropy_boost > 0
    fresh, _ = _learner_and_batches(cfg, 0)
    fresh.load_state_dict(learner.state_dict())
    assert fresh.entropy_boost == learner.entropy_boost
    old = {k: v for k, v in learner.state_dict().items() if k != "entropy_boost"}
    fresh.load_state_dict(old)  # a checkpoint of an earlier version: no raise
    assert fresh.entropy_boost == 0.0


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"entropy_floor": -0.1}, "entropy_floor=-0.1"),
        ({"entropy_floor": float("nan")}, "entropy_floor=nan"),
    ],
)
def test_bad_entropy_floors_are_one_line_errors(kw, words):
    with pytest.raises(ConfigError) as err:
        validate(tiny(**kw))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_floor_with_learning_rate_0_still_raises_the_cost():
    """The floor scales with the schedule's factor, not lr / base lr (0 / 0 at lr 0)."""
    cfg = tiny(entropy_floor=5.0, learning_rate=0.0)
    learner, segments = _learner_and_batches(cfg, 1)
    metrics = learner.update(segments[0])
    expected = ENTROPY_FLOOR_RATE * (5.0 - metrics["entropy"])
    assert math.isclose(learner.entropy_boost, expected, rel_tol=1e-12)


def test_the_largest_entropy_of_each_action_space():
    from r2ac.envs.spaces import ActionSpace
    from r2ac.rl.model.distributions import distribution, max_entropy

    spaces = {
        ActionSpace.discrete(4): math.log(4),
        ActionSpace.multi_discrete([8, 8]): 2 * math.log(8),
        ActionSpace.multi_binary(3): 3 * math.log(2),
        ActionSpace.box([-2.0], [2.0]): math.inf,
    }
    for space, largest in spaces.items():
        assert max_entropy(space) == pytest.approx(largest, rel=1e-15)
        if space.kind != "box":  # the uniform policy (zero logits) has it
            uniform = distribution(space, torch.zeros(space.param_size, dtype=torch.float64))
            assert float(uniform.entropy()) == pytest.approx(largest, rel=1e-12)


def test_the_cap_lowers_only_a_floor_above_its_share_of_the_largest_entropy():
    from r2ac.envs.spaces import ActionSpace
    from r2ac.rl.learning.learner import capped_entropy_floor

    loss = tiny(entropy_floor=0.8, entropy_floor_cap=0.6).loss
    assert capped_entropy_floor(loss, ActionSpace.discrete(2)) == 0.6 * math.log(2)
    # four actions or more, or a Box: the floor itself, the same float
    for space in (ActionSpace.discrete(4), ActionSpace.multi_discrete([4, 4]),
                  ActionSpace.box([-2.0], [2.0])):  # fmt: skip
        assert capped_entropy_floor(loss, space) == 0.8
    uncapped = tiny(entropy_floor=0.8).loss
    with pytest.warns(RuntimeWarning, match=r"entropy floor 0.8 nats >= .*Discrete\(2\).*cap"):
        assert capped_entropy_floor(uncapped, ActionSpace.discrete(2)) == 0.8


def test_the_learner_follows_the_capped_floor():
    """Two actions, floor 5 nats, cap 0.5: one step at lr 0 raises the cost by rate x
    (0.5 ln 2 - entropy); the policy's entropy starts near ln 2, so the raise is 0."""
    cfg = tiny(entropy_floor=5.0, entropy_floor_cap=0.5, learning_rate=0.0)
    learner, segments = _learner_and_batches(cfg, 1)
    assert learner.entropy_floor == 0.5 * math.log(2)
    metrics = learner.update(segments[0])
    expected = raised_entropy_boost(0.0, metrics["entropy"], 0.5 * math.log(2), 0.01)
    assert learner.entropy_boost == expected == 0.0 and metrics["entropy"] > 0.5 * math.log(2)
    capped_high = tiny(entropy_floor=5.0, entropy_floor_cap=0.9999, learning_rate=0.0)
    learner, segments = _learner_and_batches(capped_high, 1)
    metrics = learner.update(segments[0])  # a floor of 0.9999 ln 2: still above the entropy?
    deficit = 0.9999 * math.log(2) - metrics["entropy"]
    assert learner.entropy_boost == pytest.approx(max(0.0, 0.01 * deficit), abs=1e-15)


@pytest.mark.parametrize("cap", [-0.1, 1.0, float("nan")])
def test_a_cap_outside_0_1_is_a_one_line_error(cap):
    with pytest.raises(ConfigError) as err:
        validate(tiny(entropy_floor=0.8, entropy_floor_cap=cap))
    assert f"entropy_floor_cap={cap}" in str(err.value) and "\n" not in str(err.value)
