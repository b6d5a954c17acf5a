"""Constants shared by the core tests."""

import torch

F64 = torch.float64
# Segment patterns: mixed lengths with per-step (T = 1) segments in between, all T = 1, one long.
PATTERNS = [(3, 1, 5, 1, 1, 7, 4), (1,) * 12, (2, 9, 1, 6)]
