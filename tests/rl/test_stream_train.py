"""`r2ac train --preset stream`: K agents equal K runs alone, bit-exact resume, one-line
errors, a short run end to end (r2ac/rl/stream/runtime.py)."""

from __future__ import annotations

import csv
import json
import signal

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rl.config import validate
from r2ac.rl.harness import train_cli
from r2ac.rl.presets import preset
from r2ac.rl.run.run_dir import RunDir
from r2ac.rl.stream.runtime import StreamRuntime

SMALL = dict(
    env_options=("length=4",), hidden_size=8, stream_mlp=(8,), progress=False, eval_at_end=False
)


def small(**kw):
    return preset("stream").updated(**{**SMALL, **kw})


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
@pytest.mark.parametrize("steps", [60, pytest.param(1000, marks=pytest.mark.slow)])
def test_k_agents_equal_k_runs_alone(steps, core):
    together = StreamRuntime(small(num_agents=3, seed=5, core=core), dtype=torch.float64)
    _steps(together, steps)
    for k in range(3):
        alone = StreamRuntime(small(num_agents=1, seed=5 + k, core=core), dtype=torch.float64)
        _steps(alone, steps)
        for a, b in ((together.agent.theta_a, alone.agent.theta_a),
                     (together.agent.theta_c, alone.agent.theta_c)):  # fmt: skip
            assert (a[k] - b[0]).abs().max().item() < 1e-10


def _train(argv):
    return train_cli.main(argv)


@pytest.mark.parametrize("layers", [{}, dict(stream_mlp=(), stream_top_mlp=(8, 6))],
                         ids=["below", "above"])  # fmt: skip
@pytest.mark.parametrize("core", ["rtu-rtrl", "mingru-rtrl"])
def test_checkpoint_round_trip_is_bit_exact(tmp_path, layers, core):
    """25 steps, a checkpoint file, a new runtime restored from it, 15 more steps: the same
    weights, traces and core states as 40 steps uninterrupted."""
    from r2ac.runs import checkpoint

    cfg = small(num_agents=2, seed=1, core=core, **layers)
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
    for ta, tb in zip(a["core_actor"] + a["core_critic"], b["core_actor"] + b["core_critic"]):
        assert torch.equal(ta, tb)


@pytest.mark.parametrize("core", ["rtu-rtrl", "lru-rtrl", "elstm-rtrl"])
def test_checkpoint_of_the_older_sensitivity_layout_resumes_bit_exact(tmp_path, core):
    """A checkpoint without the layout mark holds the pair cores' d s / d W1 as (K, U, D, 2)
    pairs: restored, it continues exactly as the run that wrote it; with the mark but pairs
    inside, the shape check refuses it in one line."""
    from r2ac.rl.stream.checkpoint import SENSITIVITY_LAYOUT
    from r2ac.runs import checkpoint

    cfg = small(num_agents=2, seed=3, core=core)
    full = StreamRuntime(cfg)
    _steps(full, 30)
    part = StreamRuntime(cfg)
    _steps(part, 18)
    payload = _payload(part)
    section = payload.pop("stream")  # the older form: the state where the optimiser's is
    assert section["sensitivity_layout"] == SENSITIVITY_LAYOUT
    state = section["state"]
    payload["learner"] = {"optimizer": {"state": state, "param_groups": [{}]}, "scheduler": {}}
    for key in ("core_actor", "core_critic"):
        if core != "elstm-rtrl":  # the older layout: planes (K, 2, U, D) -> pairs (K, U, D, 2)
            h, sens_w, sens_v = state[key]
            state[key] = [h, sens_w.permute(0, 2, 3, 1).contiguous(), sens_v]
    path = checkpoint.save_atomic(payload, tmp_path / "old.pt")
    resumed = StreamRuntime(cfg)
    resumed.restore(checkpoint.load(path))
    _steps(resumed, 12)
    a, b = full.agent.state_dict(), resumed.agent.state_dict()
    for ta, tb in zip(a["core_actor"] + a["core_critic"], b["core_actor"] + b["core_critic"]):
        assert torch.equal(ta, tb)
    assert torch.equal(a["theta_actor"], b["theta_actor"])
    if core != "elstm-rtrl":
        marked = checkpoint.load(path)
        marked["sensitivity_layout"] = SENSITIVITY_LAYOUT
        with pytest.raises(ConfigError, match="core_actor"):
            StreamRuntime(cfg).restore(marked)


def test_stop_and_resume_is_bit_exact(tmp_path, monkeypatch):
    """SIGTERM at step 25 (between the rows of steps 20 and 30) and --resume: the weights, and
    metrics.csv row for row (but for wall times), as the uninterrupted run's."""
    flags = ["--preset", "stream", "--env-options", "length=4", "--hidden-size", "8",
             "--stream-mlp", "8", "--num-agents", "2", "--total-frames", "40",
             "--checkpoint-every", "15", "--log-every", "10", "--no-progress",
             "--no-eval-at-end"]  # fmt: skip
    full, part = tmp_path / "full", tmp_path / "part"
    assert _train([*flags, "--out-dir", str(full)]) == 0
    # a SIGTERM after step 70: the run stops there with a checkpoint
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
    for key in ("theta_actor", "theta_critic", "trace_actor", "trace_critic", "x"):
        assert torch.equal(sa[key], sb[key]), key
    for ta, tb in zip(sa["core_actor"], sb["core_actor"], strict=True):
        assert torch.equal(ta, tb)
    rows = [list(csv.DictReader((d / "metrics.csv").open())) for d in (full, part)]
    assert len(rows[0]) == len(rows[1]) == 4
    for ra, rb in zip(*rows, strict=True):
        assert {k: v for k, v in ra.items() if k not in ("time_s", "fps")} == {
            k: v for k, v in rb.items() if k not in ("time_s", "fps")
        }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--runtime", "parallel"], "--runtime: not an option of `r2ac train stream-ac`"),
        (["--num-agents", "0"], "--num-agents must be a positive integer"),
        (
            ["--epochs", "2"],
            "--epochs: not an option of `r2ac train stream-ac` (an option of impala",
        ),
        (["--core", "lstm-bptt"], "no streaming version"),
        (["--last-reward"], "--last-reward: not an option of `r2ac train stream-ac`"),
        (["--popart"], "--popart: not an option"),
        (["--load-stem", "x.pt"], "--load-stem: not an option"),
        (["--kappa-actor", "inf"], "kappa_actor=inf"),
    ],
)
def test_bad_settings_are_one_line_errors(flags, message, capsys, tmp_path):
    code = _train(["--preset", "stream", "--out-dir", str(tmp_path / "x"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_options_of_another_algorithm_are_refused_in_the_config_too():
    """A config (e.g. a hand-edited config.json) with an option its algorithm does not read is
    refused in one line, both ways."""
    with pytest.raises(ConfigError, match="--popart: not options of stream-ac"):
        validate(preset("stream").updated(popart=True))
    with pytest.raises(ConfigError, match="--num-agents: options of the streaming agents"):
        validate(preset("delayed-cue").updated(num_agents=2))
    with pytest.raises(ConfigError, match="a streaming preset"):
        from r2ac.rl.harness.train_cli import parse_config

        parse_config(["impala", "--preset", "stream"])


def test_short_run_end_to_end(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code = _train(["--preset", "stream", "--env-options", "length=4", "--hidden-size", "8",
                   "--stream-mlp", "8", "--num-agents", "2", "--total-frames", "60",
                   "--log-every", "20", "--eval-episodes", "4", "--eval-sets", "1",
                   "--no-progress", "--out-dir", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    assert "120 frames, 60 updates in" in text and "frames/s" in text
    result = json.loads((out / "eval.json").read_text())
    assert len(result["agents"]) == 2 and result["actions"] == "greedy"
    assert result["mean"] == pytest.approx(sum(a["mean"] for a in result["agents"]) / 2)
    assert (out / "metrics.csv").read_text().count("\n") == 4  # header + 3 rows
    assert json.loads((out / "config.json").read_text())["config"]["stream"]["num_agents"] == 2
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    for name in ("td_abs", "step_actor", "step_critic", "entropy"):
        assert all(float(r[name]) > 0 for r in rows), name
    assert all(r["value_mean"] != "" for r in rows)
    assert all(r["q_mean"] == "" for r in rows)  # QRC's columns stay blank under stream AC
    # `r2ac eval` on the finished run: the same frozen agents, the same greedy episodes
    from r2ac.rl.harness.evaluate import main as eval_main

    again = tmp_path / "again.json"
    assert eval_main([str(out), "--out", str(again)]) == 0
    redone = json.loads(again.read_text())
    assert [a["set_means"] for a in redone["agents"]] == [a["set_means"] for a in result["agents"]]
    assert eval_main([str(out), "--out", str(again), "--seed", "7", "--sets", "2"]) == 0
    assert [a["seed"] for a in json.loads(again.read_text())["agents"]] == [7, 8]
    # a run of the compiled step: its frozen agents play eagerly, nothing is compiled
    from r2ac.rl.stream.runtime import StreamRuntime

    saved = json.loads((out / "config.json").read_text())
    saved["config"]["stream"]["compile_step"] = True
    (out / "config.json").write_text(json.dumps(saved))
    monkeypatch.setattr(StreamRuntime, "_compile", lambda self: pytest.fail("compiled for eval"))
    assert eval_main([str(out), "--out", str(again)]) == 0
    redone = json.loads(again.read_text())
    assert [a["set_means"] for a in redone["agents"]] == [a["set_means"] for a in result["agents"]]


def test_qrc_metrics_reach_the_csv(tmp_path, capsys):
    out = tmp_path / "run"
    code = _train(["--preset", "stream-q", "--env-options", "length=4", "--hidden-size", "8",
                   "--stream-mlp", "8", "--total-frames", "60", "--log-every", "20",
                   "--eval-episodes", "2", "--eval-sets", "1", "--no-progress",
                   "--out-dir", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 3
    for r in rows:
        assert float(r["td_abs"]) > 0 and 0 < float(r["epsilon"]) <= 1
        assert 0 <= float(r["non_greedy"]) <= 1 and r["q_mean"] != "" and r["h_mean"] != ""
        assert r["step_actor"] == ""  # stream AC's columns stay blank under QRC


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda s: s.update(theta_actor=s["theta_actor"][:, :-1].clone()), "theta_actor: shape"),
        (lambda s: s["trace_critic"].fill_(float("nan")), "trace_critic: holds non-finite"),
        (lambda s: s.update(steps=-3), "steps: -3"),
        (lambda s: s.update(core_actor=s["core_actor"][:1]), "core_actor"),
    ],
)
def test_a_checkpoint_whose_values_do_not_fit_is_refused_before_use(damage, words):
    """Every saved value of the streaming agent against what the config builds, before any is
    loaded: the runtime's weights stay as they were."""

    cfg = small(num_agents=2, seed=1)
    source = StreamRuntime(cfg)
    _steps(source, 5)
    payload = _payload(source)
    damage(payload["stream"]["state"])
    target = StreamRuntime(cfg)
    before = target.agent.theta_a.detach().clone()
    with pytest.raises(ConfigError) as err:
        target.restore(payload)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert torch.equal(target.agent.theta_a.detach(), before)


@pytest.mark.parametrize("streaming", ["ac", "q"])
def test_forget_bias_sets_both_networks_elstm_forget_gates(streaming):
    preset_name = "stream" if streaming == "ac" else "stream-q"
    cfg = preset(preset_name).updated(
        **{**SMALL, "core": "elstm-rtrl", "forget_bias": 3.5, "num_agents": 2}
    )
    rt = StreamRuntime(validate(cfg))
    agent = rt.agent
    for net, theta in agent.nets().values():
        assert torch.all(net.layout.views(theta)["core.b_f"] == 3.5)
    with pytest.raises(ConfigError, match="no forget gate"):
        validate(preset(preset_name).updated(**{**SMALL, "forget_bias": 3.5}))


def test_prev_action_ends_the_observation():
    """--prev-action: the agents' observation is [obs, one-hot previous action], zeros at an
    episode's first step; a truncated episode's final_obs keeps the action that ended it."""
    import numpy as np

    rt = StreamRuntime(small(num_agents=2, prev_action=True), dtype=torch.float64)
    plain = StreamRuntime(small(num_agents=2), dtype=torch.float64)
    assert rt.agent.obs_size == plain.agent.obs_size + 2  # MemoryChain: 2 actions
    env = rt.env
    first, ends = env.reset(), 0
    assert np.all(first[:, -2:] == 0)
    for t in range(9):
        actions = np.array([t % 2, 1 - t % 2])
        res = env.step(actions)
        code = np.eye(2, dtype=np.float32)[actions]
        done = res.terminated | res.truncated
        np.testing.assert_array_equal(res.info["final_obs"][:, -2:], code)
        np.testing.assert_array_equal(res.obs[~done, -2:], code[~done])
        assert np.all(res.obs[done, -2:] == 0)
        ends += int(done.sum())
    assert ends >= 4  # length=4: episodes ended inside the 9 steps
    _steps(rt, 10)  # and the agents learn from it
    rt.close(), plain.close()


def test_prev_action_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    code = _train(["--preset", "stream", "--env-options", "length=4", "--hidden-size", "8",
                   "--stream-mlp", "8", "--prev-action", "--total-frames", "40",
                   "--eval-episodes", "4", "--eval-sets", "1", "--no-progress",
                   "--out-dir", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["config"]["model"]["prev_action"]
    assert len(json.loads((out / "eval.json").read_text())["agents"]) == 1


@pytest.mark.parametrize("flags", [["--num-agents", "100000"], ["--num-agents", str(10**9)]])
def test_a_run_too_large_for_memory_is_refused_up_front(flags, capsys, tmp_path, monkeypatch):
    """The streaming trainer's memory estimate counts K, the hidden size and the widths: a
    run that cannot fit is one line naming what to lower, before anything is built."""
    import time

    from r2ac.rl.stream import runtime

    monkeypatch.delenv("R2AC_SKIP_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(runtime, "make_agent_envs", None)  # never reached
    start = time.perf_counter()
    code = _train(["stream-ac", "--out-dir", str(tmp_path / "x"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "GiB" in err and "--num-agents" in err and len(err.splitlines()) == 1
    assert time.perf_counter() - start < 20 and not (tmp_path / "x").exists()


def test_the_memory_estimate_grows_with_k_and_the_sizes():
    from r2ac.rl.stream.runtime import StreamRuntime

    def total(**kw):
        return sum(b for b, _ in StreamRuntime.memory_estimate(small(**kw)).values())

    one = total(num_agents=1)
    assert total(num_agents=8) == pytest.approx(8 * one, rel=1e-9)
    assert total(hidden_size=32) > total(hidden_size=8) and total(stream_mlp=(64,)) > one
