"""`r2ac demo`: prove the eLSTM's RTRL gradient exact, then time it against truncated BPTT.

1. float64 gradient check: rule "rtrl" against full BPTT through the whole history, and rule
   "bptt" against BPTT truncated at segment starts (several segments, resets inside them).
2. One `bench core` row: a segment of (T, B, N, D) = (50, 32, 256, 257).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import tyro

from r2ac.bench import core as bench
from r2ac.errors import ConfigError
from r2ac.perf import check_memory, keep_freed_memory
from r2ac.rtrl import ELSTM
from r2ac.rtrl.gradcheck import check_gradients
from r2ac.rtrl.reference import elstm_reference


@dataclass(frozen=True)
class DemoConfig:
    """Options of `r2ac demo`."""

    seed: int = 0
    """Seed of the random problem and the layer's initialisation."""
    shape: str = "50,32,256,257"
    """T,B,N,D of the benchmark row."""
    repeats: int = 10
    """Timed repeats of the benchmark row."""


def check(cfg: DemoConfig) -> tuple[int, int, int, int]:
    """The benchmark shape; ConfigError for a bad shape, too few repeats or a shape that
    does not fit in memory (before anything runs)."""
    try:
        shape = bench.parse_shape(cfg.shape)
    except ValueError:
        raise ConfigError(
            f"--shape must be four positive integers T,B,N,D, got {cfg.shape!r}"
        ) from None
    if not 1 <= cfg.repeats <= 10_000:
        raise ConfigError(f"--repeats must be in 1..10,000, got {cfg.repeats}")
    if not 0 <= cfg.seed < 2**63:
        raise ConfigError(f"--seed must be in 0..2**63-1, got {cfg.seed}")
    check_memory(bench.memory_parts(shape, 4), f"--shape {cfg.shape}")
    return shape


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(DemoConfig, args=argv, prog="r2ac demo", description=__doc__)
    try:
        shape = check(cfg)
    except ConfigError as exc:
        print(f"r2ac demo: error: {exc}", file=sys.stderr)
        return 2
    keep_freed_memory()
    segments = (7, 1, 5, 1, 1, 12)
    print(f"gradient check, float64, segments {segments}, 4 streams, resets with p = 0.15")
    for rule, truncated, against in (
        ("rtrl", False, "full BPTT"),
        ("bptt", True, "truncated BPTT"),
    ):
        torch.manual_seed(cfg.seed)
        layer = ELSTM(8, 6, rule, dtype=torch.float64)
        result = check_gradients(
            layer, elstm_reference, segments, 4, truncated=truncated, seed=cfg.seed
        )
        worst = max(result.rel_error, key=result.rel_error.get)
        print(
            f"  {rule:>4} vs {against:<15} max rel error {result.max_rel_error:.1e} (param {worst})"
        )
        if result.max_rel_error > 1e-9:
            print("gradient check FAILED", file=sys.stderr)
            return 1
    print(f"\nbenchmark, float32, {bench.machine_line('cpu')}")
    row = bench.bench_shape(shape, bench.BenchCoreConfig(repeats=cfg.repeats, memory=False))
    print(bench.format_rows([row]))
    return 0
