"""`r2ac train`'s options: the batched trainer's help shows its own groups and no streaming or
removed option, and configs of runs written before an option moved or went still load."""

import re
import subprocess
import sys

import pytest

from r2ac.errors import ConfigError
from r2ac.rl.config import REMOVED_OPTIONS, TrainConfig, from_dict, to_dict


def _flags_by_section() -> dict[str, set[str]]:
    """`r2ac train --help` (in a fresh process, as a user sees it): flags by section."""
    code = "import sys; from r2ac.rl.harness.train_cli import main; sys.exit(main(['--help']))"
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    sections: dict[str, set[str]] = {}
    current = ""
    for line in text.splitlines():
        title = re.match(r"\s*╭─ (.+?) ─", line)
        if title:
            current = title.group(1)
            continue
        flag = re.match(r"\s*│ (--[a-z0-9-]+)", line)
        if flag and flag.group(1) != "--help":
            sections.setdefault(current, set()).add(flag.group(1))
    return sections


def test_the_batched_help_shows_its_groups_and_nothing_of_the_streaming_agents():
    sections = _flags_by_section()
    groups = {"env options", "model options", "loss options", "optim options",
              "runtime options", "run options"}  # fmt: skip
    assert groups <= set(sections) and "stream options" not in sections
    every = set().union(*sections.values())
    assert "--decorrelate-steps" in sections["runtime options"] and "--core" in every
    assert "--unroll-length" in sections["runtime options"]  # read by actors and runtimes
    assert not {"--num-agents", "--kappa-actor", "--streaming", "--algorithm"} & every
    removed = {"--" + name.replace("_", "-") for name in REMOVED_OPTIONS}
    assert not removed & every


def test_a_config_from_before_the_study_group_and_the_removals_loads():
    data = to_dict(TrainConfig.make(decorrelate_steps=3, progress=False))
    old = {g: dict(v) for g, v in data.items() if g != "study"}
    old["env"]["decorrelate_steps"] = 3  # where the field lived before
    old["run"]["progress"] = False
    old["model"].update(critic_clock=False, policy_init_scale=1.0)  # removed, at defaults
    old["optim"].update(rms_alpha=0.99, rms_eps=0.01, core_lr_scale=1.0)
    cfg = from_dict(old)
    assert cfg.runtime.decorrelate_steps == 3 and cfg.run.progress is False


@pytest.mark.parametrize("name, value", [("critic_clock", True), ("rms_eps", 1e-5)])
def test_a_config_that_set_a_removed_option_is_refused_in_one_line(name, value):
    flat = {**TrainConfig().flat(), name: value}
    with pytest.raises(ConfigError) as err:
        from_dict(flat)
    assert f"{name}={value!r}" in str(err.value) and "\n" not in str(err.value)
