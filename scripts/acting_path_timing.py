"""Time the per-step pieces of an actor's Discrete acting path in one process (best of 5 x
2,000 calls each, one thread), beside the plain torch calls they replace: sampling through
the policy's distribution object against `softmax` + `multinomial`, and the new-episode
reset of the previous action (`zero_where`) against `masked_fill`. Whole-run frames/s on a
shared 2-core box swing by more than the few microseconds at stake (docs/log/actions.md).

    .venv/bin/python scripts/acting_path_timing.py [--streams 32] [--actions 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import timeit

import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.rl.distributions import distribution, zero_where


def timings(streams: int, actions: int) -> dict[str, float]:
    """Microseconds per call of each piece (best of 5 repeats of 2,000 calls)."""
    space = ActionSpace.discrete(actions)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(streams, actions)  # (B, A)
    done = torch.rand(streams) < 0.1  # (B,)
    taken = torch.randint(0, actions, (streams,))  # (B,)
    pieces = {
        "softmax + multinomial": lambda: torch.multinomial(
            torch.softmax(logits, dim=-1), 1, generator=generator
        ).squeeze(1),
        "distribution().sample": lambda: distribution(space, logits).sample(generator),
        "masked_fill": lambda: taken.masked_fill(done, 0),
        "zero_where": lambda: zero_where(taken, done),
    }
    return {
        name: min(timeit.repeat(call, number=2000, repeat=5)) / 2000 * 1e6
        for name, call in pieces.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--actions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for round_ in range(args.rounds):
        row = timings(args.streams, args.actions)
        print(f"round {round_}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items()))


if __name__ == "__main__":
    main()
