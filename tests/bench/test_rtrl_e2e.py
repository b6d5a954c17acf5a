"""`r2ac bench rtrl-e2e`: the bootstrap interval of the end-to-end rtrl/bptt ratio, and a short
run on the CPU."""

from __future__ import annotations

import random
import re
import statistics

import pytest

from r2ac.bench import rtrl_e2e


def test_the_bootstrap_interval_holds_the_ratio_of_medians_and_narrows_with_more_pairs():
    rng = random.Random(3)
    bptt = [150 + rng.gauss(0, 8) for _ in range(400)]
    rtrl = [t / 0.9 + rng.gauss(0, 8) for t in bptt]  # the true ratio 0.9, noisy pairs
    low, high = rtrl_e2e.bootstrap_ratio(bptt, rtrl)
    ratio = statistics.median(bptt) / statistics.median(rtrl)
    assert low < ratio < high and low < 0.9 < high
    few_low, few_high = rtrl_e2e.bootstrap_ratio(bptt[:40], rtrl[:40])
    assert few_high - few_low > 2 * (high - low)  # ~sqrt(10) x wider with 10x fewer pairs
    assert rtrl_e2e.bootstrap_ratio([100.0] * 5, [125.0] * 5) == (0.8, 0.8)


def test_a_short_run_prints_the_ratio(capsys):
    pytest.importorskip("popgym")
    assert rtrl_e2e.main(["11", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    ratio = re.search(r"rtrl/bptt frames/s .*: collect \+ update ([\d.]+)", out)
    assert ratio and 0.2 < float(ratio.group(1)) < 5, out
    assert rtrl_e2e.main(["5"]) == 2  # no more iterations than the warm-up
