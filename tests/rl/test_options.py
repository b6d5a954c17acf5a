"""`r2ac train`'s options: at most 50 a user reads before the studies' section, and configs
of runs written before an option moved or went still load."""

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


def test_at_most_50_options_outside_the_studies_and_streaming_sections():
    sections = _flags_by_section()
    assert {"study options", "stream options"} <= set(sections)
    main = set().union(
        *(v for k, v in sections.items() if k not in ("study options", "stream options"))
    )
    assert 40 <= len(main) <= 50, sorted(main)
    assert "--decorrelate-steps" in sections["study options"] and "--core" in main
    removed = {"--" + name.replace("_", "-") for name in REMOVED_OPTIONS}
    assert not removed & set().union(*sections.values())


def test_a_config_from_before_the_study_group_and_the_removals_loads():
    data = to_dict(TrainConfig.make(decorrelate_steps=3, progress=False))
    old = {g: dict(v) for g, v in data.items() if g != "study"}
    old["env"]["decorrelate_steps"] = 3  # where the field lived before
    old["run"]["progress"] = False
    old["model"].update(critic_clock=False, policy_init_scale=1.0)  # removed, at defaults
    old["optim"].update(rms_alpha=0.99, rms_eps=0.01, core_lr_scale=1.0)
    cfg = from_dict(old)
    assert cfg.study.decorrelate_steps == 3 and cfg.study.progress is False


@pytest.mark.parametrize("name, value", [("critic_clock", True), ("rms_eps", 1e-5)])
def test_a_config_that_set_a_removed_option_is_refused_in_one_line(name, value):
    flat = {**TrainConfig().flat(), name: value}
    with pytest.raises(ConfigError) as err:
        from_dict(flat)
    assert f"{name}={value!r}" in str(err.value) and "\n" not in str(err.value)
