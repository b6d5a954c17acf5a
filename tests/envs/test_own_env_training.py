"""The README's "Your own environment" commands, end to end: `r2ac train` on
docs/examples/my_env.py's MyCue-v0 with an exact-RTRL core, then `r2ac eval`, each in a fresh
process, with a tiny frame budget instead of the README's."""

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")
ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[list[str]]:
    """The `PYTHONPATH=docs/examples r2ac ...` lines of the README's section, as argv lists
    (continuation lines joined, the PYTHONPATH assignment dropped)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own environment", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    lines = [line for line in block.splitlines() if line.startswith("PYTHONPATH=docs/examples")]
    return [shlex.split(line)[1:] for line in lines]


def with_value(argv: list[str], option: str, value: str) -> list[str]:
    i = argv.index(option)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


@pytest.mark.slow
def test_readme_own_env_commands_train_and_evaluate(tmp_path):
    train, evaluate = readme_commands()
    assert train[:2] == ["r2ac", "train"] and evaluate[:2] == ["r2ac", "eval"]
    assert "gym/my_env:MyCue-v0" in train and "elstm-rtrl" in train
    run_dir = str(tmp_path / "my-cue")
    train = with_value(with_value(train, "--total-frames", "2048"), "--out-dir", run_dir)
    train += ["--eval-sets", "1", "--eval-episodes", "10", "--no-progress"]
    assert evaluate[3:] == ["--env", "gym/my_env:MyCue-v0"]  # the run's module, trusted
    evaluate = [*evaluate[:2], run_dir, *evaluate[3:], "--sets", "1", "--episodes", "10"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "docs" / "examples")}
    for argv in (train, evaluate):
        done = subprocess.run(
            [sys.executable, "-m", "r2ac.cli", *argv[1:]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "my-cue" / "eval.json").read_text())
    assert result["env"] == "gym/my_env:MyCue-v0" and math.isfinite(result["mean"])
