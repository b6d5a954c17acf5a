"""Recurrent cores and their learning rules (pure math; knows nothing of RL).

Every core obeys one contract: ``initial_state(batch_size)`` and
``forward(x (T, B, D), state, reset (T, B) | None) -> (y (T, B, N), state)``.
"""

from r2ac.rtrl.elstm import ELSTM
from r2ac.rtrl.elstm_math import ELSTMSensitivity, ELSTMState

__all__ = ["ELSTM", "ELSTMSensitivity", "ELSTMState"]

from r2ac.rtrl.registry import CORES, core_names, make_core  # noqa: E402

__all__ += ["CORES", "core_names", "make_core"]
