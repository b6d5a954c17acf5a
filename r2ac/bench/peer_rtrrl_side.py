"""The peer's side of `r2ac bench peer-rtrrl`: RTRRL (the AAAI-25 code) trained with its
default streaming agent on gymnax MemoryChain. Run by the peer venv's Python (never imported
by r2ac, and importing nothing of it):

    <peer-venv>/bin/python -P r2ac/bench/peer_rtrrl_side.py --src CHECKOUT --episodes 102 \
        [--steps 1000] [--length 32] [--seed 1] --result F.json

CHECKOUT is a checkout of RTRRL's repository (its code in CHECKOUT/rtrrl/) or that folder
itself. The agent is `rtrrl.py`'s `RTRRLParams()` as it stands, with only these changed:
- the env: `MemoryChain-bsuite` with `memory_length` = --length (gymnax's defaults otherwise:
  one context bit, episodes of length + 1 steps);
- the length: --episodes scans of --steps env steps (its "episodes" are scan lengths, 1,000
  steps by default, not env episodes);
- no evaluation (`eval_every=0`): only training is timed, like `r2ac train --no-eval-at-end`;
- the seed (its own default draws one at random; 0 also means random there).

RTRRL imports popjym at module level, a package installed from its repository and not on
PyPI; where it is missing an empty stand-in is registered (popjym's envs are then unknown to
`make_env`, which reaches gymnax's first for MemoryChain anyway). The result file says how
many env steps ran and how long `train_rtrrl` took inside the process. (rtrrl.py turns on
JAX's persistent compilation cache in /tmp/jax_cache: runs after the first read their
compiled scan from there.)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
import types
from pathlib import Path

ENV_NAME = "MemoryChain-bsuite"


def rtrrl_dir(src: Path) -> Path:
    """The folder that holds rtrrl.py: CHECKOUT/rtrrl or CHECKOUT itself."""
    for cand in (src / "rtrrl", src):
        if (cand / "rtrrl.py").is_file():
            return cand
    raise SystemExit(f"no rtrrl.py in {src} or {src / 'rtrrl'}")


def stand_in_popjym() -> bool:
    """Register an empty popjym module unless the real one is installed; True if it was."""
    if importlib.util.find_spec("popjym") is not None:
        return False
    popjym = types.ModuleType("popjym")
    popjym.registration = types.SimpleNamespace(REGISTERED_ENVS={})
    sys.modules["popjym"] = popjym
    return True


def make_params(rtrrl, environments, args):
    """RTRRL's default parameters with the env, length, evaluation and seed set."""
    default = rtrrl.RTRRLParams()
    env = dataclasses.replace(
        default.env_params, env_name=ENV_NAME, env_kwargs={"memory_length": args.length}
    )
    assert isinstance(env, environments.EnvironmentParams)
    return dataclasses.replace(
        default, env_params=env, episodes=args.episodes, steps=args.steps, eval_every=0,
        seed=args.seed,
    )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, required=True, help="RTRRL checkout")
    p.add_argument("--episodes", type=int, required=True, help="scans of --steps env steps")
    p.add_argument("--steps", type=int, default=1000, help="env steps a scan (its default)")
    p.add_argument("--length", type=int, default=32, help="MemoryChain's memory_length")
    p.add_argument("--seed", type=int, default=1, help="seed (RTRRL draws one for 0)")
    p.add_argument("--result", type=Path, required=True, help="JSON written at the end")
    args = p.parse_args()
    code = rtrrl_dir(args.src.resolve())
    stand_in = stand_in_popjym()
    sys.path.insert(0, str(code))
    os.chdir(code)  # its modules import each other by top-level names
    import jax
    import rtrrl
    from envs import environments

    params = make_params(rtrrl, environments, args)
    start = time.perf_counter()
    rtrrl.train_rtrrl(params)
    seconds = time.perf_counter() - start
    doc = {"steps": args.episodes * args.steps, "episodes": args.episodes,
           "steps_per_episode": args.steps, "length": args.length, "seed": args.seed,
           "train_s": seconds, "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
           "popjym_stand_in": stand_in, "params": repr(params)}  # fmt: skip
    args.result.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
