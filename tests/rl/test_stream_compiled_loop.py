"""The compiled streaming loop (r2ac/rl/stream/compiled_loop.py): n steps of K agents and their
built-in envs a call, against the per-step functional step (compiled.py) beside the numpy env,
float64.

Eager, the loop gives the per-step path's numbers bit for bit (the same functions; the
chunk's first act repeats the last step's act exactly), whatever the chunks' lengths: weights,
traces, core states, normalisers, the envs' states, the ended episodes; the metric sums to the rounding of their order of addition.
Compiled (slow), it stays within rounding of the eager loop with the same actions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r2ac.envs import builtin
from r2ac.envs.base import stream_seeds
from r2ac.envs.spaces import ActionSpace
from r2ac.envs.tensor_builtin import TensorBuiltinEnv
from r2ac.rl.stream.ac import StreamAC, StreamSettings
from r2ac.rl.stream.compiled import FusedStreamAC
from r2ac.rl.stream.compiled_loop import FusedStreamLoop
from r2ac.rl.stream.envs import PreviousActionInput, tensor_form
from r2ac.rl.stream.runtime import chunk_length
from r2ac.rtrl.stacked import make_stacked_core

F64 = torch.float64


def numpy_envs(k: int, seed: int = 11, task: str = "memory-chain", **options):
    """K agents' streams as the streaming runtime makes them, with the previous action."""
    env = builtin.make_builtin(task, k, seed, **options)
    env.seeds[:] = [stream_seeds(seed + i, 1)[0] for i in range(k)]
    return PreviousActionInput(env)


def make_agent(core: str, k: int, obs_size: int, mlp, top, actions: int = 2, dtype=F64):
    def make(kk, d):
        return make_stacked_core(core, kk, d, 6, dtype)

    settings = StreamSettings(lr=1.0, entropy_cost=0.05)
    seeds = [5 + i for i in range(k)]
    space = ActionSpace.discrete(actions)
    return StreamAC(make, space, obs_size, seeds, settings, mlp, dtype, top)


def state_gap(a, b) -> float:
    pairs = [(a.params, b.params), (a.traces, b.traces), *zip(a.core, b.core, strict=True)]
    for name in ("obs_count", "obs_mean", "obs_p", "rew_count", "rew_mean", "rew_p", "ret", "x"):
        pairs.append((getattr(a, name), getattr(b, name)))
    assert torch.equal(a.reset, b.reset) and int(a.steps) == int(b.steps)
    return max((x - y).abs().max().item() for x, y in pairs)


def side_by_side(core, k, mlp, top, chunks, compiled=False, **options):
    """The loop (chunks of the given lengths) and the per-step path from the same start:
    (the loop, its ended episodes, its metric sums, the per-step path, its episodes, sums)."""
    ref_env = numpy_envs(k, **options)
    loop_env = tensor_form(numpy_envs(k, **options))
    assert isinstance(loop_env, TensorBuiltinEnv)
    obs_size = ref_env.observation_spec.shape[0]
    actions = ref_env.action_space.nvec[0]
    ref_agent = make_agent(core, k, obs_size, mlp, top, actions)
    loop_agent = make_agent(core, k, obs_size, mlp, top, actions)
    first = ref_env.reset()
    assert np.array_equal(first, loop_env.reset())
    ref_agent.observe_first(first)
    loop_agent.observe_first(first)
    ref = FusedStreamAC(ref_agent, compiled=False)
    loop = FusedStreamLoop(loop_agent, loop_env, compiled=compiled)
    ref_returns, ref_sums = [], torch.zeros(5, dtype=F64)
    for _ in range(sum(chunks)):
        res = ref_env.step(ref.act().numpy())
        info = ref.learn(res.reward, res.obs, res.info["final_obs"], res.terminated, res.truncated)
        ref_sums += torch.stack([info[0].abs(), *info[1:]]).mean(1)
        r = res.info["episode_return"]
        ref_returns += r[~np.isnan(r)].tolist()
    returns, sums = [], torch.zeros(5, dtype=F64)
    for n in chunks:
        s, log = loop.run(n)
        sums += s
        returns += log.returns
    return loop, returns, sums, ref, ref_env, ref_returns, ref_sums


CASES = [
    ("lru-rtrl", 3, (), ()),  # the matched network
    ("rtu-rtrl", 2, (5,), (4,)),
    ("rtu-bptt", 1, (5, 6), ()),
]


@pytest.mark.parametrize("core,k,mlp,top", CASES)
def test_the_eager_loop_is_the_step_by_step_path(core, k, mlp, top):
    chunks = (7, 1, 30, 25)  # any lengths: the state carries nothing of a step's own
    loop, returns, sums, ref, ref_env, ref_returns, ref_sums = side_by_side(
        core, k, mlp, top, chunks, length=4
    )
    assert state_gap(ref.state, loop.state) == 0.0
    assert returns == ref_returns and len(returns) >= 10  # episodes ended inside the chunks
    # the per-step means summed per chunk, then the chunks': the order of the additions alone
    assert torch.allclose(sums, ref_sums, rtol=1e-14, atol=0)
    assert loop.env.get_state().keys() == ref_env.get_state().keys()
    for key, value in ref_env.get_state().items():
        saved = loop.env.get_state()[key]
        if isinstance(value, dict):
            assert all(np.array_equal(value[f], saved[f]) for f in value), key
        else:
            assert np.array_equal(value, saved), key


def test_the_loop_on_another_task():
    """delayed-cue has task arrays of its own in the env state."""
    loop, returns, _, ref, ref_env, ref_returns, _ = side_by_side(
        "lru-rtrl", 2, (), (), (40, 24), task="delayed-cue", delay=5, num_cues=3
    )
    assert state_gap(ref.state, loop.state) == 0.0
    assert returns == ref_returns and len(returns) >= 2


def test_chunks_end_at_every_boundary():
    from r2ac.rl.config import validate
    from r2ac.rl.presets import preset

    cfg = validate(preset("stream").updated(log_every=50, checkpoint_every=120, total_frames=300))
    ends, update = [], 0
    while update < cfg.updates_total:
        update += chunk_length(update, cfg, 64)
        ends.append(update)
    assert ends == [50, 64, 100, 120, 128, 150, 192, 200, 240, 250, 256, 300]


def test_run_refuses_a_chunk_out_of_range():
    env = tensor_form(numpy_envs(1, length=4))
    agent = make_agent("lru-rtrl", 1, env.observation_spec.shape[0], (), ())
    agent.observe_first(env.reset())
    loop = FusedStreamLoop(agent, env, compiled=False, nmax=8)
    for n in (0, 9):
        with pytest.raises(ValueError, match="1..8"):
            loop.run(n)


def test_tensor_form_only_where_there_is_one():
    assert tensor_form(numpy_envs(2, length=4)) is not None
    cut = builtin.make_builtin("memory-chain", 2, 0, length=4)
    cut.decorrelate(3, 0)
    assert tensor_form(cut) is None


@pytest.mark.slow
def test_the_compiled_loop_follows_the_eager_one():
    """Compiled: 256 steps in chunks within rounding of the per-step eager path (the same
    actions, hence the same episodes)."""
    pytest.importorskip("torch._inductor")
    loop, returns, sums, ref, _, ref_returns, ref_sums = side_by_side(
        "rtu-rtrl", 2, (5,), (4,), (64, 64, 64, 63, 1), compiled=True, length=4
    )
    assert state_gap(ref.state, loop.state) < 1e-9
    assert returns == ref_returns
    assert (sums - ref_sums).abs().max() < 1e-9


def test_the_tensor_form_checks_a_saved_state_as_the_numpy_env_does():
    from r2ac.errors import ConfigError

    env = tensor_form(numpy_envs(2, length=4))
    env.reset()
    state = env.get_state()
    state["t"] = np.array([100, 0])  # past the episode's end: no episode would end again
    with pytest.raises(ConfigError, match="t"):
        env.set_state(state)
    assert env.get_state()["t"].tolist() == [0, 0]  # nothing changed
