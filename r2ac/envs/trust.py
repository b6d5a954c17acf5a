"""Which user modules an env id may import: a run directory is data, not code.

`gym/<module>:<EnvId>` imports <module> (gymnasium's form for a user's own env). An id read
from a file (a run directory's config.json) must not choose code to run, so the gym adapter
imports a user module only if this process was allowed to, by one of:

- the entry point, for an env named on its command line (`r2ac train --env gym/M:ID`, or
  `--env gym/M:ID` beside `r2ac eval DIR` / `--resume DIR` / `--restart DIR`), or for
  `--trust-env-module`;
- Python code, `r2ac.envs.allow_env_module("M")`;
- the environment, `R2AC_TRUSTED_ENV_MODULES=M1,M2` (set by the above too, so that actor
  processes, which start with this environment, build the same envs).

A standard-library module never registers an env and some run code at import (`this`,
`antigravity`): it is refused always. Every check here runs before any import.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from r2ac.errors import ConfigError

TRUST_VAR = "R2AC_TRUSTED_ENV_MODULES"
TRUST_FLAG = "--trust-env-module"
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def user_module(env_id: str) -> str | None:
    """The module a full env id (`gym/M:ID`) would import, else None; no import."""
    family, _, task = env_id.partition("/")
    if family != "gym" or ":" not in task:
        return None
    return task.partition(":")[0]


def allowed_modules() -> set[str]:
    return {m for m in os.environ.get(TRUST_VAR, "").split(",") if m}


def allow_env_module(module: str) -> None:
    """Let this process (and the processes it starts) import `module` for an env id."""
    check_module_name(module)
    names = allowed_modules() | {module}
    os.environ[TRUST_VAR] = ",".join(sorted(names))


def allow_env(env_id: str) -> None:
    """Allow the module of an env id named by the user (no-op for ids without one)."""
    module = user_module(env_id)
    if module is not None:
        allow_env_module(module)


def check_module_name(module: str) -> None:
    """ConfigError for a name that is not a dotted identifier or is the standard library's."""
    if not _MODULE.fullmatch(module):
        raise ConfigError(f"env module {module!r} is not a module name (a.b.c)")
    if module.split(".")[0] in sys.stdlib_module_names:
        raise ConfigError(
            f"env module {module!r} is part of Python's standard library, which registers no "
            "env; name your own module (gym/MODULE:ENV_ID)"
        )


def check_may_import(env_id: str) -> None:
    """ConfigError unless the module of `env_id` (if any) may be imported in this process."""
    module = user_module(env_id)
    if module is None:
        return
    check_module_name(module)
    if module not in allowed_modules():
        raise ConfigError(
            f"env {env_id} would import module {module!r}, which was not named on the command "
            f"line (a run directory's config.json is not trusted to run code): if you trust "
            f"it, add `--env {env_id}` or `{TRUST_FLAG}` (Python: "
            f"r2ac.envs.allow_env_module({module!r}))"
        )


@dataclass(frozen=True)
class TrustRequest:
    """What the command line of a command on an existing run says about its env module."""

    named: str | None = None  # `--env ID`
    trusted: bool = False  # `--trust-env-module`

    def apply(self, env_id: str, command: str) -> None:
        """Allow the run's env module if the user named the env or trusted it; ConfigError
        for another env named, or a module not allowed. Nothing is imported."""
        if self.named is not None and self.named != env_id:
            raise ConfigError(f"{command}: --env {self.named} is not the run's env ({env_id})")
        if self.named is not None or self.trusted:
            allow_env(env_id)
        check_may_import(env_id)


def pop_trust_options(argv: list[str]) -> tuple[list[str], TrustRequest]:
    """argv without `--env ID` / `--env=ID` and `--trust-env-module`, and what they said."""
    rest, named, trusted = [], None, False
    args = iter(argv)
    for arg in args:
        if arg == TRUST_FLAG:
            trusted = True
        elif arg == "--env":
            named = next(args, None)
            if named is None:
                raise ConfigError("--env needs a value")
        elif arg.startswith("--env="):
            named = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return rest, TrustRequest(named, trusted)


NO_TRUST = TrustRequest()  # neither --env nor --trust-env-module given
