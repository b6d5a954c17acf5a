"""The copy task (docs/design.md, "The copy task"; the paper's Sec. 4.1 and Appendix B.1), honestly scored.

A sequence with pattern length k (uniform in 1..l) has 2k steps: k random bits, then k blanks
'#'. While reading the j-th blank (step k + j) the model must write bit j:

    step      0   1  ...  k-1 | k    k+1  ...  2k-1 | 2k ... (padding)
    input     b0  b1 ...  bk-1| #    #    ...  #    | 0 ...
    target    -   -  ...  -   | b0   b1   ...  bk-1 | -

One module per job, each importing only those above it:

    data.py       the generator: padded, masked batches and the fixed test set
    config.py     CopyConfig: the options of `r2ac copy` and their checks
    model.py      CopyModel: one-hot input -> core of r2ac.rtrl -> readout over {0, 1}
    metrics.py    the loss and the honest metric (every output bit counts)
    schedules.py  per-sequence (chunked) and fully online updates
    resume.py     the checkpoint: Progress, which options a resume may change, save / load
    training.py   the loop: batches, evaluations, checkpoints, a clean stop on Ctrl-C
    curve.py      curve.csv (atomic) and the plot of the learning curve

`r2ac/tasks/copy_cli.py` is the command (`r2ac copy`). The names below are the package's
public API, so that `from r2ac.tasks import copy as ct; ct.train(...)` works.
"""

from r2ac.tasks.copy.config import DTYPES, RULES, CopyConfig
from r2ac.tasks.copy.curve import CURVE_FIELDS, plot_curves, read_curve_csv, write_curve_csv
from r2ac.tasks.copy.data import (
    BLANK,
    INPUT_SIZE,
    SYMBOLS,
    CopyBatch,
    batch_to,
    make_batch,
    make_test_set,
)
from r2ac.tasks.copy.metrics import (
    evaluate,
    longest_all_right,
    masked_ce_sum,
    sequence_accuracy_by_length,
)
from r2ac.tasks.copy.model import CopyModel, build_model, chrono_forget_bias_
from r2ac.tasks.copy.resume import (
    CHECKPOINT_NAME,
    RESUMABLE_CHANGES,
    Progress,
    check_resumable,
    checkpoint_config,
    resume_mismatch,
)
from r2ac.tasks.copy.schedules import UpdateStats, online_update, sequence_update, update
from r2ac.tasks.copy.training import RunResult, Trainer, train

__all__ = [
    "BLANK",
    "CHECKPOINT_NAME",
    "CURVE_FIELDS",
    "DTYPES",
    "INPUT_SIZE",
    "RESUMABLE_CHANGES",
    "RULES",
    "SYMBOLS",
    "CopyBatch",
    "CopyConfig",
    "CopyModel",
    "Progress",
    "RunResult",
    "Trainer",
    "UpdateStats",
    "batch_to",
    "build_model",
    "check_resumable",
    "checkpoint_config",
    "chrono_forget_bias_",
    "evaluate",
    "longest_all_right",
    "make_batch",
    "make_test_set",
    "masked_ce_sum",
    "online_update",
    "plot_curves",
    "read_curve_csv",
    "resume_mismatch",
    "sequence_accuracy_by_length",
    "sequence_update",
    "train",
    "update",
    "write_curve_csv",
]
