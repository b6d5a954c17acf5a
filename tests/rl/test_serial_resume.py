"""Serial runtime: same seed -> bit-identical weights; SIGKILL + --resume -> same final weights."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from r2ac.rl.config import validate
from r2ac.rl.harness.train_cli import parse_config
from r2ac.rl.runtimes.serial import SerialRuntime
from r2ac.runs import checkpoint

from .rl_helpers import tiny

TOTAL_UPDATES = 60
CLI_ARGS = [
    "--env-options",
    "delay=3",
    "--hidden-size",
    "8",
    "--stem-features",
    "6",
    "--mlp-hidden",
    "8",
    "--unroll-length",
    "4",
    "--num-envs",
    "3",
    "--batch-size",
    "6",
    "--total-frames",
    str(4 * 6 * TOTAL_UPDATES),
    "--checkpoint-every",
    "5",
    "--log-every",
    "1",
    "--num-threads",
    "1",
    "--no-eval-at-end",
    "--no-progress",
]


def _train(**kw):
    runtime = SerialRuntime(tiny(**kw))
    runtime.train()
    return runtime.agent.state_dict()


def test_two_serial_runs_are_bit_identical():
    a, b = _train(batch_size=6), _train(batch_size=6)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = _train(batch_size=6, seed=1)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "r2ac.cli", "train", *args]


def _final_weights(run_dir: Path) -> dict:
    return checkpoint.load(run_dir / "checkpoints" / "agent.pt")["agent"]


# PPO with Adam, 2 epochs x 2 minibatches: the optimiser's moments and the learner's shuffle
# generator are in the checkpoint too, and the entropy floor's raise (a floor of 5 nats is
# above the delayed cue's ln 2: the raise grows every step).
PPO_ARGS = ["--algorithm", "ppo", "--optimizer", "adam", "--epochs", "2", "--minibatches", "2"]
PPO_ARGS += ["--entropy-floor", "5"]


@pytest.mark.parametrize(
    "extra", [[], PPO_ARGS, ["--core", "mingru-rtrl"]], ids=["impala", "ppo-adam-passes", "mingru"]
)
def test_sigkill_then_resume_gives_the_uninterrupted_weights(tmp_path, extra):
    full, killed = tmp_path / "full", tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        _cli(*CLI_ARGS, *extra, "--out-dir", str(killed)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpt = killed / "checkpoints" / "latest.pt"
    deadline = time.time() + 60
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = checkpoint.load(ckpt)["counters"]["update"]
    assert 0 < saved < TOTAL_UPDATES  # killed between checkpoints, before the end
    subprocess.run(_cli("--resume", str(killed)), env=env, check=True, capture_output=True)
    subprocess.run(
        _cli(*CLI_ARGS, *extra, "--out-dir", str(full)), env=env, check=True, capture_output=True
    )
    a, b = _final_weights(full), _final_weights(killed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with (killed / "metrics.csv").open() as f:
        updates = [int(r["update"]) for r in csv.DictReader(f)]
    assert updates == list(range(1, TOTAL_UPDATES + 1))
    resumed = checkpoint.load(killed / "checkpoints" / "latest.pt")
    assert resumed["counters"]["update"] == TOTAL_UPDATES


@pytest.mark.parametrize("core", ["elstm-rtrl", "rtu-rtrl", "gru-bptt"])
def test_the_batch_state_is_the_actors_carry_buffer_and_changes_nothing(core, monkeypatch):
    """The actors carry into slices of batch buffers, so from the second batch on the learner
    gets a buffer whole (no join of the actors' states): two in turn, or for the eLSTM (whose
    actors carry in place after the update) one; the weights after training equal those of
    the joining path bit for bit (eLSTM at N = 8: the native kernel writes into the slices)."""
    cfg = tiny(core=core, batch_size=6)  # 2 actors of 3 streams
    runtime = SerialRuntime(cfg)
    buffers = runtime.slots.buffers
    assert len(buffers) == (1 if core.startswith("elstm") else 2)
    states = [runtime.next_batch().segment.state for _ in range(4)]
    assert all(s is not b for s in states[:1] for b in buffers)  # the first batch joins
    alternate = [buffers[k % len(buffers)] for k in range(3)]
    assert [s is b for s, b in zip(states[1:], alternate, strict=True)] == [True] * 3
    runtime.close()
    carried = _train(core=core, batch_size=6)
    monkeypatch.setattr("r2ac.rl.learning.actor.StateSlots.joined", lambda self, states: None)
    joined = _train(core=core, batch_size=6)
    assert all(torch.equal(carried[k], joined[k]) for k in carried)


@pytest.mark.parametrize("algorithm", [[], PPO_ARGS])
def test_the_deferred_in_place_carry_changes_nothing(algorithm, monkeypatch):
    """The eLSTM's actors carry after each update, in place, with the weights they acted with:
    the same weights after training, bit for bit, as carrying at once into a second buffer
    (IMPALA's one pass, and PPO's passes: the learner reads the start state several times
    before the carry overwrites it). Its sensitivities are non-zero, so the carry matters."""
    extra = ["--core", "elstm-rtrl", "--seed", "3", *algorithm]
    cfg = validate(parse_config([*CLI_ARGS, *extra]))
    deferred = SerialRuntime(cfg)
    assert all(actor.defer_carry for actor in deferred.actors)
    deferred.train()
    sens = deferred.actors[0].state.sens
    assert float(sens.FZ.abs().max()) > 0
    monkeypatch.setattr("r2ac.rtrl.elstm.layer.ELSTM.defers_carry", False)
    eager = SerialRuntime(cfg)
    assert not any(actor.defer_carry for actor in eager.actors)
    eager.train()
    a, b = deferred.agent.state_dict(), eager.agent.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(x, y) for x, y in zip(sens, eager.actors[0].state.sens, strict=True))
