"""A/B of the eLSTM carry in one process: bptt, rtrl in place, rtrl eager (inplace_carry=False).

    .venv/bin/python scripts/ab_inplace_carry.py

Alternates the three in one loop (r2ac.bench.core.time_alternating), 3 rounds of 20 repeats
after 3 warm-up ones, at the two shapes of issue 2; prints ms and the rtrl/bptt speed ratios.
Figures: docs/results.md, "In-place carry".
"""

import torch

from r2ac.bench import core

for shape in [(50, 32, 256, 257), (100, 32, 512, 257)]:
    fns = {}
    for name in ("bptt", "rtrl_inplace", "rtrl_eager"):
        layer, x, readout, state = core._setup(shape, name[:4], torch.float32, "cpu")
        layer.inplace_carry = name != "rtrl_eager"
        fns[name] = core.segment_fn(layer, x, readout, state)
    for _ in range(3):
        ms = core.time_alternating(fns, 20, 3, "cpu")
        print(
            shape,
            {k: round(v, 2) for k, v in ms.items()},
            f"in place {ms['bptt'] / ms['rtrl_inplace']:.3f}, eager {ms['bptt'] / ms['rtrl_eager']:.3f}",
        )
