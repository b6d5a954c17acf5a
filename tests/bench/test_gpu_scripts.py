"""The GPU session's scripts and the kernel comparison scripts, checked on the CPU: the lease
runs only steps that gpu_session.sh has, and the Python scripts run end to end."""

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
    assert {"env", "tests", "bench", "bench-shapes", "profile", "cost", "e2e", "wheels"} <= steps
    for step in steps:
        assert f"gpu_session.sh {step}" in usage.stdout, step


def test_the_lease_runs_only_steps_the_session_has():
    called = re.findall(r'(?:^|\s)step "\$\{LIMIT_\w+:-\d+\}" ([a-z0-9-]+)', LEASE.read_text())
    tune_mode, full = called[:3], called[3:]  # `gpu_lease.sh tune`, then the whole lease
    assert tune_mode == ["tests", "tune", "bench-shapes"]
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
