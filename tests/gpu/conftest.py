"""GPU tests compare against the CPU in full precision: no tf32 in matrix products or
convolutions, and each test starts with no GPU carry selected (r2ac.rtrl.elstm.gpu_carry)."""

import pytest
import torch

from r2ac.rtrl.elstm import gpu_carry


@pytest.fixture(autouse=True)
def _full_precision_and_fresh_selection(monkeypatch):
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    monkeypatch.delenv(gpu_carry.ENV, raising=False)
    gpu_carry.reset()
    yield
    gpu_carry.reset()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
