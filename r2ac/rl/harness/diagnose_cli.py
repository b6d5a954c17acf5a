"""Diagnose a trained R2AC run from its last checkpoint: the gradient's history term and the
critic against Monte-Carlo returns (r2ac/rl/harness/diagnostics.py; docs/rl.md "Diagnosing a run").

    r2ac diagnose RUN_DIR [--batches 52] [--grad-batches 20]

Rebuilds the serial runtime from the run's config, loads the checkpoint (weights, optimiser,
the actors' carried states where the env can restore them), collects `--batches` consecutive
batches with the weights fixed and prints

- the critic: mean value against the mean discounted return over the steps whose episode
  ends in the window, overall and by steps to the episode's end, and PopArt's mu, sigma;
- the gradient: medians over `--grad-batches` batches of the norms of the full, in-segment
  and history parts, per parameter group and per loss term (policy, critic, entropy).

The weights are never changed and nothing is written to the run directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from r2ac.envs.trust import NO_TRUST, TRUST_FLAG, TrustRequest
from r2ac.errors import ConfigError, MissingDependencyError, naming_file
from r2ac.rl.config import validate
from r2ac.rl.harness.diagnostics import (
    LOSS_TERMS,
    gradient_split,
    monte_carlo_returns,
    steps_to_end,
)
from r2ac.rl.model.agent import clip_rewards
from r2ac.rl.run.run_dir import RunDir, check_same_config
from r2ac.rl.runtimes.serial import SerialRuntime

MAX_BATCHES = 100_000
END_BINS = ((0, 0), (1, 1), (2, 4), (5, 15), (16, 50), (51, 10**9))


def load_runtime(run_dir: Path, env_trust: TrustRequest = NO_TRUST) -> SerialRuntime:
    """The serial runtime of the run's config.json with its checkpoint's state: the same
    checks as `r2ac train --resume` (structure, then every value), ConfigError otherwise."""
    run = RunDir.open(run_dir)
    cfg = validate(run.config())
    env_trust.apply(cfg.env.id, "r2ac diagnose")  # before anything imports the env
    payload = run.load_checkpoint()
    check_same_config(run, cfg, payload)
    runtime = SerialRuntime(cfg)
    try:
        runtime.restore(payload, source=run.checkpoint_path)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
        runtime.close()
        if isinstance(exc, ConfigError):
            raise naming_file(exc, run.checkpoint_path, run.config_path) from exc
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"{run.checkpoint_path}: malformed training checkpoint ({type(exc).__name__}: {detail})"
        ) from exc
    return runtime


@torch.no_grad()
def critic_report(runtime: SerialRuntime, batches: int) -> list[str]:
    cfg, agent = runtime.cfg, runtime.agent
    values, rewards, terminated = [], [], []
    for _ in range(batches):
        seg = runtime.next_batch().segment
        _, v, _ = agent(
            seg.obs,
            seg.last_reward,
            seg.reset,
            seg.state,
            carry=False,
            last_action=seg.last_action,
        )
        values.append(v[:-1])
        rewards.append(clip_rewards(seg.rewards, cfg.loss.reward_clip) * cfg.loss.reward_scale)
        terminated.append(seg.terminated)
    v, r, d = torch.cat(values), torch.cat(rewards), torch.cat(terminated)  # (T, B)
    returns, complete = monte_carlo_returns(r, d, cfg.loss.discount)
    to_end = steps_to_end(d)
    heads = agent.heads
    popart = (
        f"PopArt mu {float(heads.value_mean):.2f} sigma {float(heads.value_scale()):.2f}"
        if heads.value_norm
        else "no PopArt"
    )
    lines = [
        f"critic over {int(complete.sum())} steps with complete returns "
        f"(of {v.numel()}; rewards x{cfg.loss.reward_scale:g}, discount {cfg.loss.discount}):",
        f"  mean value {float(v[complete].mean()):.2f}   mean return "
        f"{float(returns[complete].mean()):.2f}   {popart}",
        "  steps to the episode's end: mean value / mean return (steps)",
    ]
    for lo, hi in END_BINS:
        sel = (to_end >= lo) & (to_end <= hi)
        if sel.any():
            lines.append(
                f"    {lo:>3}-{min(hi, 999):<3}  {float(v[sel].mean()):8.2f} / "
                f"{float(returns[sel].mean()):8.2f}  ({int(sel.sum())})"
            )
    return lines


def gradient_report(runtime: SerialRuntime, batches: int) -> list[str]:
    norms: dict[tuple[str, str], list[torch.Tensor]] = {}
    for _ in range(batches):
        seg = runtime.next_batch().segment
        for term, groups in gradient_split(runtime.learner, seg).items():
            for group, n in groups.items():
                norms.setdefault((term, group), []).append(n)

    def median(term: str, group: str) -> list[float]:
        rows = torch.stack(norms[(term, group)])  # (batches, 3)
        return [statistics.median(rows[:, k].tolist()) for k in range(3)]

    groups = [g for (t, g) in norms if t == "all"]
    lines = [f"gradient norms, medians over {batches} batches: full / in-segment / history"]
    for group in groups:
        full, inseg, hist = median("all", group)
        lines.append(f"  {group:12s} {full:10.3f} {inseg:10.3f} {hist:10.3f}")
    lines.append("by loss term (every parameter):")
    for term in LOSS_TERMS:
        full, inseg, hist = median(term, "total")
        lines.append(f"  {term:12s} {full:10.3f} {inseg:10.3f} {hist:10.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="r2ac diagnose", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--batches", type=int, default=52, help="batches for the critic")
    parser.add_argument("--grad-batches", type=int, default=20, help="batches for the split")
    parser.add_argument("--env", dest="env_named", metavar="ENV", help="the run's env (trusts it)")
    parser.add_argument(TRUST_FLAG, dest="trust_env_module", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        for name in ("batches", "grad_batches"):
            value = getattr(args, name)
            if not 1 <= value <= MAX_BATCHES:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be in 1..{MAX_BATCHES:,}, got {value:,}")
        env_trust = TrustRequest(args.env_named, args.trust_env_module)
        runtime = load_runtime(args.run_dir, env_trust)
    except (ConfigError, MissingDependencyError) as exc:
        print(f"r2ac diagnose: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("r2ac diagnose: error: out of memory loading the checkpoint", file=sys.stderr)
        return 2
    try:
        cfg = runtime.cfg
        print(
            f"{args.run_dir}: {cfg.env.id}, {cfg.model.core}, N={cfg.model.hidden_size}, M={cfg.runtime.unroll_length}"
        )
        print("\n".join(critic_report(runtime, args.batches)))
        print("\n".join(gradient_report(runtime, args.grad_batches)))
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
