"""Run directories written before the streaming agents had a package, subcommands and a
checkpoint section of their own (commit d4c38cc) resume and evaluate.

tests/fixtures/runs_d4c38cc holds, per kind (stream AC, QRC, IMPALA), a tiny run of that
commit's `r2ac train` stopped by SIGTERM before its end (config.json with the `study` group and
`--runtime stream` / `--streaming`; the checkpoint's streaming state under
learner.optimizer.state, QRC's under stream AC's keys), and the final weights of the same run
uninterrupted (full_agent.pt). Resumed here, each finishes where the uninterrupted run did:
stream AC and IMPALA bit for bit (the same arithmetic), QRC within float32 rounding (its
gradients now come from the hand-written VJPs rather than autograd of the same step).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from r2ac.rl.config import validate
from r2ac.rl.harness.evaluate import main as eval_main
from r2ac.rl.harness.train_cli import main as train_main
from r2ac.rl.run.run_dir import RunDir, agent_weights

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs_d4c38cc"


def _copy(kind: str, tmp_path: Path) -> Path:
    run = tmp_path / kind
    shutil.copytree(FIXTURES / kind, run)
    return run


@pytest.mark.parametrize("kind", ["ac", "q", "impala"])
def test_an_older_run_reads_as_its_algorithm(kind, tmp_path):
    cfg = validate(RunDir.open(_copy(kind, tmp_path)).config())
    algorithm = {"ac": "stream-ac", "q": "stream-q", "impala": "impala"}[kind]
    assert cfg.loss.algorithm == algorithm and cfg.runtime.name == "serial"
    assert cfg.streaming == (kind != "impala")


@pytest.mark.parametrize(("kind", "tolerance"), [("ac", 0.0), ("q", 1e-5), ("impala", 0.0)])
def test_an_older_stopped_run_resumes_to_the_uninterrupted_result(kind, tolerance, tmp_path):
    run = _copy(kind, tmp_path)
    assert train_main(["--resume", str(run)]) == 0
    got = agent_weights(run / "checkpoints" / "agent.pt")
    want = agent_weights(FIXTURES / kind / "full_agent.pt")
    assert set(got) == set(want)
    worst = max((got[k].double() - want[k].double()).abs().max().item() for k in want)
    assert worst <= tolerance, worst
    assert json.loads((run / "eval.json").read_text())["sets"] == 1
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == len((FIXTURES / kind / "full_metrics.csv").read_text().splitlines())


@pytest.mark.parametrize("kind", ["ac", "q", "impala"])
def test_an_older_stopped_run_evaluates(kind, tmp_path):
    run = _copy(kind, tmp_path)
    out = tmp_path / f"{kind}.json"
    assert eval_main([str(run), "--out", str(out), "--episodes", "2", "--sets", "1"]) == 0
    result = json.loads(out.read_text())
    assert result["sets"] == 1 and result["episodes_per_set"] == 2
    if kind != "impala":
        assert result["num_agents"] == 2 and len(result["agents"]) == 2


def test_the_older_streaming_checkpoint_is_read_through_the_converter(tmp_path):
    """The converter has teeth: the stored state is where the older layout kept it."""
    payload = RunDir.open(_copy("q", tmp_path)).load_checkpoint()
    assert "stream" not in payload
    assert "theta_actor" in payload["learner"]["optimizer"]["state"]
    assert torch.is_tensor(payload["learner"]["optimizer"]["state"]["theta_actor"])
