"""What the `gpu` tests share: the skip without CUDA, the relative error, moving trees."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

CUDA = torch.cuda.is_available()
NO_CUDA = (
    f"needs a CUDA device (torch {torch.__version__} sees none); "
    "run `pytest -m gpu` on a GPU machine (scripts/gpu_check.sh runs them with the GPU benchmarks)"
)
# Every module here: marked `gpu` (out of the default run and CI), skipped without CUDA.
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=NO_CUDA)]

F32, F64 = torch.float32, torch.float64
# ||cuda - cpu|| / ||cpu|| per tensor. float32: different summation orders (cuBLAS vs the
# CPU's BLAS, reductions) over a few segments stay near 1e-6; 1e-4 leaves room for the
# sensitivities' growth over segments and matches the contract suite's float32 bound.
TOLERANCE = {F64: 1e-10, F32: 1e-4}


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| (on the CPU); the difference's norm where want is zero."""
    got, want = got.detach().cpu(), want.detach().cpu()
    diff, norm = float((got - want).norm()), float(want.norm())
    return diff / norm if norm > 0 else diff


def tensor_leaves(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def to_device(tree, device):
    """Every tensor of a nested structure (a Segment and its core state included) on device."""
    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)
