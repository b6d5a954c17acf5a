"""Batched environments: one protocol (`r2ac.envs.base`), built-in memory tasks, and lazily
imported adapters for envpool, Gymnasium and DeepMind Lab. See docs/envs.md."""

from r2ac.envs.base import ArraySpec, BatchedEnv, StepResult
from r2ac.envs.registry import DEFAULT_ENV, available, make, parse_options
from r2ac.envs.trust import allow_env_module

__all__ = [
    "DEFAULT_ENV",
    "ArraySpec",
    "BatchedEnv",
    "StepResult",
    "allow_env_module",
    "available",
    "make",
    "parse_options",
]
