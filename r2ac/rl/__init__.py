"""R2AC, the trainer (docs/rl.md), by role:

config.py, presets.py  the settings of `r2ac train` and the named presets
learning/              the algorithms: V-trace, losses, PPO, actor, learner
model/                 the agent: stems, heads, distributions; building it from a config
run/                   the run around any trainer: run directory, tracker, the training loop
runtimes/              how segments reach the learner: serial, parallel, Ray
stream/                the streaming agents (one update a step): stream AC, QRC, their runtime
harness/               the commands: `r2ac train`, `r2ac eval`, diagnostics, the memory check

The modules' earlier flat names (`r2ac.rl.vtrace`, `r2ac.rl.learner`, ...) still import:
they resolve to the same module objects in their rooms.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

_ROOMS = {
    "learning": ("vtrace", "losses", "ppo", "actor", "learner"),
    "model": ("nets", "agent", "distributions", "build"),
    "harness": ("train_cli", "evaluate", "diagnostics", "diagnose_cli", "resources"),
    "run": ("run_dir", "tracker"),
}
MOVED = {f"{__name__}.{m}": f"{__name__}.{room}.{m}" for room, ms in _ROOMS.items() for m in ms}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import r2ac.rl.vtrace` gives the module r2ac.rl.learning.vtrace itself."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system overwrites __spec__ next
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
