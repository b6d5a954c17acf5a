"""scripts/rtrl_cost_in_process.py's bootstrap interval of the end-to-end rtrl/bptt ratio."""

from __future__ import annotations

import random
import statistics

from .scripts import load_script


def _script():
    return load_script("rtrl_cost_in_process")


def test_the_bootstrap_interval_holds_the_ratio_of_medians_and_narrows_with_more_pairs():
    script = _script()
    rng = random.Random(3)
    bptt = [150 + rng.gauss(0, 8) for _ in range(400)]
    rtrl = [t / 0.9 + rng.gauss(0, 8) for t in bptt]  # the true ratio 0.9, noisy pairs
    low, high = script.bootstrap_ratio(bptt, rtrl)
    ratio = statistics.median(bptt) / statistics.median(rtrl)
    assert low < ratio < high and low < 0.9 < high
    few_low, few_high = script.bootstrap_ratio(bptt[:40], rtrl[:40])
    assert few_high - few_low > 2 * (high - low)  # ~sqrt(10) x wider with 10x fewer pairs
    assert script.bootstrap_ratio([100.0] * 5, [125.0] * 5) == (0.8, 0.8)
