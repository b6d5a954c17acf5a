"""`r2ac train [impala | ppo | stream-ac | stream-q] [--preset NAME] [options]`,
`r2ac train --resume RUN_DIR` (from its checkpoint) and `r2ac train --restart RUN_DIR` (from its
config.json, a run stopped before its first checkpoint).

One subcommand per algorithm, each listing the options it reads (r2ac/rl/harness/
train_options.py; with none: impala, or the preset's algorithm); a preset supplies the
defaults, flags override them. Bad input (unknown env, core or rule, sizes < 1, a preset
needing a missing package, an existing run directory, a checkpoint that does not fit, a
corrupted or code-carrying checkpoint, a run too large for the memory available, a run
directory in use by another process) prints one line and exits with code 2 before anything
is written. SIGINT / SIGTERM stop after the current update with a checkpoint (exit 130 /
143).
"""

from __future__ import annotations

import errno
import logging
import signal
import sys
from pathlib import Path

from r2ac.envs import trust
from r2ac.errors import ConfigError, MissingDependencyError, naming_file, write_failure
from r2ac.perf import keep_freed_memory
from r2ac.rl.config import TrainConfig, validate
from r2ac.rl.harness.resources import check_resources
from r2ac.rl.harness.train_options import SUBCOMMANDS, parse_options
from r2ac.rl.harness.trainers import make_trainer
from r2ac.rl.presets import PRESETS, family_values, preset, preset_help
from r2ac.rl.run.loop import TrainingDiverged
from r2ac.rl.run.run_dir import RunDir, check_same_config, default_out_dir, plot_curve
from r2ac.rl.runtimes.base import ActorError
from r2ac.runs.checkpoint import CheckpointError
from r2ac.runs.stop import TrainingInterrupted, exit_code, raise_on_signal, signal_name

log = logging.getLogger(__name__)


def _pop_option(argv: list[str], name: str) -> str | None:
    """Remove `--name VALUE` or `--name=VALUE` from argv; return VALUE."""
    for i, arg in enumerate(argv):
        if arg == name:
            if i + 1 >= len(argv):
                raise ConfigError(f"{name} needs a value")
            value = argv[i + 1]
            del argv[i : i + 2]
            return value
        if arg.startswith(name + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


# The defaults of each subcommand without --preset (the README's main job: impala's)
DEFAULT_PRESETS = {"impala": "delayed-cue", "ppo": "delayed-cue", "stream-ac": "stream",
                   "stream-q": "stream-q"}  # fmt: skip


def _default_preset(algorithm: str, argv: list[str]) -> str:
    """The subcommand's default preset; stream-q's with --stream-optimizer intentional is
    stream-intentional-q (QRC's SGD step of 1e-4 would scale the intentional step down)."""
    if algorithm == "stream-q":
        for i, arg in enumerate(argv):
            value = argv[i + 1] if arg == "--stream-optimizer" and i + 1 < len(argv) else None
            if arg.startswith("--stream-optimizer="):
                value = arg.split("=", 1)[1]
            if value == "intentional":
                return "stream-intentional-q"
    return DEFAULT_PRESETS[algorithm]


def _family(algorithm: str) -> str:
    return "streaming" if algorithm.startswith("stream") else "batched"


def _subcommand(argv: list[str], name: str | None) -> tuple[str, TrainConfig]:
    """The subcommand (argv[0] if it names one, removed; else the preset's algorithm) and the
    defaults: the preset's values for that algorithm."""
    given = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else None
    flag = _pop_option(argv, "--algorithm")  # the subcommand as a flag (older command lines)
    if flag is not None:
        if flag not in SUBCOMMANDS or given not in (None, flag):
            raise ConfigError(
                f"--algorithm {flag}: give one of {', '.join(SUBCOMMANDS)}, as the subcommand "
                f"(`r2ac train {flag if flag in SUBCOMMANDS else 'ALGORITHM'} ...`)"
            )
        given = flag
    default = preset(name) if name else PRESETS[_default_preset(given or "impala", argv)]
    algorithm = given or default.loss.algorithm
    if _family(algorithm) != _family(default.loss.algorithm):
        raise ConfigError(
            f"--preset {name}: a {_family(default.loss.algorithm)} preset "
            f"({default.loss.algorithm}), not one for `r2ac train {algorithm}`"
        )
    return algorithm, default.updated(algorithm=algorithm)


def parse_config(argv: list[str]) -> TrainConfig:
    """The config of a new run: `r2ac train [ALGORITHM] [--preset NAME] [options]`, the
    preset's values, then the flags."""
    argv = list(argv)
    name = _pop_option(argv, "--preset")  # the defaults depend on it: read it first
    algorithm, default = _subcommand(argv, name)
    description = (
        f"{SUBCOMMANDS[algorithm]}. Subcommands: {', '.join(SUBCOMMANDS)} (`r2ac train "
        "ALGORITHM --help`; none: impala, or the preset's algorithm). `--preset NAME` gives "
        "the defaults, flags override them; `r2ac train --resume DIR` continues a run from its "
        "last checkpoint, `--restart DIR` starts it again from its config.json.\n\n"
        + preset_help(streaming=default.streaming)
    )
    values = parse_options(argv, algorithm, default, description)
    cfg = default.updated(**values)
    return _family_values(_own_env_options(cfg, default, argv), name, argv)


def _family_values(cfg: TrainConfig, name: str | None, argv: list[str]) -> TrainConfig:
    """The preset's values for the chosen core's family (`presets.FAMILY_VALUES`), where no
    flag of the command line set them."""
    values = family_values(name, cfg.model.core)

    def spellings(field: str) -> tuple[str, ...]:  # a bool is also set by --no-FIELD
        flag = field.replace("_", "-")
        return ("--" + flag, "--no-" + flag) if isinstance(values[field], bool) else ("--" + flag,)

    given = {
        k
        for k in values
        for f in spellings(k)
        if any(a == f or a.startswith(f + "=") for a in argv)
    }
    keep = {k: v for k, v in values.items() if k not in given}
    return cfg.updated(**keep) if keep else cfg


def _own_env_options(cfg: TrainConfig, default: TrainConfig, argv: list[str]) -> TrainConfig:
    """A preset's env options belong to the preset's env: with another `--env` and no
    `--env-options` the new env gets none (the delayed cue's delay=64 must not reach
    POPGym)."""
    given = any(a == "--env-options" or a.startswith("--env-options=") for a in argv)
    if cfg.env.id != default.env.id and not given:
        return cfg.updated(env_options=())
    return cfg


def _prepare(argv: list[str]):
    """Everything that can fail on bad input, before anything is written."""
    argv = list(argv)
    resume, restart = _pop_option(argv, "--resume"), _pop_option(argv, "--restart")
    if resume is not None or restart is not None:
        return _prepare_existing(resume, restart, argv)
    cfg = validate(parse_config(argv))
    trust.allow_env(cfg.env.id)  # named on the command line: its module may be imported
    cfg = cfg.updated(out_dir=cfg.run.out_dir or default_out_dir(cfg))
    RunDir.check_new(cfg.run.out_dir)
    check_resources(cfg)
    return cfg, None, None, cfg.run.out_dir


def _start_new(cfg: TrainConfig, path: str):
    """The new run directory, then the runtime that writes to it; if building the runtime
    fails (e.g. an env that will not start), what was created is removed again."""
    existed = Path(path).exists()
    run = RunDir.create(path, cfg)
    try:
        return run, make_trainer(cfg, run)
    except BaseException:
        run.discard(remove_folder=not existed)
        raise


def _prepare_existing(resume: str | None, restart: str | None, argv: list[str]):
    """--resume DIR (from its checkpoint) or --restart DIR (from its config, a run stopped
    before its first checkpoint); the directory is locked for this process."""
    if resume is not None and restart is not None:
        raise ConfigError("give --resume or --restart, not both")
    flag, path = ("--resume", resume) if resume is not None else ("--restart", restart)
    argv, env_trust = trust.pop_trust_options(argv)  # --env ID / --trust-env-module
    if argv:
        raise ConfigError(f"{flag} takes no other options, got {' '.join(argv)}")
    run = RunDir.open(path).acquire()
    try:
        cfg = validate(run.config())
        env_trust.apply(cfg.env.id, f"r2ac train {flag}")  # before anything imports the env
        check_resources(cfg)
        if resume is not None:
            runtime = _resumed_runtime(cfg, run)
        else:
            runtime = make_trainer(cfg, run)
            replaced = run.restart()
            if replaced is not None:
                log.info("what the earlier start wrote is kept in %s", replaced)
    except BaseException:
        run.release()
        raise
    return cfg, run, runtime, None


def _resumed_runtime(cfg: TrainConfig, run: RunDir):
    """The runtime with the checkpoint's state; a checkpoint whose structure passed the check
    but whose values do not fit (e.g. an RNG state of the wrong form) is refused in one line."""
    payload = run.load_checkpoint()
    changes = run.machine_changes()
    if changes:  # the run goes on, but an uninterrupted run here or there would differ
        log.warning(
            "resuming on another machine (%s): training continues, not bit-identically",
            "; ".join(changes),
        )
    try:
        check_same_config(run, cfg, payload)
        runtime = make_trainer(cfg, run)
        runtime.restore(payload)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
        if isinstance(exc, ConfigError):
            named = naming_file(exc, run.checkpoint_path, run.config_path)  # the file, once
            raise named from exc
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        raise CheckpointError(
            f"{run.checkpoint_path}: malformed training checkpoint ({type(exc).__name__}: {detail})"
        ) from exc
    return runtime


def finish(cfg: TrainConfig, run: RunDir, runtime) -> None:
    plot_curve(
        run,
        title=f"{cfg.env.id} {' '.join(cfg.env.options)}  {cfg.model.core}  "
        f"M={cfg.runtime.unroll_length}  N={cfg.model.hidden_size}",
    )
    if cfg.run.eval_at_end:
        from r2ac.rl.run.evaluation import write_eval

        result = runtime.evaluate(cfg.run.eval_sets, cfg.run.eval_episodes, cfg.run.eval_greedy)
        write_eval(run, result)
        print(
            f"eval: {result['mean']:.3f} +- {result['std']:.3f} over {cfg.run.eval_sets} x "
            f"{cfg.run.eval_episodes} {result['actions']} episodes ({result['seconds']:.1f} s)"
        )


def main(argv: list[str]) -> int:
    keep_freed_memory()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg, run, runtime, new_dir = _prepare(argv)
        if run is None:
            run, runtime = _start_new(cfg, new_dir)
    except (ConfigError, MissingDependencyError) as exc:
        print(f"r2ac train: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. a full or read-only disk found when creating the run
        print(f"r2ac train: error: cannot write the run directory: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("r2ac train: error: out of memory while setting the run up", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # a signal while imports and envs were being set up
        print(f"r2ac train: stopped by {signal_name(exc)} before training started", file=sys.stderr)
        return exit_code(exc)
    try:
        return _train(cfg, run, runtime)
    finally:
        run.release()


def _train(cfg: TrainConfig, run: RunDir, runtime) -> int:
    """Train, report, evaluate; a signal stops it cleanly (see r2ac.runs.stop)."""
    # one write, text and newline together: print() writes them apart, and a signal between
    # the two left the stop line on this line ("run directory: ...r2ac train: stopped by ...")
    try:  # the line inside: a signal is answered as the write returns (stop.py's handlers)
        sys.stderr.write(f"run directory: {run.path}\n")
        tracker = runtime.train()
        with raise_on_signal(tracker.update):  # the checkpoint is complete: stop at once
            print(tracker.summary())
            finish(cfg, run, runtime)
    except TrainingInterrupted as stop:
        print(
            f"r2ac train: stopped by {signal.Signals(stop.signum).name} after update "
            f"{stop.update} of {cfg.updates_total}; checkpoint written; continue with "
            f"`r2ac train --resume {run.path}`",
            file=sys.stderr,
        )
        return stop.exit_code
    except OSError as exc:  # a full disk: the atomic writes left the last checkpoint whole
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG):
            raise
        remedy = write_failure(exc)[1]  # what to do: EFBIG's is not the disk's
        if run.checkpoint_path.is_file():
            where = (
                f"the last checkpoint is intact: {remedy}, then `r2ac train --resume {run.path}`"
            )
        else:
            where = (
                f"no checkpoint was written yet: {remedy}, then `r2ac train --restart {run.path}`"
            )
        what = "the file size limit (ulimit -f)" if exc.errno == errno.EFBIG else "disk space"
        print(
            f"r2ac train: error: cannot write to {run.path} ({what}): {exc}; {where}",
            file=sys.stderr,
        )
        return 1
    except MemoryError:
        print(
            f"r2ac train: error: out of memory (the process's limits: ulimit -v, cgroup); "
            f"{'the last checkpoint is in ' + str(run.path) if run.checkpoint_path.is_file() else 'no checkpoint was written'}",
            file=sys.stderr,
        )
        return 1
    except TrainingDiverged as exc:  # nothing of the diverged update was saved
        where = (
            f"the last checkpoint (before it) is in {run.path}"
            if run.checkpoint_path.is_file()
            else "no checkpoint was written"
        )
        print(f"r2ac train: error: {exc}; {where}", file=sys.stderr)
        return 1
    except ActorError as exc:  # the learner is whole: its last update is checkpointed
        if exc.traceback:
            print(exc.traceback.rstrip(), file=sys.stderr)
        print(
            f"r2ac train: error: {exc}; the last checkpoint is in {run.path} "
            f"(`r2ac train --resume {run.path}` continues from it)",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or a signal outside the loop's guard
        if run.checkpoint_path.is_file():
            where = f"the last checkpoint is in {run.path} (`r2ac train --resume {run.path}`"
            where += " continues from it)"
        else:
            where = f"no checkpoint yet (`r2ac train --restart {run.path}` starts it again)"
        print(f"r2ac train: stopped by {signal_name(exc)}; {where}", file=sys.stderr)
        return exit_code(exc)
    return 0
