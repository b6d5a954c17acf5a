"""r2ac.allocator: when `r2ac` re-executes itself with jemalloc preloaded, and that it does."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from r2ac.allocator import CHOICE, PRELOADED, preload_environment, runs_compiled_step

COMPILED = ["train", "stream-ac", "--compile-step"]


def test_runs_compiled_step_from_the_flag_or_the_resumed_runs_config(tmp_path):
    assert runs_compiled_step(COMPILED)
    assert not runs_compiled_step(["train", "stream-ac"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"stream": {"compile_step": True}}))
    assert runs_compiled_step(["train", "--resume", str(run)])
    assert runs_compiled_step(["train", f"--resume={run}"])
    (run / "config.json").write_text(json.dumps({"stream": {"compile_step": False}}))
    assert not runs_compiled_step(["train", "--resume", str(run)])
    (run / "config.json").write_text("{not json")
    assert not runs_compiled_step(["train", "--resume", str(run)])
    assert not runs_compiled_step(["train", "--resume", str(tmp_path / "missing")])
    assert not runs_compiled_step(["train", "--resume"])


def test_preload_environment_decides():
    env = {"PATH": "/bin"}
    out = preload_environment(COMPILED, env, "libjemalloc.so.2")
    assert out == {"PATH": "/bin", "LD_PRELOAD": "libjemalloc.so.2", PRELOADED: "libjemalloc.so.2"}
    assert preload_environment(["train"], env, "libjemalloc.so.2") is None  # eager: no gain
    assert preload_environment(COMPILED, env, None) is None  # not installed
    assert preload_environment(COMPILED, {**env, CHOICE: "system"}, "libjemalloc.so.2") is None
    assert preload_environment(COMPILED, {**env, PRELOADED: "x"}, "libjemalloc.so.2") is None
    chosen = preload_environment(COMPILED, {**env, CHOICE: "/opt/libx.so"}, None)
    assert chosen["LD_PRELOAD"] == "/opt/libx.so"
    kept = preload_environment(COMPILED, {**env, "LD_PRELOAD": "liba.so"}, "libjemalloc.so.2")
    assert kept["LD_PRELOAD"] == "liba.so libjemalloc.so.2"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc: Linux")
def test_the_command_reexecutes_itself_once_with_the_library_preloaded():
    """A harmless library stands in for jemalloc (R2AC_ALLOCATOR=PATH): the re-executed
    process has it in LD_PRELOAD, mapped, and the marker that stops a second re-execution."""
    library = ctypes.util.find_library("m")
    if library is None:
        pytest.skip("no libm to preload")
    probe = (
        "import os, sys; sys.argv = ['r2ac', 'train', 'stream-ac', '--compile-step', '--help'];"
        "from r2ac.allocator import reexec_with_fast_allocator, preloaded_library;"
        "reexec_with_fast_allocator();"
        "print(os.environ.get('LD_PRELOAD'), preloaded_library())"
    )
    env = {**os.environ, CHOICE: library}
    env.pop(PRELOADED, None)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [library, library]
