"""`r2ac bench cost --device cuda` measures each update's peak memory in its own process (the
allocator's peak), with no fresh process per core: every row gets a positive peak, RTRL's
carried state above TBPTT's, within one call."""

from __future__ import annotations

import dataclasses
import time

from r2ac.bench import cost

from .common import needs_cuda

pytestmark = needs_cuda

TINY = cost.CostConfig(
    spans=(4,), hidden_size=64, batch_size=4, input_size=9, repeats=1, warmup=0, device="cuda"
)


def test_cost_rows_on_cuda_have_peak_memory_measured_in_process():
    start = time.perf_counter()
    rows = {r.core: r for r in cost.measure(TINY)}
    assert time.perf_counter() - start < 60  # fresh processes would each start CUDA anew
    assert set(rows) == set(TINY.cores)
    assert all(r.peak_mb is not None and r.peak_mb > 0 for r in rows.values())
    assert rows["elstm-rtrl"].state_mb > rows["elstm-bptt"].state_mb
    without = cost.measure(dataclasses.replace(TINY, memory=False))
    assert all(r.peak_mb is None for r in without)
