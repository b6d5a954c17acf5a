"""`r2ac envs`: which env families run on this machine, and why the others do not."""

from __future__ import annotations

import argparse

from r2ac.envs.registry import DEFAULT_ENV, available


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="r2ac envs", description="List env families and whether they run here."
    )
    parser.add_argument(
        "--ids",
        action="store_true",
        help="also list every POPGym, MinAtar and masked MuJoCo env id (when installed)",
    )
    return parser


# Gymnasium id prefixes of the memory / small-game suites worth listing one by one.
LISTED_SUITES = (("POPGym", "popgym-", "popgym"), ("MinAtar", "MinAtar/", "minatar"))


def _print_ids() -> None:
    from r2ac.envs.gym_adapter import registered_ids

    for suite, prefix, extra in LISTED_SUITES:
        ids = registered_ids(prefix)
        if not ids:
            print(f"\n{suite}: not installed (pip install -e '.[{extra}]')")
            continue
        print(f"\n{suite} ({len(ids)} ids; use as gym/<id>):")
        for env_id in ids:
            print(f"  gym/{env_id}")
    _print_masked_ids()


def _print_masked_ids() -> None:
    from r2ac.envs.masked_mujoco import MASKS, masked_ids
    from r2ac.envs.registry import _import_error

    kinds = ", ".join(f"-{k}: {v} only" for k, v in MASKS.items())
    missing = _import_error("mujoco")
    state = "not installed (pip install -e '.[mujoco]')" if missing else f"{len(masked_ids())} ids"
    print(f"\nMasked MuJoCo ({state}; {kinds}):")
    for task in masked_ids():
        print(f"  masked/{task}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rows = [(s.family, "yes" if s.available else "no", s.examples, s.reason) for s in available()]
    header = ("family", "available", "names", "backend / why not")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
            + "  "
            + row[3]
        )
    if args.ids:
        _print_ids()
    else:
        print("\n`r2ac envs --ids` lists every POPGym, MinAtar and masked MuJoCo id.")
    print(f"\ndefault env of `r2ac train`: {DEFAULT_ENV} (see docs/envs.md)")
    return 0
