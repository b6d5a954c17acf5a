"""Stream AC(lambda) with intentional updates (r2ac/rl/stream/intentional.py,
docs/rules/intentional.md):

- the gradients each update uses equal full BPTT (exact RTRL) or one-step BPTT (TBPTT(1)) in
  float64, and each update is step x delta x D^-1 z with z the closed-form trace of them;
- the rule's defining property: on a model linear in theta, with no trace (gamma lambda = 0) and
  a steady gradient, every update moves the output by exactly eta x the clipped TD error (the
  actor's: its normalised delta); a two-step case with a trace against numbers by hand;
- K agents equal K runs alone; a checkpoint resumes bit-exact; the options' one-line errors; a
  short run end to end.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from r2ac.rl.stream.intentional import Intentional, intentional_step_size
from r2ac.rl.stream.runtime import StreamRuntime
from tests.rl.test_stream import SPACES, run_stream, worst_gradient_error
from tests.rl.test_stream_train import SMALL, _payload, _steps, _train

F64 = torch.float64
INTENT = dict(optimizer="intentional")


@pytest.mark.parametrize("core", ["rtu-rtrl", "elstm-rtrl", "mingru-rtrl"])
def test_rtrl_gradients_equal_full_bptt(core):
    agent, record = run_stream(core, SPACES["discrete"], **INTENT)
    assert isinstance(agent.optimizer, Intentional)
    worst = worst_gradient_error(agent, record, truncate_one=False)
    assert worst < 1e-10, worst


@pytest.mark.parametrize("core", ["rtu-bptt", "mingru-bptt"])
def test_tbptt1_gradients_equal_one_step_bptt(core):
    agent, record = run_stream(core, SPACES["discrete"], steps=9, **INTENT)
    worst = worst_gradient_error(agent, record, truncate_one=True)
    assert worst < 1e-10, worst


def test_each_update_is_the_step_along_the_scaled_trace(monkeypatch):
    """With a step size: theta_{t+1} - theta_t = step_t delta_n D_t^-1 z_t for the actor and
    the critic, z_t the closed form of the recorded gradients (zeroed after an episode's end),
    D_t from their squares."""
    seen = []
    step, deltas = Intentional.step, Intentional.deltas

    def recording_deltas(self, delta):
        self.seen_deltas = deltas(self, delta)
        return self.seen_deltas

    def recording_step(self, grads, delta, frozen=False):
        before = self.params.clone()
        out = step(self, grads, delta, frozen)
        seen.append((before, self.params.clone(), out.clone(), self.seen_deltas.clone()))
        return out

    monkeypatch.setattr(Intentional, "deltas", recording_deltas)
    monkeypatch.setattr(Intentional, "step", recording_step)
    agent, record = run_stream("rtu-rtrl", SPACES["discrete"], lr=1.0, **INTENT)
    assert len(seen) == len(record) == agent.optimizer.t
    decay = agent.settings.discount * agent.settings.trace_lambda
    rms = [torch.zeros_like(record[0][g]) for g in ("g_a", "g_c")]
    z = [torch.zeros_like(r) for r in rms]
    for t, (rec, (before, after, steps, ds)) in enumerate(zip(record, seen), 1):
        for n, g in enumerate((rec["g_a"], rec["g_c"])):
            rms[n] = 0.999 * rms[n] + 0.001 * g * g
            scale = (rms[n] / (1 - 0.999**t)).sqrt() + 1e-8
            z[n] = decay * z[n] + g
            moved = (after[n] - before[n])[:, : g.shape[1]]  # the rows' padding stays 0
            expect = steps[n, 0] * ds[n, 0] * z[n] / scale
            assert moved.abs().max().item() > 0
            assert (moved - expect).abs().max().item() < 1e-12
            if rec["done"]:
                z[n] = torch.zeros_like(z[n])


def _linear(etas, normalise, decay=0.0, p=3):
    params = torch.zeros(len(etas), 1, p, dtype=F64)
    return params, Intentional(params, 1.0, etas, decay, normalise)


def test_a_linear_output_moves_by_eta_times_the_td_error():
    """No trace, a steady gradient x (the output theta.x): sigma^ = x.D^-1 x at every step, so
    each update moves the critic's output by exactly eta delta and the actor's by eta
    delta / mean |delta| (its normalised delta), whatever the deltas."""
    x = torch.tensor([0.5, -2.0, 1.5], dtype=F64)
    params, opt = _linear((0.05, 0.5), (True, False))
    grads = x.expand(2, 1, 3).clone()
    deltas = [0.7, -3.0, 0.2, 5.0, -0.01]
    seen = []
    for delta in deltas:
        before = params @ x  # (2, 1)
        opt.step(grads, torch.tensor([delta], dtype=F64))
        moved = (params @ x - before).squeeze(1)
        seen.append(abs(delta))
        mean_abs = opt.abs_mean.item() / (1 - 0.9998**opt.t)
        assert abs(moved[1].item() - 0.5 * delta) < 1e-12
        assert abs(moved[0].item() - 0.05 * delta / mean_abs) < 1e-12
        expect_mean = sum(0.9998 ** (len(seen) - i) * 0.0002 * a for i, a in enumerate(seen, 1))
        assert abs(mean_abs - expect_mean / (1 - 0.9998**opt.t)) < 1e-12


def test_a_two_step_case_with_a_trace_by_hand():
    """gamma lambda = 0.5, eta 0.5, g1 = (1, 2), delta1 = 0.4: D = (1, 2), g.D^-1 g = 3,
    sigma^ = 0.5 x 3 / 0.5 = 3, step = 0.5 / sqrt(3 x 3) = 1/6, theta = 1/6 x 0.4 x (1, 1).
    Step 2 (g2 = (2, 0), delta2 = -1) against the rule written out in floats."""
    params, opt = _linear((0.5,), (False,), decay=0.5, p=2)
    step = opt.step(torch.tensor([[[1.0, 2.0]]], dtype=F64), torch.tensor([0.4], dtype=F64))
    assert abs(step.item() - 1 / 6) < 1e-8
    assert torch.allclose(params[0, 0], torch.tensor([1 / 15, 1 / 15], dtype=F64), atol=1e-9)
    v = [0.999 * 0.001 * 1 + 0.001 * 4, 0.999 * 0.001 * 4]
    d = [math.sqrt(vi / (1 - 0.999**2)) + 1e-8 for vi in v]
    z = [0.5 * 1 + 2, 0.5 * 2 + 0]
    sigma1 = 0.5 * (1 / (1 + 1e-8) + 4 / (2 + 1e-8))  # 0.5 x 3 but for D's epsilon
    g_norm = 4 / d[0]
    sigma = sigma1 + 0.5 * (g_norm - sigma1)
    sigma_hat = sigma / (1 - 0.25)
    expect = 0.5 / math.sqrt(sigma_hat * (z[0] ** 2 / d[0] + z[1] ** 2 / d[1]))
    before = params[0, 0].clone()
    step = opt.step(torch.tensor([[[2.0, 0.0]]], dtype=F64), torch.tensor([-1.0], dtype=F64))
    assert abs(step.item() - expect) < 1e-12
    moved = params[0, 0] - before
    assert abs(moved[0].item() - expect * -1.0 * z[0] / d[0]) < 1e-12
    assert abs(moved[1].item() - expect * -1.0 * z[1] / d[1]) < 1e-12
    scale = torch.tensor([d], dtype=F64)
    ref = intentional_step_size(torch.tensor([sigma_hat], dtype=F64),
                                torch.tensor([z], dtype=F64), scale, 1.0, 0.5)  # fmt: skip
    assert abs(ref.item() - expect) < 1e-12


def test_td_errors_are_clipped_at_twenty_running_rms():
    """Late in a run (the RMS's bias correction spent), a TD error beyond 20 x its running RMS
    moves the output by eta x that cap, not eta x delta."""
    params, opt = _linear((0.5,), (False,))
    opt.t = 100_000
    x = torch.tensor([[[1.0, -2.0, 0.5]]], dtype=F64)
    opt.step(x, torch.tensor([1e3], dtype=F64))
    e = 0.9998 * 1.0 + 0.0002 * 1e6
    cap = 20 * math.sqrt(e / (1 - 0.9998**100_001))
    assert cap < 300
    assert abs((params @ x[0, 0]).item() - 0.5 * cap) < 1e-9


def test_a_vanishing_gradient_does_not_blow_the_step_up():
    """sigma^ is floored at 1 (a unit gradient's): a saturated policy's gradient (1e-20) moves
    theta by at most eta |delta| in D's norm, where sigma^ = g.D^-1 g would move it by 1e10x."""
    params, opt = _linear((0.5,), (False,))
    g = torch.tensor([[[1e-20, -3e-20, 2e-20]]], dtype=F64)
    opt.step(g, torch.tensor([0.8], dtype=F64))
    scale = opt._scale[0, 0]
    d_norm = (params[0, 0] * scale * params[0, 0]).sum().sqrt().item()
    assert 0 < d_norm <= 0.5 * 0.8 * (1 + 1e-9)


def small(**kw):
    from r2ac.rl.presets import preset

    return preset("stream-intentional").updated(**{**SMALL, **kw})


@pytest.mark.parametrize("core", ["rtu-rtrl", "rtu-bptt"])
def test_k_agents_equal_k_runs_alone(core):
    together = StreamRuntime(small(num_agents=3, seed=5, core=core), dtype=F64)
    _steps(together, 60)
    for k in range(3):
        alone = StreamRuntime(small(num_agents=1, seed=5 + k, core=core), dtype=F64)
        _steps(alone, 60)
        for a, b in ((together.agent.theta_a, alone.agent.theta_a),
                     (together.agent.theta_c, alone.agent.theta_c)):  # fmt: skip
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
    for key in ("theta_actor", "theta_critic", "trace_actor", "trace_critic", "x"):
        assert torch.equal(a[key], b[key]), key
    for key, value in a["intentional"].items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["intentional"][key])), key
    # an ObGD run's checkpoint lacks the optimiser's state: refused in one line
    obgd = StreamRuntime(small(num_agents=2, seed=1, stream_optimizer="obgd"))
    _steps(obgd, 3)
    path = checkpoint.save_atomic(_payload(obgd), tmp_path / "obgd.pt")
    with pytest.raises(Exception, match="intentional"):
        StreamRuntime(cfg).restore(checkpoint.load(path))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kappa-actor", "2"], "--kappa-actor: not read by --stream-optimizer intentional"),
        (["--eta-critic", "0"], "eta_critic=0.0"),
        (["--compile-step"], "--compile-step: the compiled step has ObGD only"),
        (["--trace-lambda", "1", "--discount", "1"], "discount x trace_lambda < 1"),
    ],
)
def test_bad_settings_are_one_line_errors(flags, message, capsys, tmp_path):
    code = _train(["--preset", "stream-intentional", "--out-dir", str(tmp_path / "x"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_obgd_refuses_the_etas(capsys, tmp_path):
    code = _train(["--preset", "stream", "--out-dir", str(tmp_path / "x"), "--eta-actor", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--eta-actor: not read by --stream-optimizer obgd" in err, err


def test_short_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    code = _train(["stream-ac", "--preset", "stream-intentional", "--env-options", "length=4",
                   "--hidden-size", "8", "--stream-mlp", "8", "--num-agents", "2",
                   "--total-frames", "60", "--log-every", "20", "--eval-episodes", "4",
                   "--eval-sets", "1", "--no-progress", "--out-dir", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())["config"]["stream"]
    assert saved["stream_optimizer"] == "intentional"
    assert len(json.loads((out / "eval.json").read_text())["agents"]) == 2
