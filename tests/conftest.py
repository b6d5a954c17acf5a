"""Test-wide settings.

Tests use small tensors, where a second intra-op thread only adds synchronisation (and, on a
loaded 2-core machine, stalls of milliseconds per op). One thread keeps the suite fast and
its timing stable; benchmarks set their own thread counts.
"""

import torch

torch.set_num_threads(1)
