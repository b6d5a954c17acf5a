"""Recurrent cores and their learning rules (pure math; knows nothing of RL).

Every core subclasses `RecurrentCore` (r2ac/rtrl/core.py): ``initial_state(batch_size)`` and
``forward(x (T, B, D), state, reset (T, B) | None, carry=True) -> (y (T, B, N), state)``.
"""

from r2ac.rtrl.core import RecurrentCore
from r2ac.rtrl.elman import Elman, ElmanState
from r2ac.rtrl.elstm.deferred import ConsumedStateError
from r2ac.rtrl.elstm.layer import ELSTM
from r2ac.rtrl.elstm.math import ELSTMSensitivity, ELSTMState
from r2ac.rtrl.felstm import FeLSTM, FeLSTMSensitivity, FeLSTMState
from r2ac.rtrl.fwp import FWP, FWPSensitivity, FWPState
from r2ac.rtrl.gru import GRU, GRUState
from r2ac.rtrl.lru import LRU, LRUState
from r2ac.rtrl.lstm import LSTM, LSTMState
from r2ac.rtrl.mingru import MinGRU, MinGRUSensitivity, MinGRUState
from r2ac.rtrl.pair_math import PairSensitivity
from r2ac.rtrl.rtu import RTU, RTUState

__all__ = [
    "ConsumedStateError",
    "RecurrentCore",
    "ELSTM",
    "ELSTMSensitivity",
    "ELSTMState",
    "Elman",
    "ElmanState",
    "FWP",
    "FWPSensitivity",
    "FWPState",
    "FeLSTM",
    "GRU",
    "GRUState",
    "FeLSTMSensitivity",
    "FeLSTMState",
    "LSTM",
    "LSTMState",
]
__all__ += ["LRU", "LRUState", "PairSensitivity", "RTU", "RTUState"]
__all__ += ["MinGRU", "MinGRUSensitivity", "MinGRUState"]

from r2ac.rtrl.registry import CORES, core_names, make_core  # noqa: E402

__all__ += ["CORES", "core_names", "make_core"]
