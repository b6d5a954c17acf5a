"""Counters, recent returns, metrics rows and the progress bar (shared by both runtimes)."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Any

from r2ac.rl.config import TrainConfig
from r2ac.rl.learning.actor import EpisodeLog
from r2ac.rl.run.run_dir import COLUMNS, MetricsLog, RunDir

RECENT = 100  # episodes in the "recent return" average


def _mean(values) -> float:
    return sum(values) / len(values) if values else math.nan


class ProgressLines:
    """The progress bar's information as plain lines, at most one every `every_s` seconds:
    frames, frames/s since the last line, recent return, estimated time left."""

    def __init__(self, total: int, initial: int, every_s: float, stream=None):
        self.total, self.frames, self.every_s = total, initial, every_s
        self.stream = stream if stream is not None else sys.stderr
        self._last = (initial, time.perf_counter())
        self._ret = ""

    def update(self, frames: int) -> None:
        self.frames += frames
        now = time.perf_counter()
        if now - self._last[1] >= self.every_s or self.frames >= self.total:
            self._print(now)

    def set_postfix(self, ret: str = "", refresh: bool = False) -> None:
        self._ret = ret

    def _print(self, now: float) -> None:
        fps = (self.frames - self._last[0]) / max(now - self._last[1], 1e-9)
        left = (self.total - self.frames) / fps if fps > 0 else math.inf
        eta = f"{left / 60:.1f} min" if math.isfinite(left) else "?"
        print(
            f"[progress] {self.frames}/{self.total} frames ({100 * self.frames / self.total:.0f}%)"
            f"  {fps:.0f} frames/s  return {self._ret or 'nan'}  left {eta}",
            file=self.stream,
            flush=True,
        )
        self._last = (self.frames, now)

    def close(self) -> None:
        pass


class Tracker:
    """Counts updates and frames, logs a metrics row every `log_every` updates."""

    columns = COLUMNS  # metrics.csv's header for a new run

    def __init__(self, cfg: TrainConfig, run: RunDir | None, saved: dict[str, Any] | None = None):
        saved = saved or {}
        self.cfg = cfg
        self.update = saved.get("update", 0)
        self.frames = saved.get("frames", 0)
        self.episodes = saved.get("episodes", 0)
        self.returns = deque(saved.get("returns", []), maxlen=RECENT)
        self.lengths = deque(saved.get("lengths", []), maxlen=RECENT)
        self._elapsed0 = saved.get("elapsed", 0.0)
        self._t0 = time.perf_counter()
        self._last = (self.frames, self._t0)
        # the policy lags since the last row (checkpointed: a resumed run's next row is the
        # uninterrupted run's)
        self._lags: list[float] = list(saved.get("lags", []))
        self.log = None
        if run is not None:
            resumed = (self.update, self.frames) if saved else (None, None)
            self.log = MetricsLog(run, *resumed, columns=self.columns)
        self.bar = self._make_bar()

    def _make_bar(self):
        """A tqdm bar on a terminal; one progress line every `progress_every_s` seconds when
        stderr is a file or a pipe (a job's log), where a bar would print nothing useful."""
        if not self.cfg.run.progress:
            return None
        if not sys.stderr.isatty():
            return ProgressLines(
                self.cfg.run.total_frames, self.frames, self.cfg.run.progress_every_s
            )
        from tqdm import tqdm

        return tqdm(
            total=self.cfg.run.total_frames,
            initial=self.frames,
            unit="frame",
            unit_scale=True,
            dynamic_ncols=True,
            smoothing=0.1,
        )

    @property
    def elapsed(self) -> float:
        return self._elapsed0 + time.perf_counter() - self._t0

    @property
    def done(self) -> bool:
        return self.update >= self.cfg.updates_total

    def record(
        self,
        frames: int,
        logs: list[EpisodeLog],
        metrics: dict[str, float],
        policy_lag: float | None = None,
        updates: int = 1,
    ) -> None:
        """`updates` updates (a trainer that runs several between records: their frames and
        episodes together, in order; a row is written where the last one ends an interval)."""
        self.update += updates
        self.frames += frames
        for log in logs:
            self.episodes += len(log.returns)
            self.returns.extend(log.returns)
            self.lengths.extend(log.lengths)
        if policy_lag is not None:
            self._lags.append(policy_lag)
        if self.bar is not None:
            self.bar.update(frames)
            self.bar.set_postfix(ret=f"{_mean(self.returns):.3f}", refresh=False)
        if self.log is not None and (self.update % self.cfg.run.log_every == 0 or self.done):
            self.log.write(self._row(metrics))

    def _row(self, metrics: dict[str, float]) -> dict[str, float]:
        now = time.perf_counter()
        fps = (self.frames - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (self.frames, now)
        row = {
            "update": self.update,
            "frames": self.frames,
            "time_s": self.elapsed,
            "fps": fps,
            "return_mean": _mean(self.returns),
            "episode_length_mean": _mean(self.lengths),
            "episodes": self.episodes,
            "policy_lag": _mean(self._lags),
            **metrics,
        }
        self._lags = []
        return row

    def state(self) -> dict[str, Any]:
        return {
            "update": self.update,
            "frames": self.frames,
            "episodes": self.episodes,
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "elapsed": self.elapsed,
            "lags": list(self._lags),
        }

    def summary(self) -> str:
        return (
            f"{self.frames} frames, {self.update} updates in {self.elapsed:.0f} s "
            f"({self.frames / max(self.elapsed, 1e-9):.0f} frames/s); recent return "
            f"{_mean(self.returns):.3f} over {len(self.returns)} episodes"
        )

    def flush(self) -> None:
        """Metrics rows (CSV and TensorBoard) written so far to disk (before a checkpoint)."""
        if self.log is not None:
            self.log.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()
