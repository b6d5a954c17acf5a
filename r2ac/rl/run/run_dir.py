"""The run directory: resolved config, git revision, metrics (CSV + TensorBoard), curve, checkpoints.

RUN/.lock                  held (fcntl.flock) by the process training in RUN
RUN/config.json            the resolved TrainConfig (+ git revision, start time), atomic
RUN/metrics.csv            one row every log_every updates (COLUMNS), appended
RUN/tb/                    TensorBoard events (same scalars)
RUN/curve.png              return vs frames, written at the end
RUN/checkpoints/latest.pt  full training state (atomic, checksummed, data only): --resume
RUN/checkpoints/agent.pt   agent state_dict only: eval, --load-stem
RUN/eval.json              evaluation protocol result
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from r2ac.errors import ConfigError, check_writable
from r2ac.rl.config import (
    REMOVED_OPTIONS,
    TrainConfig,
    flatten,
    from_dict,
    to_dict,
    upgrade_older,
)
from r2ac.runs import checkpoint
from r2ac.runs.locked_dir import (
    LockedDir,
    git_revision,
    holds_nothing,
    machine,
    machine_changes,
    read_json,
    write_json,
)
from r2ac.runs.schema import NUMBER, OPTIMIZER, STATE_DICT, WEIGHTS_FILE, ListOf, Opt

COLUMNS = (
    "update",
    "frames",
    "time_s",
    "fps",
    "return_mean",
    "episode_length_mean",
    "episodes",
    "loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "entropy",
    "entropy_cost",  # the configured one, or raised under --entropy-floor
    "grad_norm",
    "lr",
    "policy_lag",
    "value_mean",
    "value_scale",
    "actor_restarts",
    "actors_missing",  # ray: actors seen dead whose restart has not delivered yet
    "learner_ms",  # wall time of the last update (host-to-device copy included)
    "learner_cuda_peak_mib",  # peak CUDA memory allocated by torch so far; blank on the CPU
)


# What `--resume` needs of checkpoints/latest.pt (r2ac.runs.schema), checked before use.
ACTOR_STATE = {
    "obs": object,
    "last_reward": object,
    "reset": object,
    "state": object,
    "generator": torch.Tensor,
    "env": object,
}
TRAINING_CHECKPOINT = {
    "agent": STATE_DICT,
    # the batched trainer's learner; the streaming agents' own section (r2ac/rl/stream/checkpoint.py)
    "learner": Opt({"optimizer": OPTIMIZER, "scheduler": dict, "entropy_boost": Opt(NUMBER)}),
    "stream": Opt(dict),
    "rng": {"torch": torch.Tensor, "numpy": (tuple, list), "python": (tuple, list)},
    "counters": {
        "update": Opt(int),
        "frames": Opt(int),
        "episodes": Opt(int),
        "returns": Opt(ListOf(NUMBER)),
        "lengths": Opt(ListOf(NUMBER)),
        "elapsed": Opt(NUMBER),
        "lags": Opt(ListOf(NUMBER)),
    },
    "config": Opt(dict),
    "runtime": Opt(str),
    "actors": Opt(ListOf(ACTOR_STATE)),
    "actor_restarts": Opt(int),
}


def agent_weights(path: str | Path) -> dict:
    """The agent state_dict in a weights file (`{"agent": ...}` or a bare state_dict, e.g. a
    foreign one: loaded with a warning that it has no checksum)."""
    obj = checkpoint.load(path, expect=WEIGHTS_FILE, what="weights file")
    return obj["agent"] if isinstance(obj.get("agent"), dict) else obj


# Options every config.json holds (older ones lack some later options, never these): a
# config without them was emptied or damaged, and defaults must not stand in for them
REQUIRED_FIELDS = ("env", "core", "hidden_size", "unroll_length", "batch_size", "total_frames")


def default_out_dir(cfg: TrainConfig, root: str | Path = "runs") -> str:
    """runs/<time>-<env>-<core>-<pid>[-k]: the pid keeps two processes started in the same
    second apart, the suffix k one process that starts two runs in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{cfg.env.id.replace('/', '-')}-{cfg.model.core}-{os.getpid()}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return str(path)


class RunDir(LockedDir):
    """The directory of one `r2ac train` run (the layout in the module docstring)."""

    temp_folders = ("checkpoints",)

    config_path = property(lambda self: self.path / "config.json")
    metrics_path = property(lambda self: self.path / "metrics.csv")
    checkpoint_path = property(lambda self: self.path / "checkpoints" / "latest.pt")
    agent_path = property(lambda self: self.path / "checkpoints" / "agent.pt")
    eval_path = property(lambda self: self.path / "eval.json")
    curve_path = property(lambda self: self.path / "curve.png")
    tb_path = property(lambda self: self.path / "tb")

    @classmethod
    def check_new(cls, path: str | Path) -> None:
        """ConfigError unless `path` is absent or an empty, writable directory (nothing is
        written); the message says how to continue or restart a run found there."""
        p, run = Path(path), cls(path)
        check_writable(p, "--out-dir")
        if holds_nothing(p):
            return
        if os.path.lexists(run.checkpoint_path):
            raise ConfigError(
                f"run directory {p} holds a run; continue it with `r2ac train "
                f"--resume {p}` or choose another --out-dir"
            )
        if run.config_path.is_file():
            raise ConfigError(
                f"run directory {p} holds a run stopped before its first "
                f"checkpoint; start it again with `r2ac train --restart {p}` or "
                "choose another --out-dir"
            )
        raise ConfigError(f"{p} exists and is not empty; choose another --out-dir")

    @classmethod
    def create(cls, path: str | Path, cfg: TrainConfig) -> RunDir:
        cls.check_new(path)
        run = cls(path)
        run.path.mkdir(parents=True, exist_ok=True)
        run.acquire()
        if run.config_path.exists():  # another process created it since check_new
            run.release()
            raise ConfigError(f"run directory {run.path} was just created by another process")
        meta = {
            "config": to_dict(cfg),
            "git_revision": git_revision(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": machine(cfg.runtime.num_threads),  # the runtime sets them after this
        }
        write_json(run.config_path, meta)
        return run

    def discard(self, remove_folder: bool) -> None:
        """Undo `create` (config.json, the lock, the folder if it was new) and release."""
        self.config_path.unlink(missing_ok=True)
        (self.path / checkpoint.LOCK_NAME).unlink(missing_ok=True)
        self.release()
        if remove_folder:
            shutil.rmtree(self.path, ignore_errors=True)

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        run = cls(path)
        if not run.config_path.is_file():
            raise ConfigError(f"{path} is not a run directory (no config.json)")
        return run

    def config(self) -> TrainConfig:
        """The run's config (ConfigError naming config.json for a damaged or emptied one)."""
        meta = read_json(self.config_path)
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
            raise ConfigError(f"{self.config_path}: no config object in it; restore the file")
        try:
            return from_dict(meta["config"], require=REQUIRED_FIELDS)
        except ConfigError as exc:
            raise ConfigError(f"{self.config_path}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{self.config_path}: unreadable config ({exc})") from exc

    def machine_changes(self) -> list[str]:
        """How this machine differs from the one that created the run, in what changes floats
        (`r2ac.runs.locked_dir.machine_changes`); [] for runs that did not record theirs."""
        meta = read_json(self.config_path)
        return machine_changes(meta.get("machine") if isinstance(meta, dict) else None, machine())

    def save_checkpoint(self, payload: dict[str, Any]) -> None:
        checkpoint.save_atomic({"agent": payload["agent"]}, self.agent_path)
        checkpoint.save_atomic(payload, self.checkpoint_path)

    # What a start of the run writes besides config.json: `--restart` moves them aside.
    RUN_OUTPUTS = ("metrics.csv", "curve.png", "eval.json", "tb", "checkpoints")

    def restart(self) -> Path | None:
        """Start again from config.json (a run stopped before its first checkpoint): what the
        earlier start wrote (metrics, TensorBoard events, checkpoints folder, eval.json,
        curve) is kept, moved by renames (atomic, no copy) into RUN/replaced-<time>/;
        returns that folder (None when there was nothing). A checkpoint that can be resumed
        is never moved: ConfigError naming `--resume`."""
        if os.path.lexists(self.checkpoint_path) and not checkpoint.special_kind(
            self.checkpoint_path
        ):
            raise ConfigError(
                f"{self.path} holds a checkpoint; continue it with `r2ac train "
                f"--resume {self.path}` (or delete the directory)"
            )
        present = [self.path / n for n in self.RUN_OUTPUTS if os.path.lexists(self.path / n)]
        if not present:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest, k = self.path / f"replaced-{stamp}", 1
        while os.path.lexists(dest):
            k += 1
            dest = self.path / f"replaced-{stamp}-{k}"
        staging = self.path / f".{dest.name}.partial"
        staging.mkdir()
        for p in present:
            os.rename(p, staging / p.name)
        os.rename(staging, dest)
        checkpoint.fsync_directory(self.path)
        return dest

    def load_checkpoint(self) -> dict[str, Any]:
        path = self.checkpoint_path
        kind = checkpoint.special_kind(path)
        if kind:
            raise ConfigError(
                f"{path} is {kind}, not a checkpoint file; put the run's checkpoint back "
                "there to continue it (nothing was changed)"
            )
        if not os.path.lexists(path):
            raise ConfigError(
                f"{self.path} has no checkpoint (it stopped before its first "
                f"one); start it again with `r2ac train --restart {self.path}` (what it "
                "wrote is kept in a replaced-<time> folder)"
            )
        # Weights-only, checksummed, its structure checked: a run directory may come from
        # someone else.
        return checkpoint.load(path, expect=TRAINING_CHECKPOINT, what="training checkpoint")


# Fields a user may change in config.json between runs of one directory: where it lives and
# how it is shown and evaluated, not what it trains.
EDITABLE_FIELDS = frozenset(
    {"out_dir", "progress", "eval_sets", "eval_episodes", "eval_greedy", "eval_at_end"}
)


def config_differences(saved: dict, current: dict) -> list[str]:
    """`field: checkpoint X, config.json Y` for each training field that differs (by flat
    option names, whether either side is grouped or flat; an option missing from a side,
    one its run predates, counts as its default)."""

    def norm(value):  # tuples and lists alike, as JSON has them
        return json.loads(json.dumps(value))

    # A checkpoint from before the groups is flat; an option it predates had its default.
    # Options since removed were at their defaults (from_dict refuses any other value).
    defaults = TrainConfig().flat()
    saved = {**defaults, **upgrade_older(_without_removed(flatten(saved)))}
    current = {**defaults, **upgrade_older(_without_removed(flatten(current)))}
    names = sorted((set(saved) | set(current)) - EDITABLE_FIELDS)
    return [
        f"{n}: checkpoint {norm(saved.get(n))!r}, config.json {norm(current.get(n))!r}"
        for n in names
        if norm(saved.get(n)) != norm(current.get(n))
    ]


def _without_removed(flat: dict) -> dict:
    return {k: v for k, v in flat.items() if k not in REMOVED_OPTIONS}


def check_same_config(run: RunDir, cfg: TrainConfig, payload: dict[str, Any]) -> None:
    """ConfigError if config.json no longer describes the run in the checkpoint."""
    saved = payload.get("config")
    if not isinstance(saved, dict):
        return  # a checkpoint from before configs were stored in it: nothing to compare
    diff = config_differences(saved, to_dict(cfg))
    if diff:
        raise ConfigError(
            f"{run.config_path} differs from the config the checkpoint was trained "
            f"with ({'; '.join(diff)}); restore it, or start a new run"
        )


class MetricsLog:
    """CSV rows + TensorBoard scalars, appended. On resume from `resume_update` (at
    `resume_frames`), rows written after it are dropped: the CSV is rewritten atomically
    (temp file + rename) only if it holds such rows, and TensorBoard is told to hide the
    scalars logged after `resume_frames` (its steps are frame counts), keeping all before."""

    def __init__(
        self,
        run: RunDir,
        resume_update: int | None = None,
        resume_frames: int | None = None,
        columns: tuple[str, ...] = COLUMNS,
    ):
        self.run = run
        if resume_update is not None:
            drop_rows_after(run.metrics_path, resume_update)
        new = not run.metrics_path.is_file() or run.metrics_path.stat().st_size == 0
        # a run started by an older version keeps its header (its columns, in its order)
        self.columns = columns if new else _header(run.metrics_path)
        self._file = run.metrics_path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        if new:
            self._csv.writeheader()
        self._file.flush()
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard discards events at steps >= purge_step from the earlier files.
            purge = None if resume_frames is None else resume_frames + 1
            self._tb = SummaryWriter(str(run.tb_path), purge_step=purge)
        except ImportError:  # tensorboard is a dependency, but keep the CSV working without
            pass

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            self._tb.flush()

    def write(self, row: dict[str, float]) -> None:
        self._csv.writerow({k: row.get(k, "") for k in self.columns})
        self._file.flush()
        if self._tb is not None:
            step = int(row["frames"])
            for key, value in row.items():
                if key not in ("update", "frames") and value is not None and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()  # like the CSV row: on disk now, not minutes later

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _header(path: Path) -> tuple[str, ...]:
    """The column names of an existing metrics CSV (its first line)."""
    with path.open(newline="") as f:
        return tuple(next(csv.reader(f), COLUMNS))


def _complete_rows(text: str) -> tuple[list[dict[str, str]], tuple[str, ...]]:
    """Rows of a metrics CSV, without a last line cut short by a kill (no newline, missing
    columns, or an update that is not a number), and its header."""
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    columns = tuple(reader.fieldnames or COLUMNS)
    rows = []
    for row in reader:
        whole = row.get(columns[-1]) is not None
        if whole and ("update" not in columns or str(row["update"]).isdigit()):
            rows.append(row)
    return rows, columns


def drop_rows_after(path: Path, update: int) -> None:
    """Remove the rows after `update` (logged after the checkpoint a resume starts from),
    atomically; the file is left untouched when there are none."""
    if not path.is_file():
        return
    text = path.read_text()
    rows, columns = _complete_rows(text)
    kept = [r for r in rows if int(r["update"]) <= update]
    if len(kept) == len(rows) and text.endswith("\n"):
        return
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(kept)
    checkpoint.write_atomic(out.getvalue().encode(), path)


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The complete rows of a metrics CSV as floats (NaN for an empty cell). Safe on a file a
    live run is writing: an empty file, or a header or row cut short, gives only what is whole."""
    rows, _ = _complete_rows(Path(path).read_text())
    return [
        {k: float(v) if v not in ("", None) else math.nan for k, v in r.items() if k is not None}
        for r in rows
    ]


def plot_curve(run: RunDir, title: str = "", out: Path | None = None) -> Path | None:
    """Mean episode return vs frames from metrics.csv, as a PNG (None if nothing to plot)."""
    rows = [r for r in read_metrics(run.metrics_path) if math.isfinite(r["return_mean"])]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["frames"] for r in rows], [r["return_mean"] for r in rows])
    ax.set_xlabel("frames")
    ax.set_ylabel("mean episode return (last 100)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = out or run.curve_path
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
