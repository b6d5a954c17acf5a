"""`r2ac copy`: train an eLSTM on the copy task and score every output bit on a held-out set.

Writes DIR/config.json (options, git revision, machine), DIR/curve.csv (the learning curve),
DIR/curve.png (its plot) and DIR/results.json (final test metrics: bit_accuracy counts every
output bit, 0s and 1s alike; sequence_accuracy the sequences with every bit right).
`--train-steps 0` evaluates the untrained model. Bad options: a message and exit code 2,
nothing written.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict

import torch
import tyro

from r2ac.errors import ConfigError, check_writable
from r2ac.perf import keep_freed_memory
from r2ac.rl import checkpoint as rl_checkpoint
from r2ac.tasks import copy as ct


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def machine() -> dict[str, str | int]:
    return {
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def _write_json(path: str, obj) -> None:
    """Atomically (temp file + rename): a kill never leaves half a config or result."""
    rl_checkpoint.write_atomic((json.dumps(obj, indent=1) + "\n").encode(), path)


def run(cfg: ct.CopyConfig) -> dict:
    """Train and evaluate per `cfg`, write the four files into cfg.out; return the results."""
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    meta = {
        "config": asdict(cfg),
        "schedule": cfg.schedule,
        "git_revision": git_revision(),
        "machine": machine(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    config_path = os.path.join(cfg.out, "config.json")
    if cfg.resume and os.path.exists(config_path):  # keep the record of the earlier invocations
        with open(config_path) as fh:
            before = json.load(fh)
        meta["earlier_invocations"] = [*before.pop("earlier_invocations", []), before]
    _write_json(config_path, meta)
    bar = tqdm(
        total=cfg.train_steps,
        desc=f"copy l={cfg.length} {cfg.core}-{cfg.rule} {cfg.schedule}",
        unit="batch",
        dynamic_ncols=True,
        mininterval=2.0,
    )
    last = {}

    def on_batch(step, stats):
        bar.update(step - bar.n)  # step counts from the checkpoint when resuming
        bar.set_postfix(
            loss=f"{stats.loss:.3f}",
            train_bits=f"{stats.bit_accuracy:.3f}",
            test_seq=last.get("seq", "-"),
            refresh=False,
        )

    def on_eval(row):
        last["seq"] = f"{row['test_sequence_accuracy']:.3f}"
        bar.write(
            f"step {int(row['step']):>6}  {row['seconds']:8.1f}s  test bits "
            f"{row['test_bit_accuracy']:.4f}  sequences {row['test_sequence_accuracy']:.4f}  "
            f"loss {row['test_loss']:.4f}"
        )

    wall0 = time.perf_counter()
    model, result = ct.train(
        cfg, on_batch, on_eval, checkpoint=os.path.join(cfg.out, "checkpoint.pt")
    )
    bar.close()
    results = dict(result.final)
    test_set = ct.make_test_set(cfg.length, cfg.test_size, cfg.test_seed)
    by_length = ct.sequence_accuracy_by_length(model, test_set, cfg.device)
    results["longest_all_right"] = max(
        (k for k in by_length if all(v == 1.0 for j, v in by_length.items() if j <= k)), default=0
    )
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
        wall_seconds=round(time.perf_counter() - wall0, 2),
        solved_at_step=result.solved_at_step,
        git_revision=meta["git_revision"],
    )
    ct.write_curve_csv(result.curve, os.path.join(cfg.out, "curve.csv"))
    ct.plot_curves(
        [(f"{cfg.core}-{cfg.rule}, {cfg.schedule}", result.curve)],
        os.path.join(cfg.out, "curve.png"),
        title=f"copy task, l = {cfg.length}, N = {cfg.hidden}, B = {cfg.batch_size}, lr = {cfg.lr:g}",
    )
    _write_json(os.path.join(cfg.out, "results.json"), results)
    return results


def check_new_out(cfg: ct.CopyConfig) -> None:
    """ConfigError unless --out can be written and, without --resume, holds nothing: an
    earlier run's checkpoint and results are never overwritten."""
    check_writable(cfg.out, "--out")
    if (
        not cfg.resume
        and os.path.isdir(cfg.out)
        and set(os.listdir(cfg.out)) - {rl_checkpoint.LOCK_NAME}
    ):
        raise ConfigError(
            f"--out {cfg.out} is not empty; add --resume to continue the run there, "
            "or choose another --out"
        )


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(ct.CopyConfig, args=argv, prog="r2ac copy", description=__doc__)
    try:
        cfg.validate()
        check_new_out(cfg)
        checkpoint = os.path.join(cfg.out, "checkpoint.pt")
        if cfg.resume and os.path.exists(checkpoint):
            # before anything in cfg.out is rewritten
            ct.check_resumable(ct.checkpoint_config(checkpoint), cfg, checkpoint)
        os.makedirs(cfg.out, exist_ok=True)
        lock = rl_checkpoint.lock_directory(cfg.out)  # a second process on --out: refused
        rl_checkpoint.remove_stale_temps(cfg.out)
    except ConfigError as exc:
        print(f"r2ac copy: {exc}", file=sys.stderr)
        return 2
    keep_freed_memory()
    try:
        results = run(cfg)
    except ConfigError as exc:  # e.g. a checkpoint from before configs were stored in it
        print(f"r2ac copy: {exc}", file=sys.stderr)
        return 2
    finally:
        os.close(lock)
    print(
        f"bit_accuracy {results['bit_accuracy']:.4f}  sequence_accuracy "
        f"{results['sequence_accuracy']:.4f}  ({results['train_steps']} batches, "
        f"{results['updates']} updates, {results['train_seconds']:.0f} s training)  -> {cfg.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
