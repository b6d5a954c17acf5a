"""Checkpoints hold plain data and name no code; a stop and resume is bit for bit; older
files convert and resume as before.

- Every file every trainer writes (batched IMPALA and PPO, stream AC, QRC, the copy task):
  the body is {"schema": 2, "content": ...}, no string in it names a module or a class, and
  its pickle names no global but torch's own and the OrderedDict of a state_dict.
- SIGTERM mid-run and --resume: the final weights equal the uninterrupted run's bit for bit,
  for each trainer kind (the core states through their plain form).
- Older fixtures: tests/fixtures/run_986c18f, a tiny elstm-rtrl run of that commit stopped
  at update 4 of 8, from before the checksum (bare torch.save files pickling numpy arrays
  and the NamedTuples of r2ac.rtrl.elstm_math); tests/fixtures/runs_5c86f39, schema 1 as the
  last version before schema 2 wrote it (tagged numpy values and NamedTuples): PPO with Adam
  on the RTU (a state nesting PairSensitivity) stopped at update 5 of 10, stream AC stopped
  at step 25 of 40 (between two metrics rows), the copy task after 4 of 6 batches. Each comes
  with the final weights of the same run uninterrupted. Read through the converter, each
  resumes to them bit for bit and evaluates; `convert` rewrites each in schema 2.

A name where plain data belongs is refused in one line: test_loaded_values.py and
test_malformed_inputs.py.
"""

from __future__ import annotations

import io
import json
import pickletools
import re
import shutil
import signal
import zipfile
from pathlib import Path

import pytest
import torch

from r2ac.rl.harness.evaluate import main as eval_main
from r2ac.rl.harness.train_cli import main as train_main
from r2ac.rl.run.run_dir import agent_weights, read_metrics
from r2ac.rl.runtimes.base import Runtime
from r2ac.rl.stream.runtime import StreamRuntime
from r2ac.runs import checkpoint, plain
from r2ac.runs.older_checkpoints import OLDER_TAG
from r2ac.tasks import copy_cli

from .conftest import TINY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STREAM = ["--env-options", "length=4", "--hidden-size", "8", "--stream-mlp", "8",
          "--num-agents", "2", "--log-every", "10", "--no-progress", "--eval-sets", "1",
          "--eval-episodes", "2"]  # fmt: skip
# each kind: its `r2ac train` arguments (40 updates or steps; checkpoints only when stopped
# and at the end), the step class a SIGTERM is raised from, the update it is raised after
KINDS = {
    "impala": (["impala", *TINY, "--core", "rtu-rtrl", "--total-frames", str(24 * 10)], Runtime, 4),
    "ppo": (
        ["ppo", *TINY, "--optimizer", "adam", "--epochs", "2", "--minibatches", "2",
         "--total-frames", str(24 * 10)],
        Runtime,
        5,
    ),
    "stream-ac": (["stream-ac", *STREAM, "--total-frames", "80"], StreamRuntime, 25),
    "stream-q": (["stream-q", *STREAM, "--total-frames", "80"], StreamRuntime, 25),
}  # fmt: skip
COPY = ["--length", "3", "--hidden", "8", "--batch-size", "4", "--eval-every", "2",
        "--test-size", "20", "--no-stop-when-solved"]  # fmt: skip
NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # module:Class
GLOBALS = {"torch", "torch._utils", "torch.storage", "collections"}  # tensors; a state_dict


def _train_stopped(argv: list[str], cls: type, after: int, monkeypatch) -> int:
    """`r2ac train ARGV` with a SIGTERM after `after` steps of `cls`."""
    original, count = cls.step, {"n": 0}

    def step(self, tracker):
        original(self, tracker)
        count["n"] += 1
        if count["n"] == after:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(cls, "step", step)
    try:
        return train_main(argv)
    finally:
        monkeypatch.setattr(cls, "step", original)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Per kind a finished run (`full`) of each trainer and the copy task's."""
    root = tmp_path_factory.mktemp("plain")
    for kind, (argv, _, _) in KINDS.items():
        assert train_main([*argv, "--out-dir", str(root / kind)]) == 0, kind
    assert copy_cli.main([*COPY, "--train-steps", "4", "--out", str(root / "copy")]) == 0
    return root


def _files(runs: Path) -> list[Path]:
    found = [runs / k / "checkpoints" / f for k in KINDS for f in ("latest.pt", "agent.pt")]
    return [*found, runs / "copy" / "checkpoint.pt"]


def _body_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    assert data.startswith(checkpoint.MAGIC)
    return data[data.index(b"\n", len(checkpoint.MAGIC)) + 1 :]


def _strings(obj, out: list[str]) -> list[str]:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _strings(key, out)
            _strings(value, out)
        _strings(getattr(obj, "_metadata", None), out)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _strings(value, out)
    return out


def test_every_file_holds_plain_data_and_names_no_code(runs):
    for path in _files(runs):
        raw = _body_bytes(path)
        body = torch.load(io.BytesIO(raw), weights_only=True)
        assert set(body) == {"schema", "content"} and body["schema"] == 2, path
        assert plain.problem(body["content"]) is None, path
        strings = _strings(body["content"], [])
        assert strings, path  # config keys, "MT19937", ...: there are strings to look at
        named = [s for s in strings if "r2ac." in s or NAME.match(s) or s == OLDER_TAG]
        assert named == [], (path, named[:5])
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            (pkl,) = [n for n in z.namelist() if n.endswith("data.pkl")]
            ops = list(pickletools.genops(z.read(pkl)))
        modules = {arg.split(" ")[0] for op, arg, _ in ops if op.name == "GLOBAL"}
        assert modules and modules <= GLOBALS, (path, modules)
        assert not any(op.name == "STACK_GLOBAL" for op, _, _ in ops), path


def test_a_core_state_is_written_as_the_dict_of_its_fields(runs):
    payload = checkpoint.load(runs / "impala" / "checkpoints" / "latest.pt")
    state = payload["actors"][0]["state"]  # the RTU's: RTUState(c, PairSensitivity(W, v))
    assert set(state) == {"c", "sens"} and set(state["sens"]) == {"W", "v"}
    assert all(isinstance(t, torch.Tensor) for t in (state["c"], *state["sens"].values()))
    assert isinstance(payload["rng"]["numpy"][1], torch.Tensor)  # numpy's key, as a tensor
    assert all(isinstance(v, torch.Tensor) for v in payload["actors"][0]["env"].values()
               if not isinstance(v, dict))  # fmt: skip


def _same_weights(a: Path, b: Path) -> None:
    got, want = agent_weights(a), agent_weights(b)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want), [
        k for k in want if not torch.equal(got[k], want[k])
    ]


def _same_rows(a: Path, b: Path) -> None:
    wall = {"time_s", "fps", "learner_ms"}
    rows = [
        [{k: v for k, v in r.items() if k not in wall} for r in read_metrics(p)] for p in (a, b)
    ]
    assert rows[0] and len(rows[0]) == len(rows[1]), a
    for got, want in zip(*rows, strict=True):
        assert got == pytest.approx(want, rel=0, abs=0, nan_ok=True), got["update"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_stop_and_resume_is_bit_for_bit(kind, runs, tmp_path, monkeypatch):
    argv, cls, after = KINDS[kind]
    part = tmp_path / kind
    assert _train_stopped([*argv, "--out-dir", str(part)], cls, after, monkeypatch) == 143
    stopped = checkpoint.load(part / "checkpoints" / "latest.pt")["counters"]["update"]
    assert stopped == after
    assert train_main(["--resume", str(part)]) == 0
    _same_weights(part / "checkpoints" / "agent.pt", runs / kind / "checkpoints" / "agent.pt")
    _same_rows(part / "metrics.csv", runs / kind / "metrics.csv")


# --- older files ------------------------------------------------------------------------------


OLDER_RUNS = ["run_986c18f", "runs_5c86f39/ppo", "runs_5c86f39/ac"]


def _copy(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name.replace("/", "-")
    shutil.copytree(FIXTURES / name, run)
    return run


def test_the_older_fixtures_are_the_older_kinds():
    bare = (FIXTURES / "run_986c18f" / "checkpoints" / "latest.pt").read_bytes()
    assert not bare.startswith(checkpoint.MAGIC) and b"r2ac.rtrl.elstm_math" in bare
    assert b"numpy" in bare  # arrays pickled as numpy's
    for name in ("ppo/checkpoints/latest.pt", "ac/checkpoints/latest.pt", "copy/checkpoint.pt"):
        raw = _body_bytes(FIXTURES / "runs_5c86f39" / name)
        body = torch.load(io.BytesIO(raw), weights_only=True)
        assert "schema" not in body, name  # schema 1
        assert OLDER_TAG.encode() in raw or name.startswith("copy"), name
    assert (
        b"r2ac.rtrl.pair_math:PairSensitivity"
        in (FIXTURES / "runs_5c86f39" / "ppo" / "checkpoints" / "latest.pt").read_bytes()
    )


@pytest.mark.parametrize("name", OLDER_RUNS)
def test_an_older_stopped_run_resumes_to_the_uninterrupted_weights(name, tmp_path):
    run = _copy(name, tmp_path)
    payload = checkpoint.load(run / "checkpoints" / "latest.pt")
    assert plain.problem(payload) is None
    assert train_main(["--resume", str(run)]) == 0
    _same_weights(run / "checkpoints" / "agent.pt", FIXTURES / name / "full_agent.pt")
    _same_rows(run / "metrics.csv", FIXTURES / name / "full_metrics.csv")
    assert json.loads((run / "eval.json").read_text())["sets"] == 1


@pytest.mark.parametrize("name", OLDER_RUNS)
def test_an_older_stopped_run_evaluates(name, tmp_path):
    run = _copy(name, tmp_path)
    out = tmp_path / "eval.json"
    assert eval_main([str(run), "--out", str(out), "--episodes", "2", "--sets", "1"]) == 0
    assert json.loads(out.read_text())["episodes_per_set"] == 2


def test_an_older_copy_run_resumes_to_the_uninterrupted_weights(tmp_path):
    out = _copy("runs_5c86f39/copy", tmp_path)
    assert copy_cli.main([*COPY, "--train-steps", "6", "--resume", "--out", str(out)]) == 0
    got = checkpoint.load(out / "checkpoint.pt")["model"]
    want = checkpoint.load(FIXTURES / "runs_5c86f39" / "copy" / "full_checkpoint.pt")["model"]
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    full = FIXTURES / "runs_5c86f39" / "copy" / "full_curve.csv"
    rows = [[ln.split(",") for ln in p.read_text().splitlines()] for p in (out / "curve.csv", full)]
    seconds = rows[0][0].index("seconds")
    assert [r[:seconds] + r[seconds + 1 :] for r in rows[0]] == [
        r[:seconds] + r[seconds + 1 :] for r in rows[1]
    ]


def test_convert_rewrites_each_older_file_in_schema_2(tmp_path):
    files = [
        "run_986c18f/checkpoints/latest.pt",
        "run_986c18f/checkpoints/agent.pt",
        "run_72d15e5/checkpoints/latest.pt",
        "runs_d4c38cc/q/checkpoints/latest.pt",
        "runs_5c86f39/ppo/checkpoints/latest.pt",
        "runs_5c86f39/ac/checkpoints/latest.pt",
        "runs_5c86f39/copy/checkpoint.pt",
    ]
    for i, name in enumerate(files):
        path = tmp_path / f"{i}.pt"
        shutil.copy(FIXTURES / name, path)
        read = checkpoint.load(path)
        assert checkpoint.main(["convert", str(path)]) == 0
        body = torch.load(io.BytesIO(_body_bytes(path)), weights_only=True)
        assert body["schema"] == 2, name
        again = checkpoint.load(path)
        pairs = zip(_leaves(read), _leaves(again), strict=True)
        assert all(_same(a, b) for a, b in pairs), name


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and (a == b or a != a and b != b)  # NaN as NaN


def _leaves(obj):
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _leaves(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _leaves(value)
    else:
        yield obj
