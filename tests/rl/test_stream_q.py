"""QRC(lambda) (r2ac/rl/stream/qrc.py), float64:

- with a zero step size, each step's grad Q(s_t, a_t), grad h(s_t, a_t) and
  grad max_a Q(s'_t, a) through an exact-RTRL core equal full BPTT through the stream's
  whole history (episode ends and time-limit truncations inside; the reference of
  tests/rl/test_stream.py);
- the QRC update equals a direct transcription of its equations on a tiny linear case
  (lambda = 0: Patterson et al.'s QRC; lambda > 0: the anchor's QRC(lambda));
- the trace recursion equals its closed form (cut at episode ends and non-greedy actions);
- K agents together equal K runs alone; a checkpoint round trip is bit-exact;
- a Box action space is a one-line ConfigError.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.presets import preset
from r2ac.rl.stream.qrc import (
    QRCSettings,
    QRCTraces,
    StreamQRC,
    cut_traces,
    epsilon_at,
    epsilon_greedy,
    q_td_error,
    qrc_directions,
    qrc_traces,
)
from r2ac.rl.stream.runtime import StreamRuntime
from r2ac.rtrl.stacked import make_stacked_core
from tests.rl.test_stream import ENDS, ScriptedEnv, reference_grads

F64 = torch.float64
SPACE = ActionSpace.discrete(3)


def run_stream(
    core: str, steps: int = 14, seed: int = 3, epsilon: float = 0.5, lr: float = 0.0,
    mlp: tuple[int, ...] = (5, 6), top: tuple[int, ...] = (),
):  # fmt: skip
    """Drive one float64 QRC agent over the scripted stream (terminal and truncated ends
    inside); per step what the reference needs."""
    env = ScriptedEnv(SPACE, ENDS, seed)

    def make(k, d):
        return make_stacked_core(core, k, d, 4, F64)

    settings = QRCSettings(lr=lr, h_lr=lr, epsilon_start=epsilon, epsilon_end=epsilon)
    agent = StreamQRC(make, SPACE, 3, [seed], settings, mlp=mlp, dtype=F64, top=top)
    agent.observe_first(env.reset())
    record = []
    for _ in range(steps):
        x, reset = agent.x.clone(), agent.reset.clone()
        action = agent.act()
        res = env.step(action.numpy())
        info = agent.learn(res.reward, res.obs, res.info["final_obs"], res.terminated,
                           res.truncated)  # fmt: skip
        final = np.asarray(res.info["final_obs"], dtype=np.float64).reshape(agent.k, -1)
        x_final = torch.from_numpy(agent.obs_stats.normalise(final))
        g_q, g_h, g_next = agent.last_grads
        record.append(dict(
            x=x, reset=reset, action=action, x_final=x_final, g_q=g_q.clone(), g_h=g_h.clone(),
            g_next=g_next.clone(), h=info.h.clone(), z_q=agent.z_q.clone(),
            z_h=agent.z_h.clone(), z_b=agent.z_b.clone(),
            done=bool(res.terminated[0] | res.truncated[0]), cut=bool(info.non_greedy[0]),
        ))  # fmt: skip
    return agent, record


def _pick(action):
    return lambda out: out.gather(1, action.view(-1, 1)).sum()


@pytest.mark.parametrize("core", ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "mingru-rtrl"])
@pytest.mark.parametrize(("mlp", "top"), [((5, 6), ()), ((), (6,))], ids=["below", "above"])
def test_rtrl_gradients_equal_full_bptt(core, mlp, top):
    agent, record = run_stream(core, mlp=mlp, top=top)
    worst = 0.0
    for t, rec in enumerate(record):
        ref_q = reference_grads(agent.q_net, agent.theta_q, record, t, _pick(rec["action"]), False)
        ref_h = reference_grads(agent.h_net, agent.theta_h, record, t, _pick(rec["action"]), False)
        # max_a Q(s'_t, a): one more step from the state after s_t, no reset (the final
        # observation when the episode ended there)
        longer = record[: t + 1] + [dict(x=rec["x_final"], reset=torch.zeros(1, dtype=torch.bool))]
        ref_next = reference_grads(agent.q_net, agent.theta_q, longer, t + 1,
                                   lambda q: q.max(-1).values.sum(), False)  # fmt: skip
        worst = max(worst, (ref_q - rec["g_q"]).abs().max().item(),
                    (ref_h - rec["g_h"]).abs().max().item(),
                    (ref_next - rec["g_next"]).abs().max().item())  # fmt: skip
    assert worst < 1e-10, worst


def test_the_reference_tells_truncated_from_full():
    agent, record = run_stream("rtu-bptt")
    worst = max(
        (reference_grads(agent.q_net, agent.theta_q, record, t, _pick(rec["action"]), False)
         - rec["g_q"]).abs().max().item()
        for t, rec in enumerate(record)
    )  # fmt: skip
    assert worst > 1e-3


def test_trace_equals_its_closed_form():
    """z_t = sum over s since the last cut of (gamma lambda)^(t-s) g_s (z_b: of h(s_s, a_s)),
    zeroed after an episode's end or a non-greedy action."""
    agent, record = run_stream("rtu-rtrl", steps=20)
    assert any(r["cut"] for r in record) and any(r["done"] for r in record)
    decay = agent.settings.discount * agent.settings.trace_lambda
    start = 0
    for t, rec in enumerate(record):
        for key, g in (("z_q", "g_q"), ("z_h", "g_h"), ("z_b", "h")):
            closed = sum(decay ** (t - s) * record[s][g] for s in range(start, t + 1))
            expect = torch.zeros_like(closed) if rec["done"] or rec["cut"] else closed
            assert (rec[key] - expect).abs().max().item() < 1e-12
        if rec["done"] or rec["cut"]:
            start = t + 1


@pytest.mark.parametrize("lam", [0.0, 0.9])
def test_qrc_update_equals_its_equations_on_a_linear_case(lam):
    """Linear Q(s, a) = w . phi(s, a), h(s, a) = v . phi(s, a) (phi: the state's features in
    action a's block): the pure functions against the equations written out in numpy."""
    rng = np.random.default_rng(0)
    n_feat, n_act, gamma, alpha, alpha_h, beta = 4, 3, 0.9, 0.1, 0.05, 0.5
    p = n_feat * n_act

    def phi(s, a):
        out = np.zeros(p)
        out[a * n_feat : (a + 1) * n_feat] = s
        return out

    w, v = rng.normal(size=p), rng.normal(size=p)
    z, z_h, z_b = np.zeros(p), np.zeros(p), 0.0
    tw, tv = torch.tensor(w)[None].clone(), torch.tensor(v)[None].clone()
    traces = QRCTraces(torch.zeros(1, p, dtype=F64), torch.zeros(1, p, dtype=F64),
                       torch.zeros(1, dtype=F64))  # fmt: skip
    s = rng.normal(size=n_feat)
    for t in range(12):
        a, r, s2 = int(rng.integers(n_act)), rng.normal(), rng.normal(size=n_feat)
        terminal, cut = t == 5, t in (3, 8)
        # numpy: the equations
        q_next = [w @ phi(s2, b) for b in range(n_act)]
        a_star = int(np.argmax(q_next))
        bootstrap = 0.0 if terminal else gamma
        delta = r + bootstrap * q_next[a_star] - w @ phi(s, a)
        h = v @ phi(s, a)
        z = gamma * lam * z + phi(s, a)
        z_h = gamma * lam * z_h + phi(s, a)
        z_b = gamma * lam * z_b + h
        if lam == 0.0:  # Patterson et al.'s QRC (TDC with the regularised h)
            w_new = w + alpha * (delta * phi(s, a) - bootstrap * h * phi(s2, a_star))
            v_new = v + alpha_h * ((delta - h) * phi(s, a) - beta * v)
        else:  # the anchor's QRC(lambda)
            grad_delta = bootstrap * phi(s2, a_star) - phi(s, a)
            w_new = w + alpha * (delta * z - z_b * grad_delta - h * phi(s, a))
            v_new = v + alpha_h * (delta * z_h - h * phi(s, a) - beta * v)
        w, v = w_new, v_new
        if terminal or cut:
            z, z_h, z_b = np.zeros(p), np.zeros(p), 0.0
        # torch: the pure functions
        g = torch.tensor(phi(s, a))[None]
        g_next = torch.tensor(phi(s2, a_star))[None]
        h_t = (tv * g).sum(1)
        d = q_td_error(torch.tensor([r], dtype=F64), (tw * g).sum(1), (tw * g_next).sum(1),
                       torch.tensor([terminal]), gamma)  # fmt: skip
        qrc_traces(traces, g, g, h_t, gamma * lam)
        d_q, d_h = qrc_directions(d, traces, g, g_next, g, h_t,
                                  torch.tensor([bootstrap], dtype=F64), tv, beta)  # fmt: skip
        tw, tv = tw + alpha * d_q, tv + alpha_h * d_h
        cut_traces(traces, torch.tensor([terminal or cut]))
        assert abs(d.item() - delta) < 1e-12
        assert np.abs(tw[0].numpy() - w).max() < 1e-12 and np.abs(tv[0].numpy() - v).max() < 1e-12
        assert (
            np.abs(traces.z_q[0].numpy() - z).max() < 1e-12 and abs(traces.z_b.item() - z_b) < 1e-12
        )
        s = s2


def test_epsilon_schedule_and_greedy_choice():
    assert epsilon_at(0, 1.0, 0.01, 100) == 1.0
    assert abs(epsilon_at(50, 1.0, 0.01, 100) - 0.505) < 1e-12
    assert epsilon_at(500, 1.0, 0.01, 100) == 0.01
    q = torch.tensor([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    u = torch.tensor([[0.9, 0.1], [0.1, 0.1], [0.1, 0.5]], dtype=F64)  # greedy, random 0, random 1
    action, non_greedy = epsilon_greedy(q, u, 0.5)
    assert action.tolist() == [1, 0, 1] and non_greedy.tolist() == [False, True, False]


SMALL = dict(
    env_options=("length=4",), hidden_size=8, stream_mlp=(8,), progress=False,
    eval_at_end=False, learning_rate=1e-2, h_learning_rate=1e-3, total_frames=400,
)  # fmt: skip


def small(**kw):
    return preset("stream-q").updated(**{**SMALL, **kw})


def _steps(rt: StreamRuntime, n: int) -> None:
    """n steps, recorded by a tracker of the runtime's own (its counters go into _payload)."""
    from r2ac.rl.run.tracker import Tracker

    if not hasattr(rt, "test_tracker"):
        rt.test_tracker = Tracker(rt.cfg, None)
    for _ in range(n):
        rt.step(rt.test_tracker)


def _payload(rt: StreamRuntime) -> dict:
    return rt._payload(rt.test_tracker)


@pytest.mark.parametrize("core", ["rtu-rtrl", "mingru-rtrl"])
def test_k_agents_equal_k_runs_alone(core):
    together = StreamRuntime(small(num_agents=3, seed=5, core=core), dtype=F64)
    _steps(together, 60)
    for k in range(3):
        alone = StreamRuntime(small(num_agents=1, seed=5 + k, core=core), dtype=F64)
        _steps(alone, 60)
        for a, b in ((together.agent.theta_q, alone.agent.theta_q),
                     (together.agent.theta_h, alone.agent.theta_h),
                     (together.agent.z_b, alone.agent.z_b)):  # fmt: skip
            assert (a[k] - b[0]).abs().max().item() < 1e-10


@pytest.mark.parametrize("core", ["rtu-rtrl", "mingru-rtrl"])
def test_checkpoint_round_trip_is_bit_exact(tmp_path, core):
    from r2ac.runs import checkpoint

    cfg = small(num_agents=2, seed=1, core=core)
    full = StreamRuntime(cfg)
    _steps(full, 40)
    part = StreamRuntime(cfg)
    _steps(part, 25)
    path = checkpoint.save_atomic(_payload(part), tmp_path / "latest.pt")
    resumed = StreamRuntime(cfg)
    resumed.restore(checkpoint.load(path))
    _steps(resumed, 15)
    a, b = full.agent.state_dict(), resumed.agent.state_dict()
    for key in ("theta_q", "theta_h", "trace_q", "trace_h", "trace_h_value"):
        assert torch.equal(a[key], b[key]), key
    for ta, tb in zip(a["core_q"] + a["core_h"], b["core_q"] + b["core_h"], strict=True):
        assert torch.equal(ta, tb)


def test_box_actions_are_a_one_line_error():
    box = ActionSpace.box([-1.0], [1.0])
    with pytest.raises(ConfigError) as err:
        StreamQRC(lambda k, d: make_stacked_core("rtu-rtrl", k, d, 4), box, 3, [0], QRCSettings())
    assert "\n" not in str(err.value) and "Discrete" in str(err.value)


def test_bad_epsilon_is_a_one_line_error():
    from r2ac.rl.config import validate

    with pytest.raises(ConfigError) as err:
        validate(small(epsilon_end=1.5))
    assert "\n" not in str(err.value) and "epsilon_end" in str(err.value)
