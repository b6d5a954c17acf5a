"""CPU time per env step of a built-in task: the numpy env behind `PreviousActionInput` (what
the streaming runtime steps today), the tensor functions of r2ac/envs/tensor_builtin.py
eager, and the same `step` under torch.compile (fullgraph). One torch thread,
`time.process_time`, the median of blocks after warm-up blocks that are not counted.
"call floor": a compiled function of the same inputs and outputs that does no env work,
the cost of the call itself (inside a larger compiled step the env pays only the rest).

    python scripts/bench_tensor_env.py --task memory-chain --length 32 --k 1 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from r2ac.envs import make
from r2ac.envs.tensor_builtin import (
    TensorStep,
    agent_stream_seeds,
    obs_width,
    reset,
    step,
    tensor_params,
)
from r2ac.rl.stream.envs import PreviousActionInput


def per_step_us(fn, actions, blocks: int, warmup: int) -> float:
    """Median over `blocks` of the CPU microseconds per call of fn(actions[i])."""
    times = []
    for b in range(warmup + blocks):
        start = time.process_time()
        for a in actions:
            fn(a)
        if b >= warmup:
            times.append((time.process_time() - start) / len(actions) * 1e6)
    return statistics.median(times)


def call_floor(params, state, actions) -> TensorStep:
    """`step`'s inputs and outputs (fresh tensors of the same shapes), no env work."""
    k, width = actions.shape[0], obs_width(params)
    obs = actions.to(torch.float32).unsqueeze(1).expand(k, width) * 0.0
    flag = actions < 0
    moved = state._replace(
        episode=state.episode + 1, t=state.t + 1, returns=state.returns + 1, lengths=state.t + 2
    )
    reward = actions.to(torch.float32)
    return TensorStep(moved, obs, reward, flag, ~flag, obs + 1, state.returns * 2, actions + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="memory-chain")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--steps", type=int, default=2000, help="steps per block")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = tensor_params(args.task, True, length=args.length)
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    floor = torch.compile(call_floor, fullgraph=True, dynamic=False)
    print(f"builtin/{args.task} length {args.length}, prev-action, torch {torch.__version__}")
    heads = ("numpy+wrapper", "tensor eager", "compiled", "call floor")
    print(f"{'K':>4}" + "".join(f"{h + ' us':>17}" for h in heads))
    for k in args.k:
        seeds = list(range(k))
        rng = np.random.default_rng(0)
        np_actions = [rng.integers(0, 2, k) for _ in range(args.steps)]
        t_actions = [torch.from_numpy(a) for a in np_actions]

        env = make(f"builtin/{args.task}", k, 0, length=args.length)
        env.seeds[:] = agent_stream_seeds(seeds).numpy()
        env = PreviousActionInput(env)
        env.reset()
        numpy_us = per_step_us(env.step, np_actions, args.blocks, args.warmup)

        figures = []
        for fn in (step, compiled, floor):
            state = reset(params, agent_stream_seeds(seeds))[0]

            def one(a, fn=fn):
                nonlocal state
                state = fn(params, state, a).state

            if fn is not step:
                start = time.perf_counter()
                one(t_actions[0])
                took = time.perf_counter() - start
                print(
                    f"     (K = {k}: {fn._torchdynamo_orig_callable.__name__} compiled in {took:.1f} s)"
                )
            figures.append(per_step_us(one, t_actions, args.blocks, args.warmup))
        print(f"{k:>4}" + "".join(f"{us:>17.1f}" for us in (numpy_us, *figures)))


if __name__ == "__main__":
    main()
