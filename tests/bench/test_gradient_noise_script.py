"""scripts/gradient_noise.py: its statistics, its two gradients against the learner's and
against a TBPTT agent's, and a whole run on a real checkpoint."""

from __future__ import annotations

import sys

import pytest
import torch

from r2ac.rl.build import agent_for_env, make_env
from r2ac.rl.learner import Learner
from r2ac.rl.run_dir import RunDir
from r2ac.rl.runtimes.serial import SerialRuntime
from tests.bench.scripts import load_script
from tests.rl.rl_helpers import tiny

gn = load_script("gradient_noise")


def ppo(**kw):
    return tiny(algorithm="ppo", epochs=1, minibatches=1, batch_size=6, **kw)


def test_signal_and_noise_of_two_batches():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0])
    signal, noise = gn.summarise([a, b])
    # mean (2, 1); tr Cov with 1 / (k - 1): |a - b|^2 / 2 = 4; signal |mean|^2 - noise / k
    assert noise == pytest.approx(4.0)
    assert signal == pytest.approx(5.0 - 2.0)
    assert gn.cosine([a], [b]) == pytest.approx(3.0 / (5**0.5 * 3.0))


def test_the_two_gradients_are_the_learners_and_a_tbptt_agents():
    torch.manual_seed(0)
    cfg = ppo()
    runtime = SerialRuntime(cfg)
    runtime.start()
    for _ in range(3):  # sensitivities away from zero
        runtime.next_batch()
    seg = runtime.next_batch().segment
    groups = gn.parameter_groups(runtime.agent)
    assert sum(len(p) for p in groups.values()) == len(list(runtime.agent.parameters()))
    grads = gn.batch_gradients(runtime, seg, "loss", groups)

    # exact RTRL: what the learner's own PPO step computes on the whole batch
    runtime.agent.zero_grad(set_to_none=True)
    runtime.learner.ppo_backward(seg, runtime.learner.prepare(seg))
    for name, params in groups.items():
        torch.testing.assert_close(grads["rtrl"][name], gn.flat_grad(params), rtol=0, atol=0)
    # without the history term: what an elstm-bptt agent with the same weights computes
    bptt_cfg = cfg.updated(core="elstm-bptt")
    env = make_env(bptt_cfg, 1, 0)
    bptt = agent_for_env(bptt_cfg, env)
    env.close()
    bptt.load_state_dict(runtime.agent.state_dict())
    learner = Learner(bptt, bptt_cfg)
    light = seg._replace(state=runtime.agent.core.light_state(seg.state))
    learner.ppo_backward(light, learner.prepare(light))
    for name, params in gn.parameter_groups(bptt).items():
        torch.testing.assert_close(grads["tbptt"][name], gn.flat_grad(params))
    assert grads["history"]["core"].abs().max() > 0  # the sensitivities did carry something
    # --term: the three terms' gradients add up to the loss's
    parts = [gn.batch_gradients(runtime, seg, t, groups) for t in ("policy", "value", "entropy")]
    for rule in ("rtrl", "tbptt"):
        for name in groups:
            total = sum(part[rule][name] for part in parts)
            torch.testing.assert_close(total, grads[rule][name], rtol=1e-5, atol=1e-7)
            assert all(part[rule][name].abs().max() > 0 for part in parts[:2])
    assert grads["history"]["heads"].abs().max() == 0


def test_a_run_from_a_checkpoint(tmp_path, monkeypatch, capsys):
    cfg = ppo(out_dir=str(tmp_path / "run"), checkpoint_every=2)
    run = RunDir.create(cfg.run.out_dir, cfg)
    SerialRuntime(cfg, run).train()
    argv = ["gradient_noise.py", str(run.checkpoint_path), "4", "--warmup", "2", "--term", "policy"]
    monkeypatch.setattr(sys, "argv", argv)
    gn.main()
    out = capsys.readouterr().out
    assert "elstm-rtrl builtin/delayed-cue update 3: term policy" in out
    assert "all batches, 4 batches:" in out
    rows = [line for line in out.splitlines() if line.startswith("| core | rtrl |")]
    assert rows and all(float(r.split("|")[3]) > 0 for r in rows)  # mean |g| of the core


def test_an_impala_run_or_a_core_without_sensitivities_is_refused(tmp_path, monkeypatch):
    for name, kw in (("impala", {"algorithm": "impala"}), ("bptt", {"core": "elstm-bptt"})):
        cfg = tiny(out_dir=str(tmp_path / name), checkpoint_every=2, **kw)
        run = RunDir.create(cfg.run.out_dir, cfg)
        SerialRuntime(cfg, run).train()
        monkeypatch.setattr(sys, "argv", ["gradient_noise.py", str(run.checkpoint_path), "2"])
        with pytest.raises(SystemExit):
            gn.main()
