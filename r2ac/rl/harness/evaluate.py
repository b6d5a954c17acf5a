"""Evaluation protocol: K seeded sets of E complete episodes; mean of set means and std.

`r2ac eval RUN_DIR [--sets K] [--episodes E] [--greedy | --sampled] [--seed S]` loads the
run's config and final weights (checkpoints/agent.pt; a streaming run: its last checkpoint, for
the normalisers) and writes RUN_DIR/eval.json. Set k
uses env seed `eval_seed(seed, k)` (disjoint from the training actors' seeds). Each of the
min(E, 32) streams plays a fixed quota of consecutive episodes, so short episodes are not
over-represented. A module the run's config names (`gym/MODULE:ID`) is imported only with
`--env gym/MODULE:ID` or `--trust-env-module` (a run directory is data; r2ac/envs/trust.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from r2ac.envs.trust import NO_TRUST, TRUST_FLAG, TrustRequest
from r2ac.errors import (
    ConfigError,
    MissingDependencyError,
    check_writable,
    naming_file,
    write_failure_line,
)
from r2ac.rl.config import MAX_EVAL_EPISODES, MAX_EVAL_SETS, TrainConfig, validate
from r2ac.rl.harness.run_dir import RunDir, agent_weights
from r2ac.rl.model.agent import Agent
from r2ac.rl.model.build import agent_for_env, eval_seed, make_env
from r2ac.rl.model.distributions import action_dtype, zero_where
from r2ac.rl.runtimes.base import load_agent_weights
from r2ac.runs.locked_dir import write_json

MAX_STREAMS = 32


@torch.no_grad()
def play_episodes(agent: Agent, env, episodes: int, greedy: bool, seed: int) -> tuple[list, int]:
    """Returns of exactly `episodes` complete episodes (stream quotas), and the steps taken."""
    n = env.num_envs
    quota = np.array([episodes // n + (b < episodes % n) for b in range(n)])
    returns: list[list[float]] = [[] for _ in range(n)]
    gen = torch.Generator().manual_seed(seed)
    obs = torch.from_numpy(env.reset(seed=seed))
    dtype = next(agent.parameters()).dtype
    last_reward, reset = torch.zeros(n, dtype=dtype), torch.ones(n, dtype=torch.bool)
    space = agent.action_space
    last_action = torch.zeros((n, *space.action_shape), dtype=action_dtype(space, dtype))
    full = agent.initial_state(n)
    state = agent.core.light_state(full)
    steps = 0
    while any(len(r) < q for r, q in zip(returns, quota)):
        logits, _, state = agent(
            obs[None], last_reward[None], reset[None], state, last_action=last_action[None]
        )
        dist = agent.distribution(logits[0])  # over (n, P)
        action = dist.mode() if greedy else dist.sample(gen)  # (n, *S); a Gaussian's mode: the mean
        res = env.step(action.numpy())
        steps += n
        done = torch.from_numpy(np.asarray(res.terminated | res.truncated, dtype=bool))
        for b in np.flatnonzero(~np.isnan(res.info["episode_return"])):
            if len(returns[b]) < quota[b]:
                returns[b].append(float(res.info["episode_return"][b]))
        obs = torch.from_numpy(np.asarray(res.obs))
        last_reward = torch.from_numpy(np.asarray(res.reward)).to(dtype).masked_fill(done, 0.0)
        last_action = zero_where(action, done)
        reset = done
    return [x for r in returns for x in r], steps


def evaluate(
    agent: Agent, cfg: TrainConfig, sets: int, episodes: int, greedy: bool, seed: int | None = None
) -> dict:
    seed = cfg.run.seed if seed is None else seed
    start, set_returns, steps = time.perf_counter(), [], 0
    was_training = agent.training
    agent.eval()
    for k in range(sets):
        s = eval_seed(seed, k)
        env = make_env(cfg, min(episodes, MAX_STREAMS), s)
        returns, n = play_episodes(agent, env, episodes, greedy, s)
        env.close()
        set_returns.append(returns)
        steps += n
    agent.train(was_training)
    means = [float(np.mean(r)) for r in set_returns]
    return {
        "env": cfg.env.id,
        "core": cfg.model.core,
        "sets": sets,
        "episodes_per_set": episodes,
        "actions": "greedy" if greedy else "sampled",
        "seed": seed,
        "mean": float(np.mean(means)),
        "std": float(np.std(means)),
        "set_means": means,
        "returns": set_returns,
        "frames": steps,
        "seconds": time.perf_counter() - start,
    }


def write_eval(run: RunDir, result: dict, out: str | Path | None = None) -> Path:
    """Write the result to `out` (default RUN/eval.json, which experiment grids read)."""
    path = Path(out) if out else run.eval_path
    # atomic: the experiment runner reads "eval.json exists" as "the run is finished"
    return write_json(path, result)


def evaluate_run(
    path: str,
    sets: int | None,
    episodes: int | None,
    greedy: bool | None,
    seed: int | None,
    out: str | None = None,
    env_trust: TrustRequest = NO_TRUST,
) -> tuple[dict, Path]:
    run = RunDir.open(path)
    cfg = validate(run.config())
    env_trust.apply(cfg.env.id, "r2ac eval")  # before anything imports the env
    check_writable(out or run.eval_path, "--out", is_file=True)
    protocol = (
        sets or cfg.run.eval_sets,
        episodes or cfg.run.eval_episodes,
        cfg.study.eval_greedy if greedy is None else greedy,
        seed,
    )
    if cfg.runtime.name == "stream":
        result = evaluate_stream_run(run, cfg, *protocol)
    else:
        result = evaluate(_saved_agent(run, cfg), cfg, *protocol)
    return result, write_eval(run, result, out)


def _saved_agent(run: RunDir, cfg: TrainConfig) -> Agent:
    """The batched agent with the run's final weights (checkpoints/agent.pt)."""
    if not os.path.lexists(run.agent_path):  # a FIFO or a link is named by the loader
        raise ConfigError(f"{run.path}: no weights at {run.agent_path}")
    weights = agent_weights(run.agent_path)  # the file is checked before the env is built
    env = make_env(cfg, 1, 0)
    agent = agent_for_env(cfg, env, load_stem=False)
    env.close()
    load_agent_weights(agent, weights, run.agent_path)
    return agent


def evaluate_stream_run(
    run: RunDir, cfg: TrainConfig, sets: int, episodes: int, greedy: bool, seed: int | None
) -> dict:
    """A streaming run's K agents as its last checkpoint left them (weights and normalisers,
    which agent.pt alone does not restore to the lockstep agent), frozen; agent k plays
    with seed `seed + k` (default: the run's seed)."""
    from r2ac.rl.runtimes.stream import StreamRuntime

    if not os.path.lexists(run.checkpoint_path):
        raise ConfigError(f"{run.path}: no checkpoint at {run.checkpoint_path}")
    if seed is not None:
        cfg = cfg.updated(seed=seed)
    payload = run.load_checkpoint()  # the file is checked before the envs are built
    runtime = StreamRuntime(cfg)
    try:
        restore_or_name(runtime, payload, run)
        return runtime.evaluate(sets, episodes, greedy)
    finally:
        runtime.close()


def restore_or_name(runtime, payload: dict, run: RunDir) -> None:
    """runtime.restore(payload); a value that does not fit (a damaged RNG or env state) is
    one ConfigError naming the file, as `r2ac train --resume` says it."""
    path = run.checkpoint_path
    try:
        runtime.restore(payload)
    except ConfigError as exc:
        raise naming_file(exc, path, run.config_path) from exc
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"{path}: malformed training checkpoint ({type(exc).__name__}: {detail})"
        ) from exc


def check_args(args: argparse.Namespace) -> None:
    """ConfigError for counts out of 1..their bound, or a seed out of 0..2**63-1."""
    bounds = {"sets": MAX_EVAL_SETS, "episodes": MAX_EVAL_EPISODES}
    for name, bound in bounds.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= bound:
            raise ConfigError(f"--{name} must be in 1..{bound:,}, got {value:,}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be in 0..2**63-1, got {args.seed}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="r2ac eval", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sets", type=int, help="K (default: the run's eval_sets)")
    parser.add_argument("--episodes", type=int, help="E (default: the run's eval_episodes)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="greedy", action="store_true", default=None)
    mode.add_argument("--sampled", dest="greedy", action="store_false")
    parser.add_argument("--seed", type=int, help="evaluation seed (default: the run's seed)")
    parser.add_argument(
        "--env",
        dest="env_named",
        metavar="ENV",
        help="the run's env, confirming that its module (gym/MODULE:ID) may be imported",
    )
    parser.add_argument(
        TRUST_FLAG,
        dest="trust_env_module",
        action="store_true",
        help="import the module the run's config names (gym/MODULE:ID) without naming it",
    )
    parser.add_argument(
        "--out",
        help="result file (default RUN_DIR/eval.json; give another to "
        "keep the run's own evaluation, e.g. a --sampled check of a greedy run)",
    )
    args = parser.parse_args(argv)
    try:
        check_args(args)
        env_trust = TrustRequest(args.env_named, args.trust_env_module)
        result, path = evaluate_run(
            args.run_dir, args.sets, args.episodes, args.greedy, args.seed, args.out, env_trust
        )
    except (ConfigError, MissingDependencyError) as exc:
        print(f"r2ac eval: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk (or file size limit) after the up-front probe
        line = write_failure_line(exc)
        if line is None:
            raise
        print(f"r2ac eval: error: {line} (the run directory is unchanged)", file=sys.stderr)
        return 1
    print(
        f"{result['env']} {result['core']}: {result['mean']:.3f} +- {result['std']:.3f} "
        f"({result['sets']} x {result['episodes_per_set']} {result['actions']} episodes, "
        f"{result['seconds']:.1f} s) -> {path}"
    )
    return 0
