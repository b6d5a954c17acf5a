"""`r2ac bench peer-rtrrl` without RTRRL, JAX or a network: the option checks, the
difference arithmetic, the command lines and environment of the runs, the run order, a whole
command with the runs stood in for, and the side script (importing nothing of r2ac)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from r2ac.bench import peer_rtrrl
from r2ac.errors import ConfigError

CPU = min(os.sched_getaffinity(0))


def args_of(*argv: str):
    return peer_rtrrl.parse(["--cpu", str(CPU), *argv])


def test_defaults_parse_and_pass_the_checks():
    args = args_of("--", "--seed", "3")
    assert (args.pairs, args.warmup, args.long_steps, args.short_steps) == (3, 1, 102_000, 2_000)
    assert args.peer_long_steps == 1_002_000  # RTRRL's: ~40 s, well above its start-up's noise
    assert args.r2ac_args == ["--seed", "3"]
    peer_rtrrl.check_args(args)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--pairs", "0"], "--pairs must be in 1..1,000"),
        (["--warmup", "-1"], "--warmup must be in 0..1,000"),
        (["--long-steps", "2000"], "--long-steps must be in 2,001.."),
        (["--short-steps", "1000"], "--short-steps must be in 2,000..101,999"),
        (["--short-steps", "102000"], "--short-steps must be in 2,000..101,999"),
        (["--short-steps", "2500"], "--short-steps must be a multiple of 1,000"),
        (["--long-steps", "50500"], "--long-steps must be a multiple of 1,000"),
        (["--peer-long-steps", "2000"], "--peer-long-steps must be in 2,001.."),
        (["--peer-long-steps", "1002500"], "--peer-long-steps must be a multiple of 1,000"),
        (["--length", "0"], "--length must be in 1.."),
        (["--seed", "0"], "--seed must be in 1.."),
        (["--cpu", "100000"], "--cpu 100000 is not one of this process's CPUs"),
        (["--peer-src", "/nonexistent/rtrrl"], "is not a folder"),
        (["--json-out", "/proc/peer.json"], "--json-out"),
        (["--", "--hidden-size", "0"], "the r2ac runs: "),
    ],
)
def test_bad_options_are_refused_before_any_work(argv, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(".", r"\.")):
        peer_rtrrl.check_args(args_of(*argv))


def test_the_difference_of_a_long_and_a_short_run():
    long = {"steps": 102_000, "wall_s": 130.0, "cpu_s": 85.0}
    short = {"steps": 2_000, "wall_s": 5.0, "cpu_s": 5.0}
    d = peer_rtrrl.difference(long, short)
    assert (d["steps"], d["wall_s"], d["cpu_s"]) == (100_000, 125.0, 80.0)
    assert (d["steps_per_s"], d["steps_per_cpu_s"]) == (800.0, 1250.0)
    same = peer_rtrrl.difference({**long, "wall_s": 5.0, "cpu_s": 4.0}, short)
    assert same["steps_per_s"] is None and same["steps_per_cpu_s"] is None  # no time: no rate


def test_medians_over_rounds_skip_failed_rounds_and_the_ratio():
    rounds = [
        {"r2ac": {"steps_per_s": 800.0, "steps_per_cpu_s": 1000.0},
         "rtrrl": {"steps_per_s": 20_000.0, "steps_per_cpu_s": 40_000.0}},
        {"r2ac": {"steps_per_s": 900.0, "steps_per_cpu_s": 1250.0}, "rtrrl": None},
        {"r2ac": {"steps_per_s": 700.0, "steps_per_cpu_s": 2000.0},
         "rtrrl": {"steps_per_s": 10_000.0, "steps_per_cpu_s": 20_000.0}},
    ]  # fmt: skip
    r2ac, rtrrl = (peer_rtrrl.summary(rounds, s) for s in ("r2ac", "rtrrl"))
    assert (r2ac["rounds"], r2ac["steps_per_s"], r2ac["steps_per_cpu_s"]) == (3, 800.0, 1250.0)
    assert r2ac["us_per_step_cpu"] == 800.0
    assert (rtrrl["rounds"], rtrrl["steps_per_s"], rtrrl["steps_per_cpu_s"]) == (2, 15_000, 30_000)
    text = peer_rtrrl.table({"r2ac": r2ac, "rtrrl": rtrrl}, {"r2ac": "A", "rtrrl": "B"})
    lines = text.splitlines()
    assert lines[2] == "| A | 800 | 1,250 | 800 us | 3 |"
    assert lines[3] == "| B | 15,000 | 30,000 | 33 us | 2 |"
    assert lines[4] == "| ratio r2ac / RTRRL | 0.053 | 0.042 | | |"


def test_the_r2ac_command_is_the_matched_network_pinned_to_one_cpu(tmp_path):
    args = args_of("--length", "64", "--seed", "5", "--", "--trace-lambda", "0.9")
    cmd = peer_rtrrl.r2ac_command(args, 2000, tmp_path / "run")
    assert cmd[:6] == ["taskset", "-c", str(CPU), sys.executable, "-m", "r2ac.cli"]
    text = " ".join(cmd[6:])
    assert text.startswith("train stream-ac --core lru-rtrl --hidden-size 32 --stream-mlp "
                           "--prev-action --env builtin/memory-chain --env-options length=64 "
                           "--num-threads 1 --no-progress --no-eval-at-end --total-frames 2000 "
                           "--seed 5 --out-dir ")  # fmt: skip
    assert text.endswith(f"{tmp_path / 'run'} --trace-lambda 0.9")


def test_the_rtrrl_command_runs_the_side_script_in_the_peer_venv(tmp_path):
    args = args_of("--length", "16", "--seed", "2")
    args.peer_python, args.source = tmp_path / "venv/bin/python", tmp_path / "RTRRL"
    cmd = peer_rtrrl.rtrrl_command(args, 102_000, tmp_path / "r.json")
    assert cmd == ["taskset", "-c", str(CPU), str(tmp_path / "venv/bin/python"), "-P",
                   str(peer_rtrrl.SIDE), "--src", str(tmp_path / "RTRRL"), "--episodes", "102",
                   "--steps", "1000", "--length", "16", "--seed", "2",
                   "--result", str(tmp_path / "r.json")]  # fmt: skip


def test_the_runs_have_one_thread_and_this_r2ac_on_the_path():
    env = peer_rtrrl.run_env({"PYTHONPATH": "/elsewhere", "HOME": "/root"})
    assert (
        env["PYTHONPATH"] == f"{peer_rtrrl.ROOT}{os.pathsep}/elsewhere" and env["HOME"] == "/root"
    )
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert "intra_op_parallelism_threads=1" in env["XLA_FLAGS"]
    assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]
    assert env["JAX_PLATFORMS"] == "cpu"


def test_the_clone_is_at_the_pinned_commit(tmp_path):
    clone, checkout = peer_rtrrl.clone_commands(tmp_path / "R")
    assert clone[:2] == ["git", "clone"] and clone[-2:] == [
        peer_rtrrl.RTRRL_URL,
        str(tmp_path / "R"),
    ]
    assert checkout[-1] == peer_rtrrl.RTRRL_COMMIT and len(peer_rtrrl.RTRRL_COMMIT) == 40
    assert peer_rtrrl.source_commit(tmp_path) is None  # no git checkout: no commit


def test_runs_alternate_the_systems_after_the_warm_up():
    order = peer_rtrrl.schedule(pairs=2, warmup=1)
    assert order == [
        ("warmup0", "r2ac", "short"), ("warmup0", "rtrrl", "short"),
        ("round0", "r2ac", "short"), ("round0", "r2ac", "long"),
        ("round0", "rtrrl", "short"), ("round0", "rtrrl", "long"),
        ("round1", "r2ac", "short"), ("round1", "r2ac", "long"),
        ("round1", "rtrrl", "short"), ("round1", "rtrrl", "long"),
    ]  # fmt: skip


def test_measure_counts_the_cpu_time_of_the_run_and_its_children(tmp_path):
    burn = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'sum(range(3*10**7))'])"
    rec = peer_rtrrl.measure([sys.executable, "-c", burn], tmp_path / "log", dict(os.environ))
    assert rec["rc"] == 0 and rec["cpu_s"] > 0.2 and rec["wall_s"] >= rec["cpu_s"] * 0.5
    assert (tmp_path / "log").read_text().startswith("$ ")


def test_the_command_discards_the_warm_up_and_writes_its_json(tmp_path, monkeypatch, capsys):
    calls = []
    per_step = {"r2ac": (1e-3, 8e-4), "rtrrl": (5e-5, 3e-5)}  # wall, cpu seconds a step

    def fake_run(args, system, steps, tag, root):
        calls.append((tag, system, steps))
        wall, cpu = per_step[system]
        start = 100.0 if tag == "warmup0" else 3.0  # a slow warm-up must not count
        return {"system": system, "steps": steps, "tag": tag, "rc": 0,
                "wall_s": start + wall * steps, "cpu_s": start + cpu * steps}  # fmt: skip

    monkeypatch.setattr(peer_rtrrl, "run_system", fake_run)
    monkeypatch.setattr(peer_rtrrl, "setup_peer", lambda venv: venv / "bin" / "python")
    monkeypatch.setattr(peer_rtrrl, "peer_versions", lambda py: {"jax": "0.5.0"})
    src = tmp_path / "RTRRL"
    src.mkdir()
    out = tmp_path / "peer.json"
    argv = ["--cpu", str(CPU), "--pairs", "3", "--peer-src", str(src), "--out-root",
            str(tmp_path / "runs"), "--json-out", str(out)]  # fmt: skip
    assert peer_rtrrl.main(argv) == 0
    assert len(calls) == 2 + 3 * 4 and calls[0] == ("warmup0", "r2ac", 2000)
    assert calls[2:6] == [("round0", "r2ac", 2000), ("round0", "r2ac", 102_000),
                          ("round0", "rtrrl", 2000), ("round0", "rtrrl", 1_002_000)]  # fmt: skip
    printed = capsys.readouterr().out
    assert "| 1,000 | 1,250 | 800 us | 3 |" in printed  # r2ac
    assert "| 20,000 | 33,333 | 30 us | 3 |" in printed  # RTRRL
    assert "| ratio r2ac / RTRRL | 0.050 | 0.037 | | |" in printed and "load average" in printed
    assert "102,000 - 2,000 steps (RTRRL: 1,002,000 - 2,000)" in printed
    doc = json.loads(out.read_text())
    assert doc["ratio"]["steps_per_s"] == pytest.approx(0.05) and len(doc["runs"]) == 14
    assert doc["peer_packages"] == {"jax": "0.5.0"} and doc["rtrrl_commit"] is None


def test_a_failed_run_fails_the_command(tmp_path, monkeypatch):
    def fake_run(args, system, steps, tag, root):
        rc = 1 if (system, tag) == ("rtrrl", "round0") else 0
        return {"system": system, "steps": steps, "tag": tag, "rc": rc, "wall_s": steps * 1e-3,
                "cpu_s": steps * 1e-3}  # fmt: skip

    monkeypatch.setattr(peer_rtrrl, "run_system", fake_run)
    monkeypatch.setattr(peer_rtrrl, "setup_peer", lambda venv: venv / "bin" / "python")
    argv = ["--cpu", str(CPU), "--pairs", "1", "--warmup", "0", "--peer-src", str(tmp_path),
            "--out-root", str(tmp_path / "runs")]  # fmt: skip
    assert peer_rtrrl.main(argv) == 1


# The side script: run by the peer venv's Python, so it must import nothing of r2ac.


def side_module():
    spec = importlib.util.spec_from_file_location("peer_rtrrl_side", peer_rtrrl.SIDE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_side_script_imports_nothing_of_r2ac():
    tree = ast.parse(peer_rtrrl.SIDE.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "r2ac"]
    assert {"rtrrl", "envs", "jax"} <= set(names)  # RTRRL's own modules, imported inside


def test_the_side_script_finds_rtrrl_in_a_checkout_or_its_folder(tmp_path):
    side = side_module()
    (tmp_path / "rtrrl").mkdir()
    (tmp_path / "rtrrl" / "rtrrl.py").write_text("")
    assert side.rtrrl_dir(tmp_path) == tmp_path / "rtrrl"
    assert side.rtrrl_dir(tmp_path / "rtrrl") == tmp_path / "rtrrl"
    with pytest.raises(SystemExit, match="no rtrrl.py"):
        side.rtrrl_dir(tmp_path / "nothing")


def test_the_side_script_stands_in_for_popjym_only_where_it_is_missing(monkeypatch):
    side = side_module()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.delitem(sys.modules, "popjym", raising=False)
    assert side.stand_in_popjym() is True
    assert sys.modules["popjym"].registration.REGISTERED_ENVS == {}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.delitem(sys.modules, "popjym")
    assert side.stand_in_popjym() is False and "popjym" not in sys.modules


def test_the_side_script_changes_only_env_length_evaluation_and_seed():
    side = side_module()

    @dataclass(frozen=True)
    class EnvironmentParams:
        env_name: str = "StatelessCartPoleEasy"
        env_kwargs: dict = field(default_factory=dict)
        max_ep_length: int = 1000
        batch_size: int | None = 1

    @dataclass(frozen=True)
    class RTRRLParams:
        seed: int | None = None
        episodes: int = 150_000
        steps: int = 1000
        eval_every: int = 100
        hidden_size: int = 32
        lambda_v: float = 0.9
        env_params: EnvironmentParams = EnvironmentParams()

    class Args:
        episodes, steps, length, seed = 102, 1000, 32, 7

    rtrrl = type(sys)("rtrrl")
    rtrrl.RTRRLParams = RTRRLParams
    envs = type(sys)("environments")
    envs.EnvironmentParams = EnvironmentParams
    got = side.make_params(rtrrl, envs, Args)
    assert got == RTRRLParams(
        seed=7, episodes=102, steps=1000, eval_every=0,
        env_params=EnvironmentParams("MemoryChain-bsuite", {"memory_length": 32}),
    )  # fmt: skip


def test_the_bench_is_listed():
    from r2ac.bench import cli

    assert cli.BENCHES["peer-rtrrl"][0] == "r2ac.bench.peer_rtrrl"
    assert Path(peer_rtrrl.__file__).with_name("peer_rtrrl_side.py") == peer_rtrrl.SIDE
