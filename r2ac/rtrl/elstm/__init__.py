"""The element-wise LSTM (eLSTM) and its exact RTRL, in one room.

    layer.py      the `ELSTM` module (rule "rtrl" | "bptt") and its one autograd function
    math.py       pure tensor math: the recurrence, its BPTT, the RTRL carry, the history term
    deferred.py   the in-place carry's bookkeeping (`CarriedBuffer`, `PendingCarry`)
    native/       the carry and history term as one C kernel (float32, CPU)
    gpu_carry.py  on CUDA, the carry by a candidate chosen by measurement
    gpu_triton.py its Triton kernel (imported only where triton is)

See docs/rules/rtrl.md.
"""

from r2ac.rtrl.elstm.layer import ELSTM
from r2ac.rtrl.elstm.math import ELSTMSensitivity, ELSTMState

__all__ = ["ELSTM", "ELSTMSensitivity", "ELSTMState"]
