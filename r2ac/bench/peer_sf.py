"""The peer's side of `r2ac bench peer`: Sample Factory 2.1.1 trained on one POPGym env and
seed, then played greedily under r2ac's evaluation protocol. Run by the peer venv's Python
(never imported by r2ac, and importing nothing of it):

    <peer-venv>/bin/python -P r2ac/bench/peer_sf.py --env popgym-RepeatPreviousEasy-v0 \
        --seed 0 --frames 1000000 --train-dir D --result D/result.json [--mode serial]

SF's APPO with r2ac's `--preset popgym` PPO settings: rollout = recurrence = 4, batch 256 x 4
minibatches an epoch, 2 epochs, Adam lr 1e-3, entropy 0.01, GAE (lambda 0.95), gamma 0.99, no
V-trace, otherwise SF's defaults (input and return normalisation, PPO clip 0.1, grad-norm 4).
The network is about the size of r2ac's popgym agent: MLP encoder 64-64 (ReLU), GRU 128,
decoder MLP 128, policy and value heads. `--mode async` (SF's normal mode): 2 workers x 16
envs sampling while the learner trains; `--mode serial`: one process, 1 worker x 32 envs,
sampler and learner taking turns. The observation reaches SF as r2ac's agent gets it:
flattened (one-hot) by `gymnasium.spaces.flatten`, with the previous action's one-hot code and
the last reward (clipped to [-1, 1]), both zero at an episode's first step.

Greedy evaluation: the last checkpoint in SF's actor-critic, argmax actions, 3 sets of 100
episodes; set k's seed is SeedSequence([seed, 1000003, k]), 32 streams seeded from it, each
playing a fixed quota (r2ac.rl.run.evaluation's protocol). The checkpoint is read with
`torch.load(..., weights_only=False)`: SF's own loader uses torch's default weights_only=True
(torch >= 2.6), which refuses the numpy scalars SF stores and returns None.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

EVAL_SEED_OFFSET = 1_000_003  # r2ac.rl.model.build._EVAL_SEED_OFFSET
EVAL_STREAMS = 32  # r2ac.rl.run.evaluation.MAX_STREAMS
MODES = {
    "async": ["--serial_mode=False", "--async_rl=True", "--num_workers=2",
              "--num_envs_per_worker=16", "--worker_num_splits=2"],
    "serial": ["--serial_mode=True", "--async_rl=False", "--num_workers=1",
               "--num_envs_per_worker=32", "--worker_num_splits=1"],
}  # fmt: skip

_WRAPPER = None


def _wrapper_class():
    """The Gymnasium wrapper, defined on first use (gymnasium is only in the peer venv)."""
    global _WRAPPER
    if _WRAPPER is None:
        import gymnasium as gym
        import numpy as np

        class PrevActionReward(gym.Wrapper):  # noqa: D101
            """Observation -> [flattened (one-hot) obs, one-hot previous action, last reward];
            the last two are zero at an episode's first step (as r2ac's agent feeds them)."""

            def __init__(self, env):
                super().__init__(env)
                self.inner = env.observation_space
                self.n = int(env.action_space.n)
                flat = gym.spaces.flatten_space(self.inner)
                low = np.concatenate([flat.low, np.zeros(self.n), [-1.0]]).astype(np.float32)
                high = np.concatenate([flat.high, np.ones(self.n), [1.0]]).astype(np.float32)
                self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

            def _obs(self, obs, action, reward):
                code = np.zeros(self.n, np.float32)
                if action is not None:
                    code[action] = 1.0
                flat = gym.spaces.flatten(self.inner, obs).astype(np.float32)
                return np.concatenate([flat, code, [np.clip(reward, -1.0, 1.0)]]).astype(np.float32)

            def reset(self, **kwargs):
                obs, info = self.env.reset(**kwargs)
                return self._obs(obs, None, 0.0), info

            def step(self, action):
                action = int(np.asarray(action).reshape(-1)[0])
                obs, reward, terminated, truncated, info = self.env.step(action)
                return self._obs(obs, action, float(reward)), reward, terminated, truncated, info

        _WRAPPER = PrevActionReward
    return _WRAPPER


def sf_make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    """SF's env factory (module level: SF pickles it into a spawned process)."""
    import gymnasium as gym
    import popgym  # noqa: F401  (registers the popgym-* ids)

    return _wrapper_class()(gym.make(full_env_name))


def sf_main(argv: list[str]) -> int:
    """Train SF on one env and seed, then evaluate it greedily; runs in the peer venv."""
    p = argparse.ArgumentParser(prog="peer_sf.py")
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--train-dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--mode", choices=tuple(MODES), default="async")
    p.add_argument("--sf-args", default="")
    p.add_argument("--eval-sets", type=int, default=3)
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--eval-only", action="store_true", help="evaluate the run in --train-dir")
    a = p.parse_args(argv)

    import numpy as np
    import torch
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl

    make_env = sf_make_env
    register_env(a.env, make_env)
    experiment = f"sf-{a.env}-s{a.seed}"
    sf_argv = [
        f"--env={a.env}",
        f"--experiment={experiment}",
        f"--train_dir={a.train_dir}",
        f"--seed={a.seed}",
        "--device=cpu",
        "--algo=APPO",
        *MODES[a.mode],
        "--batched_sampling=False",
        "--rollout=4",
        "--recurrence=4",
        "--batch_size=256",
        "--num_batches_per_epoch=4",
        "--num_epochs=2",
        "--learning_rate=0.001",
        "--optimizer=adam",
        "--exploration_loss_coeff=0.01",
        "--gamma=0.99",
        "--gae_lambda=0.95",
        "--with_vtrace=False",
        "--use_rnn=True",
        "--rnn_type=gru",
        "--rnn_size=128",
        "--rnn_num_layers=1",
        "--encoder_mlp_layers",
        "64",
        "64",
        "--decoder_mlp_layers",
        "128",
        "--nonlinearity=relu",
        f"--train_for_env_steps={a.frames}",
        "--save_every_sec=100000",
        "--save_best_every_sec=100000",
        "--with_wandb=False",
        "--restart_behavior=resume" if a.eval_only else "--restart_behavior=overwrite",
        "--set_workers_cpu_affinity=False",
        *shlex.split(a.sf_args),
    ]
    torch.set_num_threads(a.threads)  # SF leaves torch's thread count as it finds it
    parser, _ = parse_sf_args(argv=sf_argv, evaluation=False)
    cfg = parse_full_cfg(parser, sf_argv)
    start = time.perf_counter()
    status = 0 if a.eval_only else run_rl(cfg)
    train_wall = None if a.eval_only else round(time.perf_counter() - start, 1)
    if status != 0:
        print(f"SF training failed with status {status}", file=sys.stderr)
        return 1

    res: dict = {
        "mode": a.mode,
        "sf_status": int(status),
        "train_wall_s": train_wall,
        "sf_argv": sf_argv,
        "torch": torch.__version__,
    }
    res["sf_log"] = str(a.train_dir / experiment / "sf_log.txt")

    # ---- greedy evaluation under r2ac's protocol
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.utils.action_distributions import argmax_actions
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size
    from sample_factory.utils.attr_dict import AttrDict

    probe = make_env_func_batched(
        cfg, env_config=AttrDict(worker_index=0, vector_index=0, env_id=0)
    )
    model = create_actor_critic(cfg, probe.observation_space, probe.action_space)
    probe.close()
    checkpoints = Learner.get_checkpoints(Learner.checkpoint_dir(cfg, 0), "checkpoint_*")
    if not checkpoints:
        print(f"no SF checkpoint under {Learner.checkpoint_dir(cfg, 0)}", file=sys.stderr)
        return 1
    # SF's own loader (Learner.load_checkpoint) calls torch.load with torch's default
    # weights_only=True since torch 2.6, which refuses the numpy scalars SF stores in the
    # checkpoint and returns None: load the file that this run just wrote directly.
    state = torch.load(checkpoints[-1], map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    model.eval()
    res["checkpoint"] = checkpoints[-1] if checkpoints else None
    res["params"] = sum(p.numel() for p in model.parameters())
    rnn_size = get_rnn_size(cfg)

    set_means, t0, steps = [], time.perf_counter(), 0
    for k in range(a.eval_sets):
        s = int(np.random.SeedSequence([a.seed, EVAL_SEED_OFFSET, k]).generate_state(1)[0] % 2**31)
        n = min(a.eval_episodes, EVAL_STREAMS)
        envs = [make_env(a.env) for _ in range(n)]
        stream = [int(c.generate_state(1)[0]) for c in np.random.SeedSequence(s).spawn(n)]
        obs = np.stack([e.reset(seed=stream[b])[0] for b, e in enumerate(envs)])
        quota = [a.eval_episodes // n + (b < a.eval_episodes % n) for b in range(n)]
        returns: list[list[float]] = [[] for _ in range(n)]
        running = np.zeros(n)
        rnn = torch.zeros(n, rnn_size)
        with torch.no_grad():
            while any(len(r) < q for r, q in zip(returns, quota)):
                normalized = prepare_and_normalize_obs(model, {"obs": torch.from_numpy(obs)})
                out = model(normalized, rnn)
                actions = argmax_actions(model.action_distribution()).reshape(n).numpy()
                rnn = out["new_rnn_states"]
                for b, e in enumerate(envs):
                    o, r, term, trunc, _ = e.step(int(actions[b]))
                    running[b] += r
                    if term or trunc:
                        if len(returns[b]) < quota[b]:
                            returns[b].append(float(running[b]))
                        running[b] = 0.0
                        rnn[b] = 0.0
                        o, _ = e.reset()
                    obs[b] = o
                steps += n
        for e in envs:
            e.close()
        set_means.append(float(np.mean([x for r in returns for x in r])))
    res["eval"] = {
        "mean": float(np.mean(set_means)),
        "std": float(np.std(set_means)),
        "set_means": set_means,
        "sets": a.eval_sets,
        "episodes_per_set": a.eval_episodes,
        "actions": "greedy",
        "seed": a.seed,
        "frames": steps,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    a.result.write_text(json.dumps(res, indent=2))
    print(
        f"eval: {res['eval']['mean']:.3f} +- {res['eval']['std']:.3f} over "
        f"{a.eval_sets} x {a.eval_episodes} greedy episodes"
    )
    return 0


if __name__ == "__main__":  # SF's spawned workers import this file again: run only here
    sys.exit(sf_main(sys.argv[1:]))
