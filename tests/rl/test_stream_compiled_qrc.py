"""QRC(lambda)'s functional step (r2ac/rl/stream/compiled_qrc.py) against StreamQRC, float64:
per step (the functional state set to StreamQRC's before each) the weights, the three traces,
the core states with their sensitivities, the normalisers, the actions and every QStepInfo
field agree to <= 1e-13 over 300 steps with episode ends of both kinds and non-greedy cuts
inside, the epsilon schedule crossing its end; the loop (compiled_loop.py) on a built-in env
gives the per-step path's numbers bit for bit for any chunk lengths; compiled (slow), both
stay within 1e-9 of eager. Measured: eager <= 2.9e-14 (lru-rtrl; 3.6e-15 to 7.1e-15 the
others), compiled per step 7.8e-14 over 256 steps, the compiled loop 2.6e-14 (its metric sums
2.3e-13)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.envs.tensor_builtin import TensorBuiltinEnv
from r2ac.rl.stream.compiled import FusedStreamAC
from r2ac.rl.stream.compiled_loop import FusedStreamLoop
from r2ac.rl.stream.compiled_spec import check_supported, state_of
from r2ac.rl.stream.envs import tensor_form
from r2ac.rl.stream.qrc import QRCSettings, StreamQRC
from r2ac.rtrl.stacked import make_stacked_core
from tests.rl.test_stream_compiled import Stream
from tests.rl.test_stream_compiled_loop import numpy_envs

F64 = torch.float64
EAGER_TOL = 1e-13
COMPILED_TOL = 1e-9


def make_agent(core, k, mlp, top=(), obs_size=4, actions=3, dtype=F64, eps_steps=150):
    def make(kk, d):
        return make_stacked_core(core, kk, d, 6, dtype)

    settings = QRCSettings(
        lr=0.01, h_lr=0.01, beta=0.5, epsilon_start=0.6, epsilon_end=0.1, epsilon_steps=eps_steps
    )
    seeds = [5 + i for i in range(k)]
    space = ActionSpace.discrete(actions)
    return StreamQRC(make, space, obs_size, seeds, settings, mlp, dtype, top)


def state_gap(a, b) -> float:
    pairs = [(a.params, b.params), (a.traces, b.traces), *zip(a.core, b.core, strict=True)]
    pairs += list(zip(a.extra, b.extra, strict=True))
    for name in ("obs_count", "obs_mean", "obs_p", "rew_count", "rew_mean", "rew_p", "ret", "x"):
        pairs.append((getattr(a, name), getattr(b, name)))
    assert torch.equal(a.reset, b.reset) and int(a.steps) == int(b.steps)
    return max((x - y).abs().max().item() for x, y in pairs)


def run_side_by_side(core, k, mlp, top=(), steps=300, compiled=False):
    """The largest gap per step (the functional state reset to StreamQRC's before each),
    and the counts of episode ends and non-greedy cuts."""
    agent = make_agent(core, k, mlp, top)
    stream = Stream(k, 4)
    agent.observe_first(stream.obs())
    fused = FusedStreamAC(agent, compiled=compiled)
    worst, ends, cuts = 0.0, 0, 0
    for t in range(steps):
        if t:
            fused.load(state_of(agent))
        a_ref, a_new = agent.act(), fused.act()
        assert torch.equal(a_ref, a_new), f"step {t}: actions differ"
        reward, obs, final, term, trunc = stream.step()
        ends += int((term | trunc).sum())
        i_ref = agent.learn(reward, obs, final, term, trunc)
        i_new = fused.learn(reward, obs, final, term, trunc)
        cuts += int(i_ref.non_greedy.sum())
        info_gap = max((a - b).abs().max().item() for a, b in zip(i_ref, i_new, strict=True))
        worst = max(worst, state_gap(state_of(agent), fused.state), info_gap)
    return worst, ends, cuts


CASES = [
    ("rtu-rtrl", 3, (5, 6), ()),
    ("lru-rtrl", 3, (), ()),
    ("rtu-bptt", 3, (5,), (4,)),
    ("lru-bptt", 3, (5,), ()),
]


@pytest.mark.parametrize("core,k,mlp,top", CASES)
def test_eager_step_equals_stream_qrc(core, k, mlp, top):
    worst, ends, cuts = run_side_by_side(core, k, mlp, top)
    assert ends >= 10 and cuts >= 20  # both cuts happen inside the stream
    assert worst <= EAGER_TOL


def test_covers_stream_qrc_and_not_a_frozen_one():
    from r2ac.errors import ConfigError

    agent = make_agent("lru-rtrl", 1, ())
    check_supported(agent)
    agent.frozen = True
    with pytest.raises(ConfigError, match="frozen"):
        check_supported(agent)
    agent.frozen = False

    @dataclasses.dataclass(frozen=True)
    class Wider(QRCSettings):
        optimizer: str = "sgd"

    agent.settings = Wider()
    check_supported(agent)  # a setting it does not read, at its default
    agent.settings = Wider(optimizer="other")
    with pytest.raises(ConfigError, match="QRC's optimizer not covered"):
        check_supported(agent)


def loop_side_by_side(core, k, mlp, top, chunks, compiled=False, **options):
    ref_env = numpy_envs(k, **options)
    loop_env = tensor_form(numpy_envs(k, **options))
    assert isinstance(loop_env, TensorBuiltinEnv)
    obs_size = ref_env.observation_spec.shape[0]
    actions = ref_env.action_space.nvec[0]
    ref_agent = make_agent(core, k, mlp, top, obs_size, actions, eps_steps=100)
    loop_agent = make_agent(core, k, mlp, top, obs_size, actions, eps_steps=100)
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
    return loop, returns, sums, ref, ref_returns, ref_sums


@pytest.mark.parametrize("chunks", [(7, 1, 30, 25), (64, 64, 22), (1,) * 20])
def test_the_eager_loop_is_the_step_by_step_path(chunks):
    loop, returns, sums, ref, ref_returns, ref_sums = loop_side_by_side(
        "rtu-rtrl", 3, (5,), (), chunks, length=4
    )
    assert state_gap(ref.state, loop.state) == 0.0
    assert returns == ref_returns and len(returns) >= 5
    assert torch.allclose(sums, ref_sums, rtol=1e-14, atol=0)


@pytest.mark.slow
def test_compiled_step_equals_stream_qrc():
    pytest.importorskip("torch._inductor")
    worst, _, _ = run_side_by_side("rtu-rtrl", 3, (5,), (4,), steps=256, compiled=True)
    assert worst <= COMPILED_TOL


@pytest.mark.slow
def test_the_compiled_loop_follows_the_eager_one():
    pytest.importorskip("torch._inductor")
    loop, returns, sums, ref, ref_returns, ref_sums = loop_side_by_side(
        "lru-rtrl", 3, (5,), (), (64, 64, 64, 63, 1), compiled=True, length=4
    )
    assert state_gap(ref.state, loop.state) < COMPILED_TOL
    assert returns == ref_returns
    assert (sums - ref_sums).abs().max() < COMPILED_TOL


def _runtime_cfg(**kw):
    from r2ac.rl.config import validate
    from r2ac.rl.presets import preset

    base = dict(env_options=("length=4",), core="lru-rtrl", hidden_size=8, stream_mlp=(5,),
                prev_action=True, progress=False, eval_at_end=False, num_agents=3, seed=3,
                log_every=10, epsilon_fraction=0.5, total_frames=400)  # fmt: skip
    return validate(preset("stream-q").updated(**{**base, **kw}))


def test_compile_step_is_an_option_of_stream_q():
    from r2ac.errors import ConfigError

    assert _runtime_cfg(compile_step=True).stream.compile_step
    with pytest.raises(ConfigError, match="--compile-step: the compiled step has the") as err:
        _runtime_cfg(core="elstm-rtrl", compile_step=True)
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("env", ["builtin/memory-chain", "gym/CartPole-v1"])
def test_the_compiled_runtime_follows_the_eager_one_and_resumes_exactly(tmp_path, env):
    """stream-q --compile-step through the runtime (float64): 120 steps within rounding of the
    eager runtime's (memory-chain inside the loop, CartPole beside the per-step function); a
    checkpoint at step 70 restored into a fresh compiled runtime continues bit for bit as the
    uninterrupted compiled run (memory-chain: gymnasium's envs have no saved state)."""
    from r2ac.rl.run.tracker import Tracker
    from r2ac.rl.stream.runtime import StreamRuntime
    from r2ac.runs import checkpoint

    def run(cfg, n, rt=None):
        rt = rt or StreamRuntime(cfg, dtype=torch.float64)
        tracker = getattr(rt, "tracker_", None) or Tracker(cfg, None)
        rt.tracker_ = tracker
        while tracker.update < n:
            rt.step(tracker)
        assert tracker.update == n
        rt._sync()
        return rt

    keys = ("theta_q", "theta_h", "trace_q", "trace_h", "trace_h_value")
    options = {} if env.startswith("builtin/") else {"env": env, "env_options": ()}
    eager = run(_runtime_cfg(**options), 120)
    compiled = run(_runtime_cfg(compile_step=True, **options), 120)
    assert (compiled.loop is not None) == env.startswith("builtin/")
    assert (compiled.fused is not None) == (not env.startswith("builtin/"))
    a, b = eager.agent.state_dict(), compiled.agent.state_dict()
    assert a["steps"] == b["steps"] == 120
    for key in keys:
        assert (a[key] - b[key]).abs().max() < 1e-9, key
    if options:
        return
    part = run(_runtime_cfg(compile_step=True, **options), 70)
    path = checkpoint.save_atomic(part._payload(part.tracker_), tmp_path / "latest.pt")
    resumed = StreamRuntime(_runtime_cfg(compile_step=True, **options), dtype=torch.float64)
    resumed.restore(checkpoint.load(path))
    resumed.tracker_ = Tracker(resumed.cfg, None, resumed.saved_counters)
    run(None, 120, resumed)
    c = resumed.agent.state_dict()
    for key in (*keys, "x"):
        assert torch.equal(b[key], c[key]), key
