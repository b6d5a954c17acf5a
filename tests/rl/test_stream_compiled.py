"""The functional stream step (r2ac/rl/learning/stream_step.py) against StreamAC, float64.

Both run side by side from the same seeds over the same stream (random observations and
rewards, episodes that terminate and that are truncated inside it, K agents with their own
ends). Step by step (the functional state set to StreamAC's before each step): the weights,
traces, core states (with their sensitivities), normalisers, actions and TD errors agree to
<= 1e-12, eager and compiled (measured: <= 1.5e-14 eager, <= 1.1e-13 compiled over 300
steps). Running free, the actions stay identical and the gaps grow with the learning
(test_eager_step_runs_free_with_stream_ac). In float32 (not tested here) compiled and
StreamAC agree step by step to ~6e-5 on values of order 10-100; running free they part
after a few hundred steps, as the eager functional step and StreamAC do in float32 alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.stream.ac import StreamAC, StreamSettings
from r2ac.rl.stream.compiled import FusedStreamAC
from r2ac.rl.stream.compiled_spec import check_supported, state_of
from r2ac.rtrl.stacked import make_stacked_core

F64 = torch.float64
EAGER_TOL = 1e-12
COMPILED_TOL = 1e-12
FREE_TOL = 1e-6


class Stream:
    """K streams of normal observations (obs_size) and rewards; stream k's episodes end at
    random steps, terminated or truncated (final_obs then differs from the next obs)."""

    def __init__(self, k: int, obs_size: int, seed: int = 0):
        self.rng, self.k, self.obs_size = np.random.default_rng(seed), k, obs_size

    def obs(self):
        return self.rng.normal(size=(self.k, self.obs_size)).astype(np.float32)

    def step(self):
        terminated = self.rng.random(self.k) < 0.04
        truncated = ~terminated & (self.rng.random(self.k) < 0.04)
        reward = self.rng.normal(size=self.k).astype(np.float32)
        final = self.obs()
        nxt = np.where((terminated | truncated)[:, None], self.obs(), final)
        return reward, nxt, final, terminated, truncated


def make_agent(
    core: str, k: int, mlp, top=(), hidden: int = 6, actions: int = 3, seed: int = 5, dtype=F64
):
    def make(kk, d):
        return make_stacked_core(core, kk, d, hidden, dtype)

    settings = StreamSettings(lr=1.0, entropy_cost=0.05)
    seeds = [seed + i for i in range(k)]
    return StreamAC(make, ActionSpace.discrete(actions), 4, seeds, settings, mlp, dtype, top)


def worst_gap(agent: StreamAC, fused: FusedStreamAC) -> float:
    """Largest |difference| over everything the agent carries."""
    a, b = state_of(agent), fused.state
    pairs = [(a.params, b.params), (a.traces, b.traces), *zip(a.core, b.core, strict=True)]
    for name in ("obs_count", "obs_mean", "obs_p", "rew_count", "rew_mean", "rew_p", "ret", "x"):
        pairs.append((getattr(a, name), getattr(b, name)))
    assert torch.equal(a.reset, b.reset) and int(a.steps) == int(b.steps)
    return max((x - y).abs().max().item() for x, y in pairs)


def run_side_by_side(core, k, mlp, top=(), steps=300, compiled=False, resync=True, dtype=F64):
    """The largest gap over `steps` steps. resync: the functional state is set to StreamAC's
    before every step (each step's gap is that step's rounding alone); else both run free
    (the gaps of earlier steps carried and amplified by the learning that follows)."""
    agent = make_agent(core, k, mlp, top, dtype=dtype)
    stream = Stream(k, 4)
    agent.observe_first(stream.obs())
    fused = FusedStreamAC(agent, compiled=compiled)
    worst, ends = 0.0, 0
    for t in range(steps):
        if resync and t:
            fused.load(state_of(agent))
        a_ref, a_new = agent.act(), fused.act()
        assert torch.equal(a_ref, a_new), f"step {t}: actions differ"
        reward, obs, final, term, trunc = stream.step()
        ends += int((term | trunc).sum())
        i_ref = agent.learn(reward, obs, final, term, trunc)
        i_new = fused.learn(reward, obs, final, term, trunc)
        # every StepInfo field (the value V(s_t) too, read before the step's buffers change)
        info_gap = max((a - b).abs().max().item() for a, b in zip(i_ref, i_new, strict=True))
        gap = max(worst_gap(agent, fused), info_gap)
        worst = max(worst, gap)
    assert ends >= 5  # episode ends of both kinds inside the stream
    return worst


CASES = [
    ("rtu-rtrl", 2, (5, 6), ()),
    ("rtu-bptt", 2, (5, 6), ()),
    ("lru-rtrl", 2, (), ()),  # the matched network: no layers below the core
    ("lru-bptt", 1, (5,), (4,)),
    ("lru-rtrl", 3, (5,), (4,)),
]


@pytest.mark.parametrize("core,k,mlp,top", CASES)
def test_eager_step_equals_stream_ac(core, k, mlp, top):
    assert run_side_by_side(core, k, mlp, top) <= EAGER_TOL


@pytest.mark.slow
@pytest.mark.parametrize("core,k,mlp,top", [CASES[0], CASES[2]])
def test_compiled_step_equals_stream_ac(core, k, mlp, top):
    pytest.importorskip("torch._inductor")
    assert run_side_by_side(core, k, mlp, top, steps=300, compiled=True) <= COMPILED_TOL


def test_refuses_what_it_does_not_cover():
    def make(kk, d):
        return make_stacked_core("elstm-rtrl", kk, d, 4, F64)

    agent = StreamAC(make, ActionSpace.discrete(2), 3, [0], StreamSettings(), (5,), F64)
    with pytest.raises(ConfigError, match="core elstm-rtrl"):
        check_supported(agent)
    box = ActionSpace.box([-1.0], [1.0])
    agent = make_agent("rtu-rtrl", 1, (5,))
    agent.space = box
    with pytest.raises(ConfigError, match="action space"):
        check_supported(agent)


@pytest.mark.parametrize("core,k,mlp,top", CASES)
def test_eager_step_runs_free_with_stream_ac(core, k, mlp, top):
    """Run free for 300 steps: the actions stay identical; the one-ulp differences of each
    step's rounding (StreamAC's complex products, whose ATen kernels round their vector body
    and their scalar tail differently, against real planes here) are carried by the learning
    and grow, e-fold in ~20 steps on these small float64 networks at lr 1 (measured: ~1e-15
    at step 50, 1e-12 at 100, up to ~2e-9 at 300), the same growth any rounding difference
    has (another CPU's kernels, another K's loop order)."""
    assert run_side_by_side(core, k, mlp, top, resync=False) <= FREE_TOL


def test_eager_step_with_large_buffers():
    """Weights, traces and sensitivities past OWN_BUFFER elements travel as their own
    buffers: the same numbers."""
    agent = make_agent("rtu-rtrl", 2, (64,), hidden=32)
    fused = FusedStreamAC(agent, compiled=False)
    assert fused.packing.own >= 2  # params, traces (the cores travel apart)
    stream = Stream(2, 4)
    agent.observe_first(stream.obs())
    fused.load(state_of(agent))
    for _ in range(40):
        assert torch.equal(agent.act(), fused.act())
        out = stream.step()
        agent.learn(*out)
        fused.learn(*out)
        assert worst_gap(agent, fused) <= EAGER_TOL
        fused.load(state_of(agent))


# ---------------------------------------------------------------- through the runtime


def _runtime_cfg(**kw):
    from r2ac.rl.config import validate
    from r2ac.rl.presets import preset

    base = dict(env_options=("length=4",), core="lru-rtrl", hidden_size=8, stream_mlp=(),
                prev_action=True, progress=False, eval_at_end=False, num_agents=2, seed=3,
                log_every=10)  # fmt: skip
    return validate(preset("stream").updated(**{**base, **kw}))


def test_compile_step_needs_a_core_it_has():
    from r2ac.rl.config import validate
    from r2ac.rl.presets import preset

    with pytest.raises(ConfigError, match="--compile-step: the compiled step has the") as err:
        validate(preset("stream").updated(core="elstm-rtrl", compile_step=True))
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("env", ["builtin/memory-chain", "gym/CartPole-v1"])
def test_the_compiled_runtime_follows_the_eager_one_and_resumes_exactly(tmp_path, env):
    """--compile-step through the runtime (float64): 120 steps equal the eager runtime's within
    rounding, with the same actions. memory-chain runs inside the compiled loop, CartPole
    (gymnasium) beside the per-step compiled function. memory-chain: a checkpoint at step 70
    restored into a fresh compiled runtime continues bit for bit as the uninterrupted run."""
    from r2ac.rl.run.tracker import Tracker
    from r2ac.rl.stream.runtime import StreamRuntime
    from r2ac.runs import checkpoint

    def run(cfg, n, rt=None):
        rt = rt or StreamRuntime(cfg, dtype=torch.float64)
        tracker = getattr(rt, "tracker_", None) or Tracker(cfg, None)
        rt.tracker_ = tracker
        while tracker.update < n:  # the compiled loop runs up to the next multiple of 10
            rt.step(tracker)
        assert tracker.update == n
        rt._sync()
        return rt

    options = {} if env.startswith("builtin/") else {"env": env, "env_options": ()}
    eager = run(_runtime_cfg(**options), 120)
    compiled = run(_runtime_cfg(compile_step=True, **options), 120)
    assert (compiled.loop is not None) == env.startswith("builtin/")
    assert (compiled.fused is not None) == (not env.startswith("builtin/"))
    a, b = eager.agent.state_dict(), compiled.agent.state_dict()
    assert a["steps"] == b["steps"] == 120
    for key in ("theta_actor", "theta_critic", "trace_actor", "trace_critic"):
        assert (a[key] - b[key]).abs().max() < 1e-9, key
    if options:  # gymnasium's envs have no get_state: a resumed run restarts its episodes
        return
    part = run(_runtime_cfg(compile_step=True, **options), 70)
    path = checkpoint.save_atomic(part._payload(part.tracker_), tmp_path / "latest.pt")
    resumed = StreamRuntime(_runtime_cfg(compile_step=True, **options), dtype=torch.float64)
    resumed.restore(checkpoint.load(path))
    resumed.tracker_ = Tracker(resumed.cfg, None, resumed.saved_counters)
    run(None, 120, resumed)
    c = resumed.agent.state_dict()
    for key in ("theta_actor", "theta_critic", "trace_actor", "trace_critic", "x"):
        assert torch.equal(b[key], c[key]), key
