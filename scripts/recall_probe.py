"""Supervised probe: can a core output the symbol seen `lag` steps ago (the memory of POPGym's
RepeatPrevious) through R2AC's stem -> core -> linear readout? Full BPTT over whole
sequences (the core's "bptt" rule inside one segment is exact BPTT), Adam.

    python scripts/recall_probe.py elstm-bptt 3 128 2000    # core, lag, N, updates

Prints loss and accuracy (over every step that has a target) five times during training.
"""

from __future__ import annotations

import argparse
import time

import torch

from r2ac.rtrl.registry import make_core


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("core")
    parser.add_argument("lag", type=int)
    parser.add_argument("hidden", type=int)
    parser.add_argument("updates", type=int)
    parser.add_argument("--symbols", type=int, default=4)
    parser.add_argument("--length", type=int, default=52)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    K, T, B = args.symbols, args.length, args.batch
    stem = torch.nn.Sequential(
        torch.nn.Linear(K, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU()
    )
    core = make_core(args.core, 64, args.hidden)
    head = torch.nn.Linear(args.hidden, K)
    params = [*stem.parameters(), *core.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    start = time.perf_counter()
    for update in range(args.updates + 1):
        symbols = torch.randint(0, K, (T, B))  # (T, B)
        x = torch.nn.functional.one_hot(symbols, K).float()  # (T, B, K)
        h, _ = core(stem(x), core.initial_state(B))  # (T, B, N)
        logits = head(h)[args.lag :]  # (T - lag, B, K): step t answers symbol t - lag
        targets = symbols[: T - args.lag]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, K), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if update % max(1, args.updates // 5) == 0:
            accuracy = (logits.argmax(-1) == targets).float().mean()
            print(
                f"{args.core} lag={args.lag} N={args.hidden} update {update} loss "
                f"{loss.item():.3f} accuracy {accuracy:.3f} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
