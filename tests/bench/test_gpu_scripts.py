"""The GPU session's scripts and the kernel comparison scripts, checked on the CPU: the lease
runs only steps that gpu_session.sh has, and the Python scripts run end to end."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from r2ac.rtrl.elstm import native

ROOT = Path(__file__).resolve().parents[2]
SESSION, LEASE = ROOT / "scripts" / "gpu_session.sh", ROOT / "scripts" / "gpu_lease.sh"


def session_steps() -> set[str]:
    """The step names of gpu_session.sh's case statement."""
    body = SESSION.read_text().split('case "$step" in', 1)[1]
    return set(re.findall(r"^\s+([a-z0-9-]+)\)", body, flags=re.M))


def test_gpu_scripts_parse_and_the_session_lists_its_steps():
    for script in (SESSION, LEASE):
        subprocess.run(["bash", "-n", str(script)], check=True)
    usage = subprocess.run(["bash", str(SESSION)], capture_output=True, text=True)
    assert usage.returncode == 2
    steps = session_steps()
    expected = {"env", "tests", "bench", "bench-shapes", "profile", "cost", "e2e", "popgym-e2e"}
    assert expected | {"wheels"} <= steps
    for step in steps:
        assert f"gpu_session.sh {step}" in usage.stdout, step


def test_the_lease_runs_only_steps_the_session_has():
    called = re.findall(r'(?:^|\s)step "\$\{LIMIT_\w+:-\d+\}" ([a-z0-9-]+)', LEASE.read_text())
    # `gpu_lease.sh tune`, `gpu_lease.sh popgym` (issue 36's bar), then the whole lease
    tune_mode, popgym_mode, full = called[:3], called[3:5], called[5:]
    assert tune_mode == ["tests", "tune", "bench-shapes"]
    assert popgym_mode == ["env", "popgym-e2e"]
    assert full == ["env", "tests", "bench-shapes", "profile", "cost", "e2e"]
    assert set(called) <= session_steps()


def test_profile_gpu_carry_runs_on_the_cpu():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_gpu_carry.py"), "--device", "cpu",
         "--shapes", "3,2,16,5", "--candidates", "torch", "--calls", "2"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert re.search(r"== 3,2,16,5 torch .* wall [\d.]+ ms a call", out), out


@pytest.mark.skipif(native.load() is None, reason="no native kernel (no C compiler)")
@pytest.mark.parametrize("kernel", ["carry", "history"])
def test_native_carry_ab_finds_the_same_numbers_against_head(kernel):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "native_carry_ab.py"), "HEAD", "--threads", "1",
         "--shapes", "2,3,16,5", "--kernel", kernel, "--evict-mb", "1"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if "this/base time" in line]
    assert len(lines) == 2 and all(line.endswith("same numbers True") for line in lines), out


def test_the_parallel_screen_runs_each_arm_on_each_seed_and_sums_up(tmp_path):
    """scripts/screen_parallel.sh (the device host's 16 cores as a tuning screen): two arms
    x two seeds of a 4,096-frame POPGym run, each line of screen.txt read from the run's own
    eval.json, and each arm's mean that of its lines."""
    pytest.importorskip("popgym")
    env = {"OUT": str(tmp_path / "out"), "SCREEN_WORK": str(tmp_path / "work"),
           "SCREEN_SEEDS": "1 2", "SCREEN_LIMIT": "300", "PATH": "/usr/bin:/bin",
           "PYTHON": sys.executable}  # fmt: skip
    script = ROOT / "scripts" / "screen_parallel.sh"
    assert subprocess.run(["bash", str(script)], capture_output=True).returncode == 2
    small = "--total-frames 4096 --num-envs 8 --eval-episodes 2 --eval-sets 1"
    run = subprocess.run(
        ["bash", str(script), "gym/popgym-RepeatPreviousEasy-v0", "gru-bptt", f"a={small}",
         f"b={small} --learning-rate 1e-3"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = (tmp_path / "out" / "screen.txt").read_text().splitlines()
    runs = [line.split() for line in lines if " seed " in line]
    assert sorted((w[0], w[2]) for w in runs) == [("a", "1"), ("a", "2"), ("b", "1"), ("b", "2")]
    for words in runs:
        saved = json.loads(
            (tmp_path / "work" / f"{words[0]}_s{words[2]}" / "eval.json").read_text()
        )
        assert float(words[4]) == pytest.approx(saved["mean"], abs=5e-4)
        assert words[8] == "4096" and words[10] == "0"  # frames, exit status
    for arm in ("a", "b"):
        mean = sum(float(w[4]) for w in runs if w[0] == arm) / 2
        summary = next(line for line in lines if line.startswith(f"arm {arm} "))
        assert float(summary.split()[3]) == pytest.approx(mean, abs=1e-3)
        assert "over 2 of 2 runs" in summary
    assert (tmp_path / "out" / "screen.tgz").stat().st_size > 0


def test_the_popgym_e2e_step_runs_on_the_cpu(tmp_path):
    """gpu_session.sh popgym-e2e (issue 36's bar on a GPU) with E2E_DEVICE=cpu: both
    measurements, with and without the start correction, print their rtrl/bptt ratio."""
    env = {
        **os.environ, "OUT": str(tmp_path), "E2E_DEVICE": "cpu", "POPGYM_E2E_ITERATIONS": "11",
        "PYTHON": sys.executable,
    }  # fmt: skip
    subprocess.run(
        ["bash", str(SESSION), "popgym-e2e"], env=env, cwd=ROOT, check=True, timeout=300,
        capture_output=True,
    )  # fmt: skip
    for log in ("popgym-e2e.txt", "popgym-e2e-no-correction.txt"):
        text = (tmp_path / log).read_text()
        ratio = re.search(r"rtrl/bptt frames/s .*: collect \+ update ([\d.]+)", text)
        assert ratio and 0.2 < float(ratio.group(1)) < 5, text
        assert "[gpu_session] exit 0: " in text, text
