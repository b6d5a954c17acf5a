"""Q(lambda) with intentional updates and Watkins's cut (r2ac/rl/stream/intentional_q.py,
docs/rules/intentional.md, "Q(lambda)"), float64:

- each step's grad Q(s_t, a_t) equals full BPTT through the stream's whole history (several
  episodes, terminal and truncated ends inside, non-greedy actions inside) for exact-RTRL
  cores, one-step BPTT for TBPTT(1) cores; Q(s_t, a_t) and max_a Q(s'_t, a) equal an
  autograd-path unroll of the same network;
- each update is step x delta x D^-1 z, z the closed form of the recorded gradients with the
  cuts (1e-12);
- the cut: after a non-greedy action the trace is zero and the core state (its RTRL
  sensitivities included) is the uncut run's; at an episode's end the trace is zero and the
  core restarts from its initial state;
- K agents together equal K runs alone; a checkpoint resumes bit-exact, and so does a run
  stopped and resumed through `r2ac train`; a QRC checkpoint is refused; the options' one-line
  errors.
"""

from __future__ import annotations

import csv
import json
import signal

import numpy as np
import pytest
import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.rl.presets import preset
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.stream.intentional import Intentional
from r2ac.rl.stream.intentional_q import IntentionalQSettings, StreamIntentionalQ
from r2ac.rl.stream.nets import mlp_forward
from r2ac.rl.stream.runtime import StreamRuntime
from r2ac.rtrl.stacked import make_stacked_core
from tests.rl.test_stream import ENDS, ScriptedEnv, reference_grads
from tests.rl.test_stream_train import _payload, _steps, _train

F64 = torch.float64
SPACE = ActionSpace.discrete(3)
ENDS_LONG = {**ENDS, 15: "truncated", 18: "terminal"}


def run_stream(core: str, steps: int = 14, seed: int = 3, epsilon: float = 0.5, lr: float = 0.0,
               mlp=(5, 6), top=(), trace_lambda: float = 0.8):  # fmt: skip
    """Drive one float64 agent over the scripted stream (its observations do not depend on
    the actions); per step what the reference needs."""
    env = ScriptedEnv(SPACE, ENDS_LONG, seed)

    def make(k, d):
        return make_stacked_core(core, k, d, 4, F64)

    settings = IntentionalQSettings(
        lr=lr, trace_lambda=trace_lambda, epsilon_start=epsilon, epsilon_end=epsilon
    )
    agent = StreamIntentionalQ(make, SPACE, 3, [seed], settings, mlp=mlp, dtype=F64, top=top)
    seen = {}
    q_next = agent._q_next_value

    def recording(x, state, saved):
        seen["q_next"] = q_next(x, state, saved)
        return seen["q_next"]

    agent._q_next_value = recording
    scale = agent.rewards.scale

    def scaled(reward, done, discount):
        seen["reward"] = scale(reward, done, discount)
        return seen["reward"]

    agent.rewards.scale = scaled
    agent.observe_first(env.reset())
    record = []
    for _ in range(steps):
        x, reset = agent.x.clone(), agent.reset.clone()
        action = agent.act()
        res = env.step(action.numpy())
        info = agent.learn(res.reward, res.obs, res.info["final_obs"], res.terminated,
                           res.truncated)  # fmt: skip
        final = np.asarray(res.info["final_obs"], dtype=np.float64).reshape(1, -1)
        record.append(dict(
            x=x, reset=reset, action=action, g_q=agent.last_grads[0].clone(),
            z_q=agent.z_q.clone(), state=[t.clone() for t in agent.state],
            x_final=torch.from_numpy(agent.obs_stats.normalise(final)),
            q_sa=info.value.clone(), q_next=seen["q_next"].clone(), delta=info.delta.clone(),
            terminated=bool(res.terminated[0]), done=bool(res.terminated[0] | res.truncated[0]),
            cut=bool(info.non_greedy[0]), step=info.step.clone(), reward=float(seen["reward"][0]),
        ))  # fmt: skip
    return agent, record


def _pick(action):
    return lambda out: out.gather(1, action.view(-1, 1)).sum()


def _unrolled_q(agent, record, t: int, x_last=None) -> torch.Tensor:
    """Q (1, A) at step t by the network's autograd path (StackedNet.step) from the stream's
    start; with x_last, one more step from the state after t on x_last, no reset."""
    net, flat = agent.q_net, agent.theta_q
    state = net.core.initial_state()
    for s in range(t + 1):
        out, state = net.step(flat, record[s]["x"], state, record[s]["reset"])
    if x_last is not None:
        out, _ = net.step(flat, x_last, state, torch.zeros(1, dtype=torch.bool))
    return out.detach()


@pytest.mark.parametrize("core", ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "mingru-rtrl"])
@pytest.mark.parametrize(("mlp", "top"), [((5, 6), ()), ((), (6,))], ids=["below", "above"])
def test_rtrl_gradients_equal_full_bptt(core, mlp, top):
    agent, record = run_stream(core, steps=20, mlp=mlp, top=top)
    assert any(r["cut"] and not r["done"] for r in record) and sum(r["done"] for r in record) >= 4
    worst = 0.0
    for t, rec in enumerate(record):
        ref = reference_grads(agent.q_net, agent.theta_q, record, t, _pick(rec["action"]), False)
        worst = max(worst, (ref - rec["g_q"]).abs().max().item())
    assert worst < 1e-10, worst


@pytest.mark.parametrize("core", ["rtu-bptt", "lru-bptt", "elstm-bptt", "mingru-bptt"])
def test_tbptt1_gradients_equal_one_step_bptt(core):
    agent, record = run_stream(core, steps=12)
    worst = 0.0
    for t, rec in enumerate(record):
        ref = reference_grads(agent.q_net, agent.theta_q, record, t, _pick(rec["action"]), True)
        worst = max(worst, (ref - rec["g_q"]).abs().max().item())
    assert worst < 1e-10, worst
    full = max(
        (reference_grads(agent.q_net, agent.theta_q, record, t, _pick(r["action"]), False)
         - r["g_q"]).abs().max().item()
        for t, r in enumerate(record)
    )  # fmt: skip
    assert full > 1e-4  # the reference tells a truncated gradient from the full one


@pytest.mark.parametrize("core", ["rtu-rtrl", "elstm-rtrl", "lru-rtrl", "mingru-rtrl", "rtu-bptt"])
def test_values_and_td_error_equal_an_unrolled_network(core):
    """Q(s_t, a_t) and max_a Q(s'_t, a) (from the state after s_t, no reset; the final
    observation where the episode ended) equal the autograd path's unroll; the TD error
    bootstraps on a truncation and not on a terminal step."""
    agent, record = run_stream(core, steps=20)
    for t, rec in enumerate(record):
        q = _unrolled_q(agent, record, t)
        assert abs(q[0, rec["action"][0]].item() - rec["q_sa"].item()) < 1e-12
        q_next = _unrolled_q(agent, record, t, rec["x_final"]).max(-1).values
        assert abs(q_next.item() - rec["q_next"].item()) < 1e-12
    kinds = {rec["terminated"] for rec in record if rec["done"]}
    assert kinds == {True, False}  # terminal and truncated ends both inside
    for rec in record:
        b = 0.0 if rec["terminated"] else agent.settings.discount
        expect = rec["reward"] + b * rec["q_next"].item() - rec["q_sa"].item()
        assert abs(rec["delta"].item() - expect) < 1e-12


def test_each_update_is_the_step_along_the_scaled_trace(monkeypatch):
    """theta_{t+1} - theta_t = step_t delta_t D_t^-1 z_t, z_t the closed form of the recorded
    gradients (zeroed after a non-greedy action or an episode's end), D_t from their squares,
    delta_t the TD error (clipped at 20 running RMS: not reached here)."""
    seen = []
    step = Intentional.step

    def recording_step(self, grads, delta, frozen=False):
        before = self.params.clone()
        out = step(self, grads, delta, frozen)
        seen.append((before, self.params.clone(), out.clone()))
        return out

    monkeypatch.setattr(Intentional, "step", recording_step)
    agent, record = run_stream("rtu-rtrl", steps=20, lr=1.0)
    assert len(seen) == len(record) == agent.optimizer.t
    assert any(r["cut"] and not r["done"] for r in record)
    decay = agent.settings.discount * agent.settings.trace_lambda
    rms = torch.zeros_like(record[0]["g_q"])
    z = torch.zeros_like(rms)
    for t, (rec, (before, after, steps)) in enumerate(zip(record, seen, strict=True), 1):
        g = rec["g_q"]
        rms = 0.999 * rms + 0.001 * g * g
        scale = (rms / (1 - 0.999**t)).sqrt() + 1e-8
        z = decay * z + g
        moved = after[0] - before[0]
        expect = steps[0, 0] * rec["delta"][0] * z / scale
        assert moved.abs().max().item() > 0
        assert (moved - expect).abs().max().item() < 1e-12
        assert abs(steps[0, 0].item() - rec["step"][0].item()) == 0
        if rec["done"] or rec["cut"]:
            z = torch.zeros_like(z)
        assert (rec["z_q"] - z).abs().max().item() < 1e-12


@pytest.mark.parametrize("core", ["rtu-rtrl", "mingru-rtrl"])
def test_the_cut_zeroes_the_trace_and_keeps_the_sensitivities(core):
    """A run with non-greedy actions against one without (epsilon 0; the scripted stream's
    observations do not depend on the actions; no learning): after each non-greedy action the
    trace is zero while the core's state and RTRL sensitivities are the uncut run's, bit for
    bit; the trace's closed form restarts there. At an episode's end the trace is zero in
    both, and the next step's core state is the initial state's step."""
    agent, cut = run_stream(core, steps=20, epsilon=0.5)
    _, plain = run_stream(core, steps=20, epsilon=0.0)
    decay = agent.settings.discount * agent.settings.trace_lambda
    cuts = [t for t, r in enumerate(cut) if r["cut"] and not r["done"]]
    assert len(cuts) >= 2 and not any(r["cut"] for r in plain)
    start = 0
    for t, (a, b) in enumerate(zip(cut, plain, strict=True)):
        for sa, sb in zip(a["state"], b["state"], strict=True):
            assert torch.equal(sa, sb)  # the cut leaves the core's state alone
        if t in cuts:
            assert a["z_q"].abs().max().item() == 0
            assert b["z_q"].abs().max().item() > 0
            if t:  # (the first observation normalises to 0: the first step's state is 0)
                assert any(s.abs().max().item() > 0 for s in a["state"][1:])  # kept
        closed = sum(decay ** (t - s) * cut[s]["g_q"] for s in range(start, t + 1))
        expect = torch.zeros_like(closed) if a["done"] or a["cut"] else closed
        assert (a["z_q"] - expect).abs().max().item() < 1e-12
        if a["done"]:
            assert a["z_q"].abs().max().item() == 0 and b["z_q"].abs().max().item() == 0
        if a["done"] or a["cut"]:
            start = t + 1
    # after an episode's end the core restarts: its state after the next step is the step
    # from the initial state (a fresh agent's first step on that observation)
    body = agent._q_parts[0]
    for t, rec in enumerate(cut[:-1]):
        if not rec["done"]:
            continue
        feat, _ = mlp_forward(body.ws, body.bs, cut[t + 1]["x"])
        core = agent.q_net.core
        _, fresh, _ = core.forward_manual(body.core, feat, core.initial_state(),
                                          torch.ones(1, dtype=torch.bool))  # fmt: skip
        assert cut[t + 1]["reset"].all()
        for sa, sb in zip(cut[t + 1]["state"], fresh, strict=True):
            assert torch.equal(sa, sb)


SMALL = dict(
    env_options=("length=4",), hidden_size=8, stream_mlp=(8,), progress=False,
    eval_at_end=False, total_frames=400,
)  # fmt: skip


def small(**kw):
    return preset("stream-intentional-q").updated(**{**SMALL, **kw})


@pytest.mark.parametrize("core", ["rtu-rtrl", "rtu-bptt", "mingru-rtrl"])
def test_k_agents_equal_k_runs_alone(core):
    together = StreamRuntime(small(num_agents=3, seed=5, core=core), dtype=F64)
    _steps(together, 60)
    assert isinstance(together.agent, StreamIntentionalQ)
    for k in range(3):
        alone = StreamRuntime(small(num_agents=1, seed=5 + k, core=core), dtype=F64)
        _steps(alone, 60)
        for a, b in ((together.agent.theta_q, alone.agent.theta_q),
                     (together.agent.z_q, alone.agent.z_q)):  # fmt: skip
            assert (a[k] - b[0]).abs().max().item() < 1e-10


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    from r2ac.runs import checkpoint

    cfg = small(num_agents=2, seed=1)
    full = StreamRuntime(cfg)
    _steps(full, 40)
    part = StreamRuntime(cfg)
    _steps(part, 25)
    path = checkpoint.save_atomic(_payload(part), tmp_path / "latest.pt")
    resumed = StreamRuntime(cfg)
    resumed.restore(checkpoint.load(path))
    _steps(resumed, 15)
    a, b = full.agent.state_dict(), resumed.agent.state_dict()
    for key in ("theta_q", "trace_q", "x", "reset"):
        assert torch.equal(a[key], b[key]), key
    for ta, tb in zip(a["core_q"], b["core_q"], strict=True):
        assert torch.equal(ta, tb)
    for key, value in a["intentional"].items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["intentional"][key])), key
    # a QRC run's checkpoint (no intentional state, an h network) is refused in one line
    qrc = StreamRuntime(preset("stream-q").updated(**{**SMALL, "num_agents": 2, "seed": 1}))
    _steps(qrc, 3)
    path = checkpoint.save_atomic(_payload(qrc), tmp_path / "qrc.pt")
    with pytest.raises(Exception, match="stream.state.intentional: missing") as err:
        StreamRuntime(cfg).restore(checkpoint.load(path))
    assert "\n" not in str(err.value)


def test_stop_and_resume_through_r2ac_train_is_bit_exact(tmp_path, monkeypatch):
    """SIGTERM at step 25 and --resume: the weights, trace, core state, the optimiser's state
    and metrics.csv row for row (but for wall times) as the uninterrupted run's."""
    flags = ["stream-q", "--preset", "stream-intentional-q", "--env-options", "length=4",
             "--hidden-size", "8", "--stream-mlp", "8", "--num-agents", "2",
             "--total-frames", "40", "--checkpoint-every", "15", "--log-every", "10",
             "--no-progress", "--no-eval-at-end"]  # fmt: skip
    full, part = tmp_path / "full", tmp_path / "part"
    assert _train([*flags, "--out-dir", str(full)]) == 0
    original = StreamRuntime.step
    count = {"n": 0}

    def step(self, tracker):
        original(self, tracker)
        count["n"] += 1
        if count["n"] == 25:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(StreamRuntime, "step", step)
    assert _train([*flags, "--out-dir", str(part)]) == 143
    monkeypatch.setattr(StreamRuntime, "step", original)
    assert _train(["--resume", str(part)]) == 0
    a = RunDir.open(full).load_checkpoint()
    b = RunDir.open(part).load_checkpoint()
    assert a["counters"]["update"] == b["counters"]["update"] == 40
    sa, sb = a["stream"]["state"], b["stream"]["state"]
    for key in ("theta_q", "trace_q", "x"):
        assert torch.equal(sa[key], sb[key]), key
    for ta, tb in zip(sa["core_q"], sb["core_q"], strict=True):
        assert torch.equal(ta, tb)
    for key, value in sa["intentional"].items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb["intentional"][key])), key
    rows = [list(csv.DictReader((d / "metrics.csv").open())) for d in (full, part)]
    assert len(rows[0]) == len(rows[1]) == 4
    assert all(r["step_q"] not in ("", "nan") for r in rows[0])
    for ra, rb in zip(*rows, strict=True):
        assert {k: v for k, v in ra.items() if k not in ("time_s", "fps")} == {
            k: v for k, v in rb.items() if k not in ("time_s", "fps")
        }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--h-learning-rate", "1e-3"], "--h-learning-rate: not read by stream-q's --stream-"),
        (["--qrc-beta", "0.5"], "--qrc-beta: not read by stream-q's --stream-optimizer"),
        (["--eta-q", "0"], "eta_q=0.0"),
        (["--eta-actor", "0.1"], "--eta-actor: not an option of `r2ac train stream-q`"),
        (["--trace-lambda", "1", "--discount", "1"], "discount x trace_lambda < 1"),
    ],
)
def test_bad_settings_are_one_line_errors(flags, message, capsys, tmp_path):
    code = _train(["stream-q", "--preset", "stream-intentional-q", "--out-dir",
                   str(tmp_path / "x"), *flags])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_qrc_refuses_eta_q_and_the_compiled_step_is_refused(capsys, tmp_path):
    from r2ac.errors import ConfigError
    from r2ac.rl.config import validate

    code = _train(["--preset", "stream-q", "--out-dir", str(tmp_path / "x"), "--eta-q", "0.3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--eta-q: not read by stream-q's QRC(lambda)" in err, err
    # refused in one line: today --compile-step is no option of stream-q at all; with the
    # compiled QRC step it is, and the intentional rule refuses it
    with pytest.raises(ConfigError, match="^--compile-step: ") as err:
        validate(small(compile_step=True))
    assert "\n" not in str(err.value)


def test_the_subcommand_with_the_intentional_rule_takes_its_preset():
    """`r2ac train stream-q --stream-optimizer intentional` starts from stream-intentional-q
    (QRC's SGD step 1e-4 as --learning-rate would scale the intentional step down 1e4x)."""
    from r2ac.rl.harness.train_cli import parse_config

    cfg = parse_config(["stream-q", "--stream-optimizer", "intentional"])
    assert cfg.flat() == preset("stream-intentional-q").flat()
    assert parse_config(["stream-q"]).flat() == preset("stream-q").flat()


def test_short_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    code = _train(["stream-q", "--preset", "stream-intentional-q", "--env-options", "length=4",
                   "--hidden-size", "8", "--stream-mlp", "8", "--num-agents", "2",
                   "--total-frames", "60", "--log-every", "20", "--eval-episodes", "4",
                   "--eval-sets", "1", "--no-progress", "--out-dir", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())["config"]["stream"]
    assert saved["stream_optimizer"] == "intentional" and saved["eta_q"] == 0.5
    assert len(json.loads((out / "eval.json").read_text())["agents"]) == 2
