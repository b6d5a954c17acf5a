"""`r2ac envs`: which env families run on this machine, and why the others do not."""

from __future__ import annotations

import argparse

from r2ac.envs.registry import DEFAULT_ENV, available


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="r2ac envs", description="List env families and whether they run here.")
    return parser


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    rows = [(s.family, "yes" if s.available else "no", s.examples, s.reason)
            for s in available()]
    header = ("family", "available", "names", "backend / why not")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3])
    print(f"\ndefault env of `r2ac train`: {DEFAULT_ENV} (see docs/envs.md)")
    return 0
