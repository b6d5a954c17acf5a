"""`r2ac train`'s options by algorithm: one subcommand each (impala, ppo, stream-ac, stream-q),
listing only what that algorithm reads (config.algorithm_options), in the config's groups.

The options are generated from TrainConfig's fields (their types, their docstrings as help,
the preset's values as defaults), so a field added to a group appears in every subcommand that
reads it. A flag that is not an option of the chosen subcommand is refused in one line naming
the subcommands that have it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from functools import cache
from typing import Annotated, Any

import tyro

from r2ac.errors import ConfigError
from r2ac.rl.config import FLAT_FIELDS, GROUPS, TrainConfig, algorithm_options, field_types

SUBCOMMANDS = {
    "impala": "R2AC: IMPALA with V-trace, its recurrent core trained by exact RTRL or truncated BPTT",
    "ppo": "PPO-clip on the same agent and runtimes (the core by exact RTRL or truncated BPTT)",
    "stream-ac": "stream AC(lambda): K agents in lockstep, an update every step, ObGD or intentional (r2ac/rl/stream)",
    "stream-q": "QRC(lambda): K value-based agents in lockstep, an update every step (r2ac/rl/stream)",
}
# `r2ac train`'s own options beside the config's
COMMAND_FLAGS = ("--preset", "--resume", "--restart", "--algorithm", "--help", "-h")


@cache
def _docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = inspect.cleandoc(str(after.value.value))
    return docs


def flags_of(algorithm: str) -> set[str]:
    """The flags `r2ac train ALGORITHM` takes (a bool's --no-FLAG included)."""
    types = field_types()
    flags = set()
    for name in algorithm_options(algorithm):
        flag = "--" + name.replace("_", "-")
        flags |= {flag, "--no-" + flag[2:]} if types[name] is bool else {flag}
    return flags


def check_flags(argv: list[str], algorithm: str) -> None:
    """ConfigError naming the first flag of argv that `algorithm` does not take."""
    own = flags_of(algorithm) | set(COMMAND_FLAGS)
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag in own:
            continue
        having = [a for a in SUBCOMMANDS if flag in flags_of(a)]
        where = f"an option of {' and '.join(having)}" if having else "not an option of r2ac train"
        raise ConfigError(
            f"{flag}: not an option of `r2ac train {algorithm}` ({where}; "
            f"`r2ac train {algorithm} --help` lists its options)"
        )


def options_class(algorithm: str, default: TrainConfig) -> type:
    """A dataclass of `algorithm`'s options, one nested dataclass per config group (a section
    of --help each), defaults from `default`; `to_flat(instance)` reads it back."""
    names, values, types = set(algorithm_options(algorithm)), default.flat(), field_types()
    groups = []
    for group, cls in GROUPS.items():
        docs = _docs(cls)
        fields = [
            (name, Annotated[types[name], tyro.conf.arg(help=docs.get(attr, ""))],
             dataclasses.field(default=values[name]))
            for name, (g, attr) in FLAT_FIELDS.items()
            if g == group and name in names
        ]  # fmt: skip
        if fields:
            sub = dataclasses.make_dataclass(f"{cls.__name__}Options", fields, frozen=True)
            sub.__doc__ = cls.__doc__
            groups.append((group, sub, dataclasses.field(default=sub())))
    return dataclasses.make_dataclass("TrainOptions", groups, frozen=True)


def to_flat(options: Any) -> dict[str, Any]:
    """The flat option values of an `options_class` instance."""
    return {
        name: value
        for group in dataclasses.fields(options)
        for name, value in dataclasses.asdict(getattr(options, group.name)).items()
    }


def parse_options(argv: list[str], algorithm: str, default: TrainConfig, description: str):
    """The flat values of `algorithm`'s options given by argv over `default`'s."""
    check_flags(argv, algorithm)
    cls = options_class(algorithm, default)
    own = [a for a in argv if a.split("=", 1)[0] not in ("--preset",)]
    parsed = tyro.cli(
        tyro.conf.OmitArgPrefixes[cls],
        default=cls(),
        args=own,
        prog=f"r2ac train {algorithm}",
        description=description,
    )
    return to_flat(parsed)
