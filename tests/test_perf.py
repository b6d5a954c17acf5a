"""r2ac.perf.peak_memory_mib, the one peak-memory reader: in a fresh process, the peak of a
call that allocates a tensor of known size rises by that size, and that of an empty call
does not; on CUDA the allocator's peak does the same."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from r2ac.bench.probe import run_fresh
from r2ac.perf import peak_memory_mib

MIB = 96


@dataclass(frozen=True)
class AllocRow:
    mib: int
    device: str
    with_tensor: float | None  # peak MiB of a call that allocates `mib` MiB and frees it
    empty: float | None  # peak MiB of a call that allocates nothing


def alloc_probe(mib: int, device: str) -> AllocRow:
    """Run in a fresh process by the tests below."""

    def allocate():
        t = torch.ones(mib * 2**20 // 4, device=device)  # float32; ones writes every page
        del t

    allocate()  # the first call loads the kernels and warms the allocators up
    empty = peak_memory_mib(lambda: None, device)  # on the same device as the tensor
    return AllocRow(mib, device, peak_memory_mib(allocate, device), empty)


def test_cpu_peak_rises_by_the_size_of_a_tensor_in_a_fresh_process():
    row = run_fresh(alloc_probe, AllocRow, mib=MIB, device="cpu")
    assert row.with_tensor is not None and row.empty is not None, "no /proc/self on this OS"
    assert MIB - 1 <= row.with_tensor <= MIB + 8, row
    assert row.empty <= 2, row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_rises_by_the_size_of_a_tensor():
    row = alloc_probe(MIB, "cuda")
    assert row.with_tensor == MIB and row.empty == 0, row
