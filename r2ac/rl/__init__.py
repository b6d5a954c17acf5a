"""R2AC, the trainer (docs/rl.md), by role:

config.py, presets.py  the settings of `r2ac train` and the named presets
learning/              the algorithms: V-trace, losses, PPO, actor, learner
model/                 the agent: stems, heads, distributions; building it from a config
run/                   the run around any trainer: run directory, tracker, the training loop
runtimes/              how segments reach the learner: serial, parallel, Ray
stream/                the streaming agents (one update a step): stream AC, QRC, their runtime
harness/               the commands: `r2ac train`, `r2ac eval`, diagnostics, the memory check
"""
