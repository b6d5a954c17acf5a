"""`r2ac copy`: train an eLSTM on the copy task and score every output bit on a held-out set.

Writes DIR/config.json (options, git revision, machine), DIR/checkpoint.pt (at every
evaluation), DIR/curve.csv (the learning curve, rewritten atomically at every evaluation),
DIR/curve.png (its plot) and, last, DIR/results.json (final test metrics: bit_accuracy counts
every output bit, 0s and 1s alike; sequence_accuracy the sequences with every bit right).
`--train-steps 0` evaluates the untrained model. Bad options: a message and exit code 2,
nothing written. SIGINT / SIGTERM: the batch finishes, a checkpoint is written, one line,
exit 130 / 143; the same command with `--resume` continues bit-identically.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from dataclasses import asdict

import torch
import tyro

from r2ac.errors import ConfigError, check_writable, write_failure_line
from r2ac.perf import check_memory, keep_freed_memory
from r2ac.runs.checkpoint import LOCK_NAME, special_kind
from r2ac.runs.locked_dir import LockedDir, git_revision, machine, read_json, write_json
from r2ac.runs.stop import TrainingInterrupted, exit_code, raise_on_signal, signal_name
from r2ac.tasks.copy import CHECKPOINT_NAME, CopyConfig, curve, metrics, resume, training
from r2ac.tasks.copy.config import DTYPES
from r2ac.tasks.copy.data import make_test_set

PROG = "r2ac copy"


def write_config(cfg: CopyConfig) -> dict:
    """DIR/config.json (atomic): options, schedule, git revision, machine; a resumed run keeps
    the record of the earlier invocations. Returns what was written."""
    meta = {
        "config": asdict(cfg),
        "schedule": cfg.schedule,
        "git_revision": git_revision(),
        "machine": machine(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    path = os.path.join(cfg.out, "config.json")
    if cfg.resume and os.path.exists(path):
        before = read_json(path)
        earlier = before.pop("earlier_invocations", []) if isinstance(before, dict) else []
        meta["earlier_invocations"] = [*(earlier if isinstance(earlier, list) else []), before]
    write_json(path, meta)
    return meta


class _Progress:
    """A progress bar (shown from `start`, once the checkpoint has been read back) and the two
    callbacks of `training.train` that feed it; on_eval also rewrites curve.csv, so that the
    file follows the checkpoint."""

    def __init__(self, cfg: CopyConfig):
        self.cfg, self.bar, self.seq = cfg, None, "-"

    def start(self) -> None:
        from tqdm import tqdm

        cfg = self.cfg
        self.bar = tqdm(
            total=cfg.train_steps,
            desc=f"copy l={cfg.length} {cfg.core}-{cfg.rule} {cfg.schedule}",
            unit="batch",
            dynamic_ncols=True,
            mininterval=2.0,
        )

    def on_batch(self, step, stats) -> None:
        self.bar.update(step - self.bar.n)  # step counts from the checkpoint when resuming
        self.bar.set_postfix(
            loss=f"{stats.loss:.3f}",
            train_bits=f"{stats.bit_accuracy:.3f}",
            test_seq=self.seq,
            refresh=False,
        )

    def on_eval(self, rows) -> None:
        row = rows[-1]
        curve.write_curve_csv(rows, os.path.join(self.cfg.out, "curve.csv"))
        self.seq = f"{row['test_sequence_accuracy']:.3f}"
        self.bar.write(
            f"step {int(row['step']):>6}  {row['seconds']:8.1f}s  test bits "
            f"{row['test_bit_accuracy']:.4f}  sequences {row['test_sequence_accuracy']:.4f}  "
            f"loss {row['test_loss']:.4f}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def final_results(cfg: CopyConfig, model, result: training.RunResult) -> dict:
    """results.json's content: the final test metrics, per-length accuracy, the recipe."""
    results = dict(result.final)
    test_set = make_test_set(cfg.length, cfg.test_size, cfg.test_seed)
    by_length = metrics.sequence_accuracy_by_length(model, test_set, cfg.device)
    results["longest_all_right"] = metrics.longest_all_right(by_length)
    results["sequence_accuracy_by_length"] = {str(k): v for k, v in by_length.items()}
    results.update(
        length=cfg.length,
        core=cfg.core,
        rule=cfg.rule,
        schedule=cfg.schedule,
        hidden=cfg.hidden,
        readout_hidden=cfg.readout_hidden,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        train_steps=result.steps,
        updates=result.updates,
        train_seconds=round(result.train_seconds, 2),
        solved_at_step=result.solved_at_step,
    )
    return results


def run(cfg: CopyConfig) -> dict:
    """Train and evaluate per `cfg`, write the run's files into cfg.out; return the results.

    Raises TrainingInterrupted on SIGINT / SIGTERM, with the checkpoint written.
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    meta: dict = {}
    progress = _Progress(cfg)

    def start() -> None:  # once the checkpoint (if any) has been read back whole
        meta.update(write_config(cfg))
        progress.start()

    wall0 = time.perf_counter()
    checkpoint = os.path.join(cfg.out, CHECKPOINT_NAME)
    try:
        model, result = training.train(
            cfg, progress.on_batch, progress.on_eval, checkpoint, on_start=start
        )
    finally:
        progress.close()
    with raise_on_signal(result.steps):  # the checkpoint is complete: a signal stops at once
        results = final_results(cfg, model, result)
        results["wall_seconds"] = round(time.perf_counter() - wall0, 2)
        results["git_revision"] = meta["git_revision"]
        curve.write_curve_csv(result.curve, os.path.join(cfg.out, "curve.csv"))
        curve.plot_curves(
            [(f"{cfg.core}-{cfg.rule}, {cfg.schedule}", result.curve)],
            os.path.join(cfg.out, "curve.png"),
            title=f"copy task, l = {cfg.length}, N = {cfg.hidden}, B = {cfg.batch_size}, "
            f"lr = {cfg.lr:g}",
        )
        write_json(os.path.join(cfg.out, "results.json"), results)  # last: the run is done
    return results


def check_new_out(cfg: CopyConfig) -> None:
    """ConfigError unless --out can be written and, without --resume, holds nothing (an
    earlier run's checkpoint and results are never overwritten); with --resume it must
    exist."""
    check_writable(cfg.out, "--out")
    if cfg.resume and not os.path.isdir(cfg.out):
        raise ConfigError(
            f"--resume: --out {cfg.out} does not exist, so there is no run to continue; "
            "drop --resume to start a new one"
        )
    if not cfg.resume and os.path.isdir(cfg.out) and set(os.listdir(cfg.out)) - {LOCK_NAME}:
        raise ConfigError(
            f"--out {cfg.out} is not empty; add --resume to continue the run there, "
            "or choose another --out"
        )


def memory_parts(cfg: CopyConfig) -> dict[str, tuple[int, str]]:
    """Rough bytes of what a copy run holds (within a few x): sequences of 2*length steps
    (one-hot inputs, targets, masks and their generation's temporaries, ~48 bytes a step),
    the core's activations kept for the backward pass and the RTRL sensitivities."""
    steps, n = 2 * cfg.length, cfg.hidden
    chunk = min(cfg.segment or steps, steps)
    item = DTYPES[cfg.dtype].itemsize
    sens = cfg.batch_size * 3 * n * (n + 8) * item if cfg.rule == "rtrl" else 0
    return {
        "test set": (cfg.test_size * steps * 48, "--length or --test-size"),
        "training batch": (cfg.batch_size * steps * 48, "--length or --batch-size"),
        "activations": (16 * cfg.batch_size * chunk * n * item, "--length, --segment or --hidden"),
        "evaluation": (min(cfg.test_size, 500) * steps * 4 * n * item, "--length or --hidden"),
        "sensitivities": (sens, "--hidden or --batch-size"),
    }


def prepare(cfg: CopyConfig) -> LockedDir:
    """Every check on bad input, before anything in cfg.out is written; the locked --out."""
    cfg.validate()
    check_new_out(cfg)
    check_memory(memory_parts(cfg), "this copy run", cfg.device)
    checkpoint = os.path.join(cfg.out, CHECKPOINT_NAME)
    kind = special_kind(checkpoint)
    if cfg.resume and kind:
        raise ConfigError(
            f"--resume: {checkpoint} is {kind}, not a checkpoint file; put the run's "
            "checkpoint back there to continue it (nothing was changed)"
        )
    if cfg.resume and os.path.exists(checkpoint):
        resume.check_resumable(resume.checkpoint_config(checkpoint), cfg, checkpoint)
    elif cfg.resume and os.path.lexists(os.path.join(cfg.out, "results.json")):
        raise ConfigError(
            f"--resume: {cfg.out} holds results.json but no {CHECKPOINT_NAME}: the run "
            "finished and its checkpoint is gone; nothing was changed (choose another --out "
            "for a new run)"
        )
    elif cfg.resume:
        print(f"{PROG}: no {CHECKPOINT_NAME} in {cfg.out}: starting from the beginning")
    os.makedirs(cfg.out, exist_ok=True)
    return LockedDir(cfg.out).acquire()  # a second process on --out: refused


def _continue_command(argv: list[str]) -> str:
    return shlex.join(["r2ac", "copy", *argv, *([] if "--resume" in argv else ["--resume"])])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = tyro.cli(CopyConfig, args=argv, prog=PROG, description=__doc__)
    try:
        run_dir = prepare(cfg)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    keep_freed_memory()
    try:
        results = run(cfg)
    except ConfigError as exc:  # e.g. a checkpoint from before configs were stored in it
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk (or file size limit) after the up-front probe
        line = write_failure_line(exc, then=f"`{_continue_command(argv)}`")
        if line is None:
            raise
        print(f"{PROG}: error: {line} (the last checkpoint, if any, is intact)", file=sys.stderr)
        return 1
    except training.CopyDiverged as exc:  # nothing of the diverged batch was saved
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print(
            f"{PROG}: error: out of memory (the process's limits: ulimit -v, cgroup)",
            file=sys.stderr,
        )
        return 1
    except TrainingInterrupted as stop:
        saved = "checkpoint written; " if stop.saved else ""
        print(
            f"{PROG}: stopped by {signal.Signals(stop.signum).name} after batch {stop.update} "
            f"of {cfg.train_steps}; {saved}continue with `{_continue_command(argv)}`",
            file=sys.stderr,
        )
        return stop.exit_code
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or a signal before training started
        print(
            f"{PROG}: stopped by {signal_name(exc)}; the last checkpoint (if any) is in "
            f"{cfg.out}; `{_continue_command(argv)}` continues from it",
            file=sys.stderr,
        )
        return exit_code(exc)
    finally:
        run_dir.release()
    print(
        f"bit_accuracy {results['bit_accuracy']:.4f}  sequence_accuracy "
        f"{results['sequence_accuracy']:.4f}  ({results['train_steps']} batches, "
        f"{results['updates']} updates, {results['train_seconds']:.0f} s training)  -> {cfg.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
