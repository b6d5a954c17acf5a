"""gym/<module>:<EnvId>: a user's own Gymnasium env, imported and registered as
`gymnasium.make("module:EnvId")` does; the module is docs/examples/my_env.py."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from r2ac.envs import make
from r2ac.envs.trust import TRUST_VAR
from r2ac.errors import ConfigError

gym = pytest.importorskip("gymnasium")
EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "my_env.py"


# the modules these tests name, allowed as the command line or allow_env_module would
ALLOWED = "my_env,no_such_module_r2ac,no_such_pkg_r2ac.envs,needs_dep_r2ac"


@pytest.fixture(autouse=True)
def allowed_modules(monkeypatch):
    monkeypatch.setenv(TRUST_VAR, ALLOWED)


@pytest.fixture
def my_env_on_path(tmp_path, monkeypatch):
    """docs/examples/my_env.py copied into tmp_path, on sys.path, not yet imported or
    registered (so that make() has to import it)."""
    shutil.copy(EXAMPLE, tmp_path / "my_env.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_env", raising=False)
    monkeypatch.delitem(gym.registry, "MyCue-v0", raising=False)
    return tmp_path


def test_module_form_imports_registers_and_steps(my_env_on_path):
    delay = 3
    env = make("gym/my_env:MyCue-v0", 4, seed=0, delay=delay)
    assert "my_env" in sys.modules and "MyCue-v0" in gym.registry
    assert env.observation_spec.shape == (3,) and env.num_actions == 2
    obs = env.reset()
    cue = obs[:, :2].argmax(axis=1)
    np.testing.assert_array_equal(obs[:, :2].sum(axis=1), 1)  # the cue, at the first step
    for _ in range(delay + 1):
        result = env.step(np.zeros(4, np.int64))
        assert not result.terminated.any() and not result.reward.any()
    np.testing.assert_array_equal(result.obs[:, 2], 1)  # answer now
    answers = np.array([cue[0], 1 - cue[1], cue[2], cue[3]])
    result = env.step(answers)
    np.testing.assert_array_equal(result.reward, [1, -1, 1, 1])
    assert result.terminated.all()
    np.testing.assert_array_equal(result.info["episode_length"], delay + 2)
    np.testing.assert_array_equal(result.obs[:, :2].sum(axis=1), 1)  # the next episode's cue


def test_module_form_same_seed_same_cues(my_env_on_path):
    def cues(seed):
        env = make("gym/my_env:MyCue-v0", 8, seed=seed, delay=0)
        obs = [env.reset()] + [env.step(np.zeros(8, np.int64)).obs for _ in range(10)]
        return np.stack(obs)

    np.testing.assert_array_equal(cues(1), cues(1))
    assert 0 < cues(1)[0, :, 1].mean() < 1  # both cues occur


def test_module_form_through_pythonpath(tmp_path):
    """As `PYTHONPATH=... r2ac train --env gym/my_env:MyCue-v0` finds it: a fresh process."""
    shutil.copy(EXAMPLE, tmp_path / "my_env.py")
    code = (
        "import numpy as np; from r2ac.envs import allow_env_module, make; "
        "allow_env_module('my_env'); env = make('gym/my_env:MyCue-v0', 2, seed=0); env.reset(); "
        "print(env.step(np.zeros(2, np.int64)).obs.shape)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{tmp_path}:{EXAMPLE.parents[2]}", "PATH": "/usr/bin:/bin"},
        cwd=tmp_path.parent,
        check=True,
    )
    assert out.stdout.strip() == "(2, 3)"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("gym/no_such_module_r2ac:MyCue-v0", "cannot import module 'no_such_module_r2ac'"),
        ("gym/no_such_pkg_r2ac.envs:MyCue-v0", "cannot import module 'no_such_pkg_r2ac.envs'"),
        ("gym/my_env:NoSuchCue-v0", "importing 'my_env' did not register it"),
        ("gym/:MyCue-v0", "expected '<module>:<EnvId>'"),
        ("gym/my_env:", "expected '<module>:<EnvId>'"),
    ],
)
def test_module_form_errors_are_one_line(my_env_on_path, name, says):
    with pytest.raises(ConfigError) as error:
        make(name, 1)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_module_whose_import_misses_a_dependency_names_it(tmp_path, monkeypatch):
    (tmp_path / "needs_dep_r2ac.py").write_text("import not_installed_dep_r2ac\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="needs 'not_installed_dep_r2ac'"):
        make("gym/needs_dep_r2ac:X-v0", 1)
