"""scripts/gpu_check.sh, checked on the CPU: it parses, its help lists every step it runs, an
unknown step is refused, and the rtrl-e2e step runs end to end with E2E_DEVICE=cpu."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "gpu_check.sh"


def default_steps() -> list[str]:
    return re.search(r"^STEPS=\$\{STEPS:-([a-z0-9 -]+)\}", CHECK.read_text(), re.M)[1].split()


def test_the_check_parses_and_its_help_names_every_step():
    subprocess.run(["bash", "-n", str(CHECK)], check=True)
    usage = subprocess.run(["bash", str(CHECK), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "Expected run time on one H200" in usage.stdout
    steps = default_steps()
    assert steps == ["env", "tests", "bench", "cost", "rtrl-e2e", "e2e"]
    text = CHECK.read_text()
    for step in steps:
        assert re.search(rf"^#   {step} ", text, re.M), step  # in the help
        assert f"step_{step.replace('-', '_')}() {{" in text, step  # and defined


def test_an_unknown_step_is_refused(tmp_path):
    env = {**os.environ, "STEPS": "nonsense", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(CHECK), str(tmp_path)], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and "no step 'nonsense'" in done.stderr


def test_the_rtrl_e2e_step_runs_on_the_cpu(tmp_path):
    pytest.importorskip("popgym")
    env = {**os.environ, "STEPS": "rtrl-e2e", "E2E_DEVICE": "cpu", "RTRL_E2E_ITERATIONS": "11",
           "PYTHON": sys.executable}  # fmt: skip
    done = subprocess.run(["bash", str(CHECK), str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = (tmp_path / "rtrl-e2e.txt").read_text()
    ratio = re.search(r"rtrl/bptt frames/s .*: collect \+ update ([\d.]+)", text)
    assert ratio and 0.2 < float(ratio.group(1)) < 5, text
    assert "[gpu_check] exit 0: " in text and "failed: none" in done.stdout
