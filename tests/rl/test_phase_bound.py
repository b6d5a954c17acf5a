"""The RTU's and LRU's phase theta = exp(theta_log) stays in (0, max_phase] after every
update (pair_math.phase_log_bound: why): the batched modules, R2AC's learner, stream
AC(lambda) and QRC(lambda). The projection changes parameters, never gradients: the
exactness suites run with it in place."""

from __future__ import annotations

import math

import pytest
import torch

from r2ac.rl.learning.actor import Actor
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.stream.ac import StreamAC, StreamSettings
from r2ac.rl.stream.qrc import QRCSettings, StreamQRC
from r2ac.rtrl import pair_math as pm
from r2ac.rtrl.core import project_cores_
from r2ac.rtrl.pair_core import PairCore
from r2ac.rtrl.registry import make_core
from r2ac.rtrl.stacked import make_stacked_core

from .rl_helpers import tiny
from .test_stream import ENDS, SPACES, ScriptedEnv

BOUND = math.log(2 * math.pi)  # the cores' max_phase is 2 pi


def test_bound_is_the_init_range():
    assert pm.phase_log_bound(2 * math.pi) == pytest.approx(BOUND, abs=1e-15)
    _, theta_log = pm.ring_init(4096, 0.9, 0.999, 2 * math.pi)
    assert float(theta_log.max()) <= BOUND  # a fresh core is never clamped


@pytest.mark.parametrize("name", ["rtu-rtrl", "rtu-bptt", "lru-rtrl", "lru-bptt"])
def test_module_projection_clamps_the_phase_only(name):
    core = make_core(name, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        core.theta_log[0] = 5.0  # theta = 148: outside (0, 2 pi]
        core.theta_log[1] = -3.0
    before = {n: p.detach().clone() for n, p in core.named_parameters()}
    project_cores_(torch.nn.Sequential(core))
    assert float(core.theta_log[0].detach()) == BOUND
    assert float(core.theta_log[1].detach()) == -3.0  # small phases are left alone
    torch.testing.assert_close(core.theta_log.detach()[2:], before["theta_log"][2:], rtol=0, atol=0)
    for n, p in core.named_parameters():
        if n != "theta_log":
            torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=0)


@pytest.mark.parametrize("core_name", ["rtu-rtrl", "lru-rtrl"])
def test_learner_step_projects(core_name):
    cfg = tiny(core=core_name, learning_rate=1e-2)
    torch.manual_seed(0)
    env = make_env(cfg, cfg.runtime.num_envs, seed=7)
    agent = agent_for_env(cfg, env)
    core = next(m for m in agent.modules() if isinstance(m, PairCore))
    with torch.no_grad():
        core.theta_log[0] = 4.0
    start = core.theta_log.detach().clone()
    actor, learner = Actor(agent, env, seed=7, unroll_length=4), Learner(agent, cfg)
    seg, _ = actor.collect()
    learner.update(seg)
    env.close()
    theta_log, bound = core.theta_log.detach(), torch.tensor(BOUND, dtype=torch.float32)
    assert theta_log[0] == bound  # the float32 parameter holds the bound's float32 rounding
    assert theta_log.max() <= bound
    assert not torch.equal(theta_log[1:], start[1:])  # the others still learn


def _stream_core_rows(core: str):
    def make(k, d):
        return make_stacked_core(core, k, d, 4, torch.float64)

    return make


@pytest.mark.parametrize("core", ["rtu-rtrl", "rtu-bptt", "lru-rtrl"])
def test_stream_ac_projects_both_networks(core):
    space = SPACES["discrete"]
    env = ScriptedEnv(space, ENDS, seed=3)
    settings = StreamSettings(lr=1.0, entropy_cost=0.05)
    agent = StreamAC(_stream_core_rows(core), space, 3, [3, 4], settings, mlp=(5, 6),
                     dtype=torch.float64)  # fmt: skip
    theta_log = agent.params.body["core.theta_log"]  # (2K, U): actors', then critics'
    theta_log[:, 0] = 4.0
    start = theta_log.clone()
    agent.observe_first(env.reset().repeat(2, 0))
    for t in range(6):
        action = agent.act()
        res = env.step(action.numpy()[:1])
        rep = [a.repeat(2, 0) for a in (res.reward, res.obs, res.info["final_obs"],
                                        res.terminated, res.truncated)]  # fmt: skip
        agent.learn(*rep)
        if t == 0:
            assert torch.all(theta_log[:, 0] == BOUND)  # clamped at the first update
        assert float(theta_log.max()) <= BOUND  # and never above it since
    assert not torch.equal(theta_log[:, 1:], start[:, 1:])


def test_stream_qrc_projects_both_networks():
    space = SPACES["discrete"]
    env = ScriptedEnv(space, ENDS, seed=3)
    settings = QRCSettings(lr=0.5, h_lr=0.5, epsilon_start=0.5, epsilon_end=0.5)
    agent = StreamQRC(_stream_core_rows("rtu-rtrl"), space, 3, [3], settings, mlp=(5, 6),
                      dtype=torch.float64)  # fmt: skip
    nets = ((agent.q_net, agent.theta_q), (agent.h_net, agent.theta_h))

    def views():
        return [net.layout.views(theta.detach())["core.theta_log"] for net, theta in nets]

    for v in views():
        v[:, 0] = 4.0
    agent.observe_first(env.reset())
    for t in range(6):
        action = agent.act()
        res = env.step(action.numpy())
        agent.learn(res.reward, res.obs, res.info["final_obs"], res.terminated, res.truncated)
        for v in views():
            if t == 0:
                assert float(v[0, 0]) == BOUND
            assert float(v.max()) <= BOUND
