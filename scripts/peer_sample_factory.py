#!/usr/bin/env python3
"""r2ac beside its peer, Sample Factory 2.1.1, on a POPGym task: frames/s and greedy eval.

Issue 36, item 3. A documented command, not a test. Sample Factory (SF) is never a dependency
of r2ac: it lives in its own virtual environment outside the project's .venv, which this
script creates (CPU torch first, so that nothing pulls the CUDA build), and no SF code is
copied into the project: the SF side is this file run by the peer venv's python, calling SF's
public entry points (`register_env`, `parse_sf_args`/`parse_full_cfg`, `run_rl`,
`create_actor_critic`, `Learner.get_checkpoints`; the checkpoint itself is read with
`torch.load(..., weights_only=False)`, since SF's `Learner.load_checkpoint` fails quietly
under torch >= 2.6 on the numpy scalars SF stores in it). Pins of the peer venv:
torch 2.13.0 (CPU wheel), sample-factory 2.1.1, popgym 1.0.7, gymnasium 0.29.1 (SF 2.1.1
wants gymnasium < 1.0; r2ac's venv has 1.4.0), numpy < 2.

Command (from the repository root; set-up on first use takes a few minutes and ~1 GB)::

    python3 scripts/peer_sample_factory.py \\
        [--envs RepeatPreviousEasy,CountRecallEasy] [--seeds 0,1] [--repeats 3] \\
        [--frames 1000000] [--peer-venv ../peer-venv] [--out-root runs/peer/<time>] \\
        [--json-out peer.json] [--sf-args "--nonlinearity elu ..."] \\
        [-- R2AC_TRAIN_FLAGS...]

    # smoke test (both sides run, the table prints), ~2-4 min on the 2-core box:
    python3 scripts/peer_sample_factory.py --frames 20000 --repeats 1

    # only create / check the peer venv:
    python3 scripts/peer_sample_factory.py --setup-only

Everything after `--` goes verbatim to the end of `r2ac train` (e.g. the new learner's
`--algorithm ppo --epochs 2 --minibatches 4`); `--sf-args` goes to the end of SF's arguments.

What runs, per env, seed and repeat, alternated run by run (r2ac, SF, r2ac, SF, ...):

* r2ac: `<repo>/.venv/bin/python -m r2ac.cli train --preset P --env gym/popgym-<Env>-v0
  --core gru-bptt --unroll-length 4 --seed S --total-frames F --out-dir D --no-progress
  [pass-through]`, P = `--r2ac-preset` (default popgym; popgym-impala is the IMPALA recipe
  it replaced); serial runtime, 1 learner thread, 32 streams, greedy eval 3 x 100 episodes
  at the end, written to D/eval.json.
* SF 2.1.1 (`<peer-venv>/bin/python scripts/peer_sample_factory.py _sf ...`): APPO with
  `--serial_mode True --async_rl False` (one process: sampler, batcher and learner take turns,
  i.e. synchronous PPO-style training; torch threads 1 like r2ac's learner), 1 worker x 32 envs
  (`--worker_num_splits 1`), rollout = recurrence = 4, batch 256 x 4 minibatches per epoch,
  2 epochs, Adam lr 1e-3, entropy 0.01, GAE (lambda 0.95), gamma 0.99, no V-trace, otherwise
  SF's defaults (input and return normalisation, PPO clip 0.1, grad-norm 4). The network:
  MLP encoder 64-64 (ReLU), GRU 128, decoder MLP 128, policy and value heads, about the size
  of r2ac's popgym agent (MLP stem 64-64, GRU 128, head 128; ~98 k parameters). Inputs: a
  Gymnasium wrapper (below) gives SF, as r2ac's agent gets, the observation one-hot encoded as
  r2ac's gym adapter does (`gymnasium.spaces.flatten`), the previous action's one-hot code and
  the last reward (clipped to [-1, 1]), both zero at an episode's first step. (r2ac feeds the
  last two to the core beside the stem's features and scales the reward by 50; SF gets them in
  its observation, which its input normaliser rescales.) After training, greedy evaluation by
  this script: SF's latest checkpoint is loaded into SF's actor-critic and played with argmax
  actions under r2ac's protocol (3 sets of 100 episodes; set k's env seed is
  SeedSequence([seed, 1000003, k]); 32 streams seeded from it, each plays a fixed quota;
  mean of the set means +- their std).

frames/s: "steady" leaves start-up out (imports, env and model creation, the first 20 % of
the reports), the rule of `r2ac bench runtime`: over a system's progress points from the one
at 20 % of them to the last, (frames_last - frames_first) / (t_last - t_first). r2ac's points
are metrics.csv's rows (every --log-every updates), SF's its report lines in sf_log.txt
("Fps is ... Total num frames: N", every 5 s, frames > 0). "e2e" is each system's own final
figure (r2ac: the "N frames, U updates in T s (X frames/s)" line; SF: "Collected ..., FPS:
X" over its main loop). Neither includes the greedy evaluation. The table gives medians over
repeats and seeds; the ratio is r2ac/SF of the steady medians (of the e2e medians, marked
"(e2e)", where a run is too short to have a steady figure, e.g. SF below ~30 k frames).
On a busy box frames/s are indicative only; load averages are recorded in the JSON.

Output: progress lines on stderr, one Markdown table on stdout, then the JSON path if
`--json-out`; exit status 1 if any run failed (its row then says "failed"). E.g. (2 repeats,
1 M frames, 2-core box under load ~4, 2026-11-26; docs/log/peer.md)::

    | system | env | seed(s) | frames/s (median) | ratio r2ac/peer | greedy eval |
    |---|---|---|---|---|---|
    | r2ac --preset popgym gru-bptt M=4 | RepeatPreviousEasy | 0 | 7551 (e2e 7368) [n=2] \
        | 1.57x | 0: 1.000 (1.000 +- 0.000, 1.000 +- 0.000) |
    | Sample Factory 2.1.1 APPO GRU 128 | RepeatPreviousEasy | 0 | 4811 (e2e 4796) [n=2] \
        | 1.00x | 0: 0.870 (0.810 +- 0.006, 0.931 +- 0.001) |

(one line per row in the real output). frames/s: the steady median, then the e2e median, and
[n=] the runs that gave a figure.
greedy eval: per seed, "seed: mean +- std" (the mean of the 3 set means and their std); with
several repeats "seed: median (each repeat's mean +- std, in run order)". SF's runs of
one seed differ from each other here (why was not looked into), so repeat them; r2ac's
serial runtime is deterministic.
`--json-out` holds every run (commands, run dirs, wall times, frames/s, eval, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SF_VERSION = "2.1.1"
# Pins that install together on Python 3.11 (checked 2026-11-26); torch first, CPU wheel.
PEER_TORCH = "torch==2.13.0"
PEER_PACKAGES = [f"sample-factory=={SF_VERSION}", "popgym==1.0.7", "gymnasium==0.29.1", "numpy<2"]
R2AC_LABEL = "r2ac gru-bptt M=4"
SF_LABEL = f"Sample Factory {SF_VERSION} APPO GRU 128"
EVAL_SEED_OFFSET = 1_000_003  # r2ac.rl.model.build._EVAL_SEED_OFFSET
EVAL_STREAMS = 32  # r2ac.rl.harness.evaluate.MAX_STREAMS


# --------------------------------------------------------------------------- orchestrator


def steady_fps(points: list[tuple[float, float]]) -> float | None:
    """(frames, seconds) points -> frames/s from the point at 20 % of them to the last
    (start-up out), the rule of r2ac.bench.runtime.steady_fps; None with < 2 points."""
    points = points[len(points) // 5 :]
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        return None
    return (points[-1][0] - points[0][0]) / (points[-1][1] - points[0][1])


def env_id(name: str) -> str:
    """'RepeatPreviousEasy' or 'popgym-RepeatPreviousEasy-v0' -> the Gymnasium id."""
    name = name.removeprefix("gym/")
    return name if name.startswith("popgym-") else f"popgym-{name}-v0"


def short(name: str) -> str:
    return env_id(name).removeprefix("popgym-").removesuffix("-v0")


def peer_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def setup_peer(venv: Path) -> None:
    """Create the peer venv: torch (CPU) first, then SF and the envs. Idempotent."""
    py = peer_python(venv)
    stamp = venv / f".peer-sf-{SF_VERSION}"
    if stamp.exists():
        return
    print(
        f"[peer] setting up {venv} (torch first, then sample-factory {SF_VERSION}) ...",
        file=sys.stderr,
        flush=True,
    )
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [PEER_TORCH], check=True)
    subprocess.run(pip + PEER_PACKAGES, check=True)
    check = "import torch, sample_factory, popgym, gymnasium; print(torch.__version__)"
    out = subprocess.run([str(py), "-c", check], check=True, capture_output=True, text=True)
    if "+cpu" not in out.stdout:
        print(
            f"[peer] warning: peer torch is {out.stdout.strip()}, not the CPU build",
            file=sys.stderr,
        )
    stamp.touch()


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def run_logged(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, float]:
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env).returncode
    return rc, time.perf_counter() - start


def tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_r2ac(args, env: str, seed: int, out: Path) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        args.r2ac_python,
        "-m",
        "r2ac.cli",
        "train",
        "--preset",
        args.r2ac_preset,
        "--env",
        f"gym/{env_id(env)}",
        "--core",
        "gru-bptt",
        "--unroll-length",
        "4",
        "--seed",
        str(seed),
        "--total-frames",
        str(args.frames),
        "--out-dir",
        str(out),
        "--no-progress",
        *args.r2ac_args,
    ]
    log = out.parent / f"{out.name}.log"
    rec = run_record("r2ac", env, seed, cmd, out, log)
    if rec["rc"] != 0:
        rec["error"] = tail(log)
        return rec
    rows = []
    with open(out / "metrics.csv") as f:
        header = f.readline().strip().split(",")
        fi, ti = header.index("frames"), header.index("time_s")
        for line in f:
            cells = line.strip().split(",")
            rows.append((float(cells[fi]), float(cells[ti])))
    rec["fps_steady"] = steady_fps(rows)
    m = re.search(r"(\d+) frames, \d+ updates in .*?\(([\d.]+) frames/s\)", log.read_text())
    if m:
        rec["frames"], rec["fps_e2e"] = int(m.group(1)), float(m.group(2))
    ev = json.loads((out / "eval.json").read_text())
    rec["eval"] = {
        k: ev[k]
        for k in ("mean", "std", "set_means", "sets", "episodes_per_set", "actions", "seed")
    }
    return rec


def run_record(system: str, env: str, seed: int, cmd: list, out: Path, log: Path, child_env=None):
    """Run `cmd` (output to `log`) and return the record both systems share."""
    load = loadavg()
    rc, wall = run_logged(cmd, log, child_env)
    return {
        "system": system,
        "env": short(env),
        "seed": seed,
        "cmd": shlex.join(cmd),
        "run_dir": str(out),
        "log": str(log),
        "rc": rc,
        "wall_s": round(wall, 1),
        "loadavg_before": load,
        "loadavg_after": loadavg(),
    }


def run_sf(args, env: str, seed: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "result.json"
    cmd = [
        str(peer_python(args.peer_venv)),
        str(Path(__file__).resolve()),
        "_sf",
        "--env",
        env_id(env),
        "--seed",
        str(seed),
        "--frames",
        str(args.frames),
        "--train-dir",
        str(out),
        "--threads",
        str(args.peer_threads),
        "--result",
        str(result),
        "--sf-args",
        args.sf_args,
    ]
    log = out / "stdout.log"
    child_env = {**os.environ, "OMP_NUM_THREADS": str(args.peer_threads), "WANDB_MODE": "disabled"}
    rec = run_record("sf", env, seed, cmd, out, log, child_env)
    if rec["rc"] != 0 or not result.exists():
        rec["error"] = tail(log)
        return rec
    rec.update(json.loads(result.read_text()))
    return rec


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(records: list[dict], envs: list[str], seeds: list[int], preset: str) -> str:
    lines = [
        "| system | env | seed(s) | frames/s (median) | ratio r2ac/peer | greedy eval |",
        "|---|---|---|---|---|---|",
    ]
    for env in envs:
        e = short(env)
        fps = {}
        for system in ("r2ac", "sf"):
            runs = [r for r in records if r["system"] == system and r["env"] == e]
            fps[system] = (
                median([r.get("fps_steady") for r in runs]),
                median([r.get("fps_e2e") for r in runs]),
            )
        r2ac_label = R2AC_LABEL.replace("r2ac", f"r2ac --preset {preset}")
        for system, label in (("r2ac", r2ac_label), ("sf", SF_LABEL)):
            runs = [r for r in records if r["system"] == system and r["env"] == e]
            steady, e2e = fps[system]
            if steady is None and e2e is None:
                fps_cell = "failed" if any(r.get("error") for r in runs) else "-"
            else:
                fps_cell = (f"{steady:.0f}" if steady else "-") + (
                    f" (e2e {e2e:.0f})" if e2e else ""
                )
            # like with like: steady/steady where both have it, else end-to-end/end-to-end
            kind = 0 if fps["sf"][0] and fps["r2ac"][0] else 1
            own, ref = fps[system][kind], fps["sf"][kind]
            ratio = f"{own / ref:.2f}x" + ("" if kind == 0 else " (e2e)") if own and ref else "-"
            evals = []
            for s in seeds:
                ev = [r["eval"] for r in runs if r["seed"] == s and "eval" in r]
                if len(ev) == 1:
                    evals.append(f"{s}: {ev[0]['mean']:.3f} +- {ev[0]['std']:.3f}")
                elif ev:  # the median over repeats, then each repeat's figure
                    each = ", ".join(f"{x['mean']:.3f} +- {x['std']:.3f}" for x in ev)
                    evals.append(f"{s}: {median([x['mean'] for x in ev]):.3f} ({each})")
                else:
                    evals.append(f"{s}: failed")
            n = len([r for r in runs if r.get("fps_steady") or r.get("fps_e2e")])
            lines.append(
                f"| {label} | {e} | {','.join(map(str, seeds))} | {fps_cell} [n={n}] "
                f"| {ratio} | {'; '.join(evals)} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, r2ac_args = argv[:i], argv[i + 1 :]
    else:
        r2ac_args = []
    p = argparse.ArgumentParser(
        description="r2ac vs Sample Factory 2.1.1 on POPGym: frames/s and greedy eval "
        "(arguments after -- go to `r2ac train`)."
    )
    p.add_argument(
        "--envs",
        default="RepeatPreviousEasy",
        help="comma list of POPGym envs (RepeatPreviousEasy, CountRecallEasy, ...)",
    )
    p.add_argument("--seeds", default="0", help="comma list of seeds")
    p.add_argument("--repeats", type=int, default=1, help="alternated pairs per env and seed")
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument(
        "--peer-venv",
        type=Path,
        default=REPO.parent / "peer-venv",
        help="the peer's venv (created if missing; default: ../peer-venv)",
    )
    p.add_argument("--peer-threads", type=int, default=1, help="torch threads of SF's process")
    p.add_argument("--r2ac-python", default=str(REPO / ".venv" / "bin" / "python"))
    p.add_argument(
        "--r2ac-preset", default="popgym", help="r2ac's preset (e.g. popgym-impala, the old one)"
    )
    p.add_argument("--sf-args", default="", help="extra SF arguments (one string)")
    p.add_argument(
        "--out-root", type=Path, default=None, help="where runs go (default runs/peer/<time>)"
    )
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--setup-only", action="store_true")
    args = p.parse_args(argv)
    args.r2ac_args = r2ac_args
    args.peer_venv = args.peer_venv.resolve()
    setup_peer(args.peer_venv)
    if args.setup_only:
        print(f"peer venv ready: {args.peer_venv}")
        return 0
    envs = [e for e in args.envs.split(",") if e]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    root = args.out_root or REPO / "runs" / "peer" / datetime.now().strftime("%Y%m%d-%H%M%S")
    root = root.resolve()
    records: list[dict] = []
    for rep in range(args.repeats):
        for env in envs:
            for seed in seeds:
                for system in ("r2ac", "sf"):  # alternated: A B A B ...
                    out = root / f"{short(env)}-s{seed}-r{rep}-{system}"
                    print(
                        f"[peer] {system} {short(env)} seed {seed} repeat {rep} -> {out}",
                        file=sys.stderr,
                        flush=True,
                    )
                    run = run_r2ac if system == "r2ac" else run_sf
                    rec = run(args, env, seed, out)
                    rec["repeat"] = rep
                    records.append(rec)
                    if rec.get("error"):
                        print(
                            f"[peer] {system} failed (rc {rec['rc']}):\n{rec['error']}",
                            file=sys.stderr,
                            flush=True,
                        )
                    else:
                        print(
                            f"[peer]   steady {rec.get('fps_steady')} e2e {rec.get('fps_e2e')}"
                            f" eval {rec['eval']['mean']:.3f} wall {rec['wall_s']} s",
                            file=sys.stderr,
                            flush=True,
                        )
    text = table(records, envs, seeds, args.r2ac_preset)
    print(text)
    if args.json_out:
        doc = {
            "created": datetime.now().isoformat(timespec="seconds"),
            "argv": sys.argv,
            "frames": args.frames,
            "repeats": args.repeats,
            "envs": envs,
            "seeds": seeds,
            "r2ac_preset": args.r2ac_preset,
            "r2ac_args": r2ac_args,
            "sf_args": args.sf_args,
            "cpus": os.cpu_count(),
            "table": text,
            "runs": records,
        }
        args.json_out.write_text(json.dumps(doc, indent=2))
        print(f"json: {args.json_out}")
    return 1 if any(r.get("error") for r in records) else 0


# --------------------------------------------------------------------- SF side (peer venv)


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
    p = argparse.ArgumentParser(prog="peer_sample_factory.py _sf")
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--train-dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--result", type=Path, required=True)
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
        "--serial_mode=True",
        "--async_rl=False",
        "--num_workers=1",
        "--num_envs_per_worker=32",
        "--worker_num_splits=1",
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
    torch.set_num_threads(a.threads)  # SF's serial runner leaves torch's thread count as is
    parser, _ = parse_sf_args(argv=sf_argv, evaluation=False)
    cfg = parse_full_cfg(parser, sf_argv)
    start = time.perf_counter()
    status = 0 if a.eval_only else run_rl(cfg)
    train_wall = None if a.eval_only else round(time.perf_counter() - start, 1)
    if status != 0:
        print(f"SF training failed with status {status}", file=sys.stderr)
        return 1

    res: dict = {
        "sf_status": int(status),
        "train_wall_s": train_wall,
        "sf_argv": sf_argv,
        "torch": torch.__version__,
    }
    log_text = (a.train_dir / experiment / "sf_log.txt").read_text(errors="replace")
    pts = []
    for m in re.finditer(
        r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] Fps is .*?"
        r"Total num frames: (\d+)",
        log_text,
    ):
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if int(m.group(2)) > 0:
            pts.append((int(m.group(2)), t))
    res["fps_steady"] = steady_fps(pts)
    m = re.search(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)", log_text)
    if m:
        res["frames"], res["fps_e2e"] = int(m.group(1)), float(m.group(2))

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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_sf":
        sys.exit(sf_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
