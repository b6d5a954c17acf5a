"""A run directory is data: `r2ac eval DIR`, `r2ac train --resume/--restart DIR` (and
`r2ac diagnose DIR`) never import the module that DIR's config.json names (`gym/MODULE:ID`)
unless the command line names the same env or says --trust-env-module (issue 82, N1).

The attack: a module planted in the run directory (run with PYTHONPATH=. from it) or on
PYTHONPATH, named by config.json, that writes a marker file when imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from r2ac.envs import make
from r2ac.envs.trust import TRUST_VAR, allow_env_module
from r2ac.errors import ConfigError

from .conftest import ROOT, TIMEOUT_S, r2ac_command, tiny_args

pytest.importorskip("gymnasium")
EXAMPLES = ROOT / "docs" / "examples"
ENV = "gym/my_env:MyCue-v0"
PLANTED = "planted_r2ac"


def run_r2ac(*args: str, cwd: Path, pythonpath: str) -> subprocess.CompletedProcess:
    """`r2ac ARGS` from `cwd` with PYTHONPATH=pythonpath (then this checkout); no trust set."""
    env = {k: v for k, v in os.environ.items() if k != TRUST_VAR}
    env.update(PYTHONPATH=f"{pythonpath}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1", R2AC_NATIVE="0")
    return subprocess.run(
        r2ac_command(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def plant(folder: Path, marker: Path) -> None:
    """PLANTED.py in folder: writes `marker` when imported, then registers MyCue-v0 as
    my_env.py does (so that, trusted, it is a working env)."""
    code = f"open({str(marker)!r}, 'w').write('ran')\n" + (EXAMPLES / "my_env.py").read_text()
    (folder / f"{PLANTED}.py").write_text(code)


def name_planted(run: Path) -> str:
    """Point the run's config.json at the planted module; return the new env id."""
    config = json.loads((run / "config.json").read_text())
    env_id = f"gym/{PLANTED}:MyCue-v0"
    text = json.dumps(config).replace(ENV, env_id)
    assert text != json.dumps(config)
    (run / "config.json").write_text(text)
    return env_id


@pytest.fixture(scope="module")
def my_env_run(tmp_path_factory) -> Path:
    """A finished tiny run of docs/examples/my_env.py's MyCue-v0 (the legitimate module)."""
    out = tmp_path_factory.mktemp("own-env") / "run"
    args = [a for a in tiny_args(4, checkpoint_every=2) if a not in ("--env-options", "delay=3")]
    proc = run_r2ac(
        "train", "--env", ENV, *args, "--out-dir", str(out), cwd=ROOT, pythonpath=str(EXAMPLES)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture()
def planted_run(my_env_run, tmp_path) -> tuple[Path, Path]:
    """A copy of the run naming PLANTED, planted in the run directory; (run, marker)."""
    run = tmp_path / "run"
    shutil.copytree(my_env_run, run)
    (run / "eval.json").unlink()
    marker = tmp_path / "marker"
    plant(run, marker)
    name_planted(run)
    return run, marker


def refused(proc: subprocess.CompletedProcess, marker: Path) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not marker.exists(), "the planted module ran"
    assert len(lines) == 1 and "--trust-env-module" in lines[0], lines
    assert f"--env gym/{PLANTED}:MyCue-v0" in lines[0], lines


@pytest.mark.parametrize(
    "command",
    [("eval", "."), ("train", "--resume", "."), ("train", "--restart", "."), ("diagnose", ".")],
)
def test_planted_module_in_run_dir_does_not_run(planted_run, command):
    run, marker = planted_run
    proc = run_r2ac(*command, cwd=run, pythonpath=".")
    refused(proc, marker)
    assert not (run / "eval.json").exists()


def test_planted_module_on_pythonpath_does_not_run(planted_run, tmp_path):
    run, marker = planted_run
    (run / f"{PLANTED}.py").rename(tmp_path / f"{PLANTED}.py")
    for command in (("eval", str(run)), ("train", "--resume", str(run))):
        refused(run_r2ac(*command, cwd=ROOT, pythonpath=str(tmp_path)), marker)


def test_another_env_named_is_refused(planted_run):
    run, marker = planted_run
    proc = run_r2ac("eval", ".", "--env", ENV, cwd=run, pythonpath=".")
    assert proc.returncode == 2 and not marker.exists()
    assert "is not the run's env" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_trusted_env_module_runs(my_env_run, tmp_path):
    """The positive control: with the env named (eval) or trusted (resume), the run's own
    module is imported and the commands work."""
    run = tmp_path / "run"
    shutil.copytree(my_env_run, run)
    (run / "eval.json").unlink()
    examples = str(EXAMPLES)
    proc = run_r2ac("eval", str(run), "--env", ENV, "--sets", "1", cwd=ROOT, pythonpath=examples)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run / "eval.json").read_text())["env"] == ENV
    (run / "eval.json").unlink()
    proc = run_r2ac(
        "train", "--resume", str(run), "--trust-env-module", cwd=ROOT, pythonpath=examples
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "eval.json").exists()


def test_with_permission_the_named_module_is_the_one_imported(planted_run):
    """The flag is the gate: naming the env imports the module config.json names."""
    run, marker = planted_run
    proc = run_r2ac(
        "eval", ".", "--env", f"gym/{PLANTED}:MyCue-v0", "--sets", "1", cwd=run, pythonpath="."
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.exists()


@pytest.mark.parametrize("module", ["this", "antigravity", "os.path", "webbrowser"])
def test_standard_library_modules_are_refused_even_when_allowed(module, monkeypatch, capsys):
    monkeypatch.setenv(TRUST_VAR, module)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ConfigError, match="standard library") as error:
        make(f"gym/{module}:X-v0", 1)
    assert "\n" not in str(error.value)
    assert module not in sys.modules or module == "os.path"
    assert "Zen of Python" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match="standard library"):
        allow_env_module(module)


@pytest.mark.parametrize("env_id", [f"gym/{PLANTED}:X-v0", "gym/../x:X-v0", "gym/a b:X-v0"])
def test_modules_not_allowed_are_not_imported(env_id, tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_VAR, raising=False)
    plant(tmp_path, tmp_path / "marker")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as error:
        make(env_id, 1)
    assert "\n" not in str(error.value) and not (tmp_path / "marker").exists()


@pytest.mark.parametrize(
    "level", ["../../tmp/evil", "/tmp/evil", "levels/evil.lua", "contributed/../x", "a b"]
)
def test_dmlab_levels_outside_its_level_folder_are_refused(level):
    """A DMLab level is a Lua script: config.json must not point at one of its own (refused
    before deepmind_lab is imported, so this holds without it too)."""
    with pytest.raises(ConfigError, match="expected a level name") as error:
        make(f"dmlab/{level}", 1)
    assert "\n" not in str(error.value)


def test_dmlab_level_names_still_map_to_its_suite():
    from r2ac.envs.dmlab import level_path

    assert level_path("rooms_watermaze") == "contributed/dmlab30/rooms_watermaze"
    assert level_path("contributed/dmlab30/explore_goal_locations_small") == (
        "contributed/dmlab30/explore_goal_locations_small"
    )
