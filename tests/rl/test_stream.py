"""Stream AC(lambda) (r2ac/rl/stream/ac.py): exactness in float64.

- with a zero step size, each step's actor and critic gradients through an exact-RTRL core
  equal full BPTT through the stream's whole history (episode ends and time-limit
  truncations inside), the MLP below the core taking its current-step gradient only;
- a TBPTT(1) core's equal BPTT truncated at one step;
- the trace recursion equals its closed form (the sum of lambda-discounted gradients);
- ObGD's step size, the TD error's bootstrap, the normalisers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call

from r2ac.envs.base import ArraySpec, BatchedEnv, EpisodeStats, StepResult
from r2ac.envs.spaces import ActionSpace
from r2ac.rl.model.distributions import distribution
from r2ac.rl.running_stats import Moments, moments_var, welford_update
from r2ac.rl.stream.ac import StreamAC, StreamSettings, td_error
from r2ac.rl.stream.obgd import obgd_step_size
from r2ac.rtrl.registry import make_core
from r2ac.rtrl.stacked import MODULE_NAMES, make_stacked_core

F64 = torch.float64


class ScriptedEnv(BatchedEnv):
    """One stream of random vector observations; episodes terminate or are truncated at the
    given steps (the test's stream has both kinds of ends inside it)."""

    observation_spec = ArraySpec((3,), np.dtype(np.float32))

    def __init__(self, space: ActionSpace, ends: dict[int, str], seed: int = 0):
        self.num_envs, self.space, self.ends = 1, space, ends
        self.num_actions = space.nvec[0] if space.kind == "discrete" else 0
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.stats = EpisodeStats(1)

    @property
    def action_space(self):
        return self.space

    def _obs(self):
        return self.rng.normal(size=(1, 3)).astype(np.float32)

    def reset(self, seed=None):
        return self._obs()

    def step(self, actions):
        kind = self.ends.get(self.t)
        self.t += 1
        terminated = np.array([kind == "terminal"])
        truncated = np.array([kind == "truncated"])
        reward = self.rng.normal(size=1).astype(np.float32)
        info = self.stats.update(reward, terminated | truncated)
        final = self._obs()
        obs = self._obs() if kind else final
        info["final_obs"] = final
        return StepResult(obs, reward, terminated, truncated, info)


SPACES = {
    "discrete": ActionSpace.discrete(3),
    "multi_discrete": ActionSpace.multi_discrete([2, 3]),
    "box": ActionSpace.box([-1.0, -1.0], [1.0, 1.0]),
}
ENDS = {3: "terminal", 7: "truncated", 11: "terminal"}


def run_stream(
    core: str, space: ActionSpace, steps: int = 14, lr: float = 0.0, seed: int = 3,
    mlp: tuple[int, ...] = (5, 6), top: tuple[int, ...] = (), **settings,
):  # fmt: skip
    """Drive one float64 agent over the scripted stream; per step what the reference needs."""
    env = ScriptedEnv(space, ENDS, seed)

    def make(k, d):
        return make_stacked_core(core, k, d, 4, F64)

    settings = StreamSettings(lr=lr, entropy_cost=0.05, **settings)
    agent = StreamAC(make, space, 3, [seed], settings, mlp=mlp, dtype=F64, top=top)
    agent.observe_first(env.reset())
    record = []
    for _ in range(steps):
        x, reset = agent.x.clone(), agent.reset.clone()
        action = agent.act()
        res = env.step(action.numpy())
        info = agent.learn(res.reward, res.obs, res.info["final_obs"], res.terminated,
                           res.truncated)  # fmt: skip
        g_a, g_c = agent.last_grads
        record.append(dict(x=x, reset=reset, action=action, sign=torch.sign(info.delta),
                           g_a=g_a.clone(), g_c=g_c.clone(), z_a=agent.z_a.clone(),
                           z_c=agent.z_c.clone(), done=bool(res.terminated[0] | res.truncated[0])))  # fmt: skip
    return agent, record


def reference_grads(net, flat: torch.Tensor, record, t: int, out_fn, truncate_one: bool):
    """d out_fn(head output at step t) / d flat by autograd through an unrolled module of the
    core (BPTT over the stream from step 0, or TBPTT(1)); the MLP below the core gets only
    step t's gradient (its outputs at earlier steps are detached)."""
    flat = flat.detach().clone().requires_grad_()
    p = net.layout.views(flat)
    core_name = net.core.name
    module_name = core_name.replace("-rtrl", "-bptt")
    module = make_core(module_name, net.core.input_size, net.core.hidden_size).double()
    rename = MODULE_NAMES.get(core_name, {})
    weights = {rename.get(n[5:], n[5:]): v[0] for n, v in p.items() if n.startswith("core.")}
    start = t if truncate_one else 0
    feats = [net.features(p, record[s]["x"]) for s in range(start, t + 1)]
    feats = [f if s == len(feats) - 1 else f.detach() for s, f in enumerate(feats)]
    xs = torch.stack(feats)  # (T, 1, F)
    resets = torch.stack([record[s]["reset"] for s in range(start, t + 1)])  # (T, 1)
    if truncate_one:
        state = prev_state(net, flat, record, t, module)
    else:
        state = module.initial_state(1)
    y, _ = functional_call(module, weights, (xs, state), {"reset": resets})
    out = net._head(p, y[-1])
    (grad,) = torch.autograd.grad(out_fn(out), flat)
    return grad


def prev_state(net, flat, record, t, module):
    """The batched module's state after steps 0..t-1 (values only: TBPTT(1) stops there)."""
    p = net.layout.views(flat.detach())
    if t == 0:
        return module.initial_state(1)
    rename = MODULE_NAMES.get(net.core.name, {})
    weights = {rename.get(n[5:], n[5:]): v[0] for n, v in p.items() if n.startswith("core.")}
    with torch.no_grad():
        xs = torch.stack([net.features(p, record[s]["x"]) for s in range(t)])
        resets = torch.stack([record[s]["reset"] for s in range(t)])
        _, state = functional_call(module, weights, (xs, module.initial_state(1)),
                                   {"reset": resets})  # fmt: skip
    return type(state)(*(None if s is None else s.detach() for s in state))


def actor_objective(agent, rec):
    def fn(params):
        dist = distribution(agent.space, params)
        return (dist.log_prob(rec["action"]) + 0.05 * rec["sign"] * dist.entropy()).sum()

    return fn


def worst_gradient_error(agent, record, truncate_one: bool) -> float:
    """Largest |agent's gradient - reference| over the stream's steps, actor and critic."""
    worst = 0.0
    for t, rec in enumerate(record):
        ref_c = reference_grads(agent.critic, agent.theta_c, record, t, lambda v: v.sum(),
                                truncate_one)  # fmt: skip
        ref_a = reference_grads(agent.actor, agent.theta_a, record, t,
                                actor_objective(agent, rec), truncate_one)  # fmt: skip
        worst = max(worst, (ref_c - rec["g_c"]).abs().max().item(),
                    (ref_a - rec["g_a"]).abs().max().item())  # fmt: skip
    return worst


@pytest.mark.parametrize("core", ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "mingru-rtrl"])
def test_rtrl_gradients_equal_full_bptt(core):
    agent, record = run_stream(core, SPACES["discrete"])
    worst = worst_gradient_error(agent, record, truncate_one=False)
    assert worst < 1e-10, worst


@pytest.mark.parametrize("core", ["rtu-bptt", "elstm-bptt", "gru-bptt", "mingru-bptt"])
def test_tbptt1_gradients_equal_one_step_bptt(core):
    agent, record = run_stream(core, SPACES["discrete"], steps=9)
    worst = worst_gradient_error(agent, record, truncate_one=True)
    assert worst < 1e-10, worst


@pytest.mark.parametrize("core", ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "mingru-rtrl"])
@pytest.mark.parametrize("mlp", [(), (5,)], ids=["core-reads-obs", "layers-below"])
def test_layers_above_the_core_get_exact_gradients(core, mlp):
    """Layers between the core and the head (`--stream-top-mlp`): every gradient still equals
    full BPTT from the stream's first step; with no layer below the core (`--stream-mlp` with
    no width) that is every parameter's exact gradient."""
    agent, record = run_stream(core, SPACES["discrete"], mlp=mlp, top=(6, 5))
    assert "top1.w" in agent.actor.layout.views(agent.theta_a)
    worst = worst_gradient_error(agent, record, truncate_one=False)
    assert worst < 1e-10, worst


@pytest.mark.parametrize("kind", ["multi_discrete", "box"])
def test_rtrl_gradients_other_spaces(kind):
    agent, record = run_stream("rtu-rtrl", SPACES[kind], steps=9)
    for t, rec in enumerate(record):
        ref_a = reference_grads(agent.actor, agent.theta_a, record, t,
                                actor_objective(agent, rec), False)  # fmt: skip
        assert (ref_a - rec["g_a"]).abs().max().item() < 1e-10


def test_trace_equals_its_closed_form():
    """z_t = sum over the episode's steps s <= t of (gamma lambda)^(t-s) g_s, zeroed after an
    episode's end."""
    agent, record = run_stream("rtu-rtrl", SPACES["discrete"])
    decay = agent.settings.discount * agent.settings.trace_lambda
    start = 0
    for t, rec in enumerate(record):
        for key, g in (("z_a", "g_a"), ("z_c", "g_c")):
            closed = sum(decay ** (t - s) * record[s][g] for s in range(start, t + 1))
            expect = torch.zeros_like(closed) if rec["done"] else closed
            assert (rec[key] - expect).abs().max().item() < 1e-12
        if rec["done"]:
            start = t + 1


def test_obgd_step_size_bound():
    z = torch.tensor([[0.1, -0.2], [10.0, 5.0]], dtype=F64)
    delta = torch.tensor([0.5, -3.0], dtype=F64)
    step = obgd_step_size(delta, z, lr=1.0, kappa=2.0)
    # agent 0: M = 1 * 2 * max(0.5, 1) * 0.3 = 0.6 < 1: alpha; agent 1: M = 2 * 3 * 15 = 90
    assert torch.allclose(step, torch.tensor([1.0, 1.0 / 90.0], dtype=F64))


def test_td_error_bootstraps_on_truncation_not_on_terminal():
    r, v, vn = (torch.tensor([1.0, 1.0], dtype=F64) for _ in range(3))
    delta = td_error(r, v * 0.5, vn * 2.0, torch.tensor([True, False]), 0.9)
    assert delta.tolist() == [0.5, 1.0 + 0.9 * 2.0 - 0.5]


def test_welford_matches_numpy_and_the_in_place_normaliser():
    from r2ac.rl.running_stats import RunningStats

    x = torch.randn(50, 2, 3, dtype=F64)
    w = Moments(
        torch.zeros(2, dtype=F64), torch.zeros(2, 3, dtype=F64), torch.zeros(2, 3, dtype=F64)
    )
    stats = RunningStats(2, (3,))
    for row in x:
        w = welford_update(w, row)
        stats.update(row.numpy())
    assert torch.allclose(w.mean, x.mean(0))
    assert torch.allclose(moments_var(w), x.var(0, unbiased=True))
    assert torch.equal(torch.from_numpy(stats.var()), moments_var(w))  # the same arithmetic
    assert torch.equal(stats.moments().mean, w.mean)


def test_the_reference_tells_truncated_from_full():
    """The test above has teeth: a TBPTT(1) core's critic gradients differ from full BPTT."""
    agent, record = run_stream("rtu-bptt", SPACES["discrete"])
    worst = max(
        (reference_grads(agent.critic, agent.theta_c, record, t, lambda v: v.sum(), False)
         - rec["g_c"]).abs().max().item()
        for t, rec in enumerate(record)
    )  # fmt: skip
    assert worst > 1e-3
