"""The options of `r2ac copy` (CopyConfig), their checks, and the learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from r2ac.errors import ConfigError
from r2ac.rtrl.registry import CORES

RULES = ("bptt", "rtrl")
MAX_TRAIN_STEPS = 10**9  # batches of one run (a checkpoint's counters are checked against it)
MAX_LR = 10.0  # Adam moves each weight by up to lr a step: past this, any run diverges
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class CopyConfig:
    """Options of `r2ac copy` (the copy task, trained and evaluated)."""

    length: int = 50
    """l: the longest pattern; pattern lengths are uniform in 1..l, sequences 2..2l steps."""
    rule: str = "rtrl"
    """Gradient rule of the core: rtrl (exact, untruncated) or bptt (truncated at chunk starts)."""
    core: str = "elstm"
    """Core family (r2ac.rtrl.registry): elstm, or as a diagnostic lstm (bptt only), fwp, felstm
    (bptt; snap1 is approximate), elman. The layer is <core>-<rule>."""
    hidden: int = 256
    """N: hidden units of the core."""
    readout_hidden: int = 0
    """0: linear readout of the core's output (the paper's model). H > 0: a diagnostic readout
    Linear(N, H) -> ReLU -> Linear(H, 2), outside the recurrence."""
    batch_size: int = 64
    """Sequences per batch."""
    lr: float = 3e-3
    """Adam learning rate."""
    lr_final: float | None = None
    """Decay the learning rate linearly from --lr to this over --train-steps (None: constant)."""
    train_steps: int = 3000
    """Training batches (0: evaluate the untrained model). Online mode steps many times per batch."""
    segment: int | None = None
    """Chunk length: the sequence is processed in chunks of this many steps, state carried.
    None: the whole sequence at once (full BPTT for rule bptt)."""
    online: bool = False
    """Fully online RTRL: an optimiser step after every step with an output (rule rtrl, segment 1)."""
    clip: float = 1.0
    """Global gradient-norm clipping (0 disables)."""
    seed: int = 0
    """Seed of the initialisation and of the training sequences."""
    test_size: int = 1000
    """Sequences in the held-out test set."""
    test_seed: int = 987654321
    """Seed of the test set (fixed, so that every run is scored on the same sequences)."""
    eval_every: int = 100
    """Evaluate on the test set every this many batches (and at the start and the end)."""
    stop_when_solved: bool = True
    """Stop early once the test sequence accuracy reaches 100%."""
    chrono_init: bool = False
    """Spread the forget-gate biases over memory time scales 2..2l (chrono init) instead of b_f = 1."""
    resume: bool = False
    """Continue from DIR/checkpoint.pt (saved at every evaluation and on Ctrl-C) up to
    --train-steps in total."""
    dtype: str = "float32"
    """float32, or float64 as a diagnostic (does float32 precision limit what the core holds?)."""
    fused_step: bool = False
    """Online mode: run the per-step RTRL carry as a torch.compile'd kernel."""
    threads: int = 0
    """torch threads (0: torch's default)."""
    device: str = "cpu"
    """cpu or cuda."""
    out: str = "runs/copy"
    """Output directory: config.json, results.json, curve.csv, curve.png, checkpoint.pt."""

    def validate(self) -> CopyConfig:
        """Raise ConfigError on a bad value; return self."""
        if self.length < 1:
            raise ConfigError(f"--length must be >= 1, got {self.length}")
        self._validate_core()
        for name in ("hidden", "batch_size", "test_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if self.train_steps > MAX_TRAIN_STEPS:
            raise ConfigError(
                f"--train-steps must be <= {MAX_TRAIN_STEPS:,}, got {self.train_steps:,}"
            )
        for name in ("train_steps", "readout_hidden"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        self._validate_schedule()
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        self._validate_device_and_clip()
        return self

    def _validate_core(self) -> None:
        if self.rule not in RULES:
            raise ConfigError(f"unknown --rule {self.rule!r}; choose one of {', '.join(RULES)}")
        if f"{self.core}-{self.rule}" not in CORES:
            known = ", ".join(n for n in sorted(CORES) if CORES[n].rule in RULES)
            raise ConfigError(f"no core {self.core}-{self.rule}; --core/--rule pairs: {known}")
        if self.core != "elstm" and (self.chrono_init or self.fused_step):
            raise ConfigError("--chrono-init and --fused-step apply to the eLSTM core only")

    def _validate_device_and_clip(self) -> None:
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.device != "cpu" and not torch.cuda.is_available():
            raise ConfigError(f"--device {self.device}: this PyTorch build sees no CUDA device")
        if not (math.isfinite(self.clip) and self.clip >= 0):
            raise ConfigError(f"--clip must be finite and >= 0 (0: no clipping), got {self.clip}")

    def _validate_schedule(self) -> None:
        for name, value, low in (("lr", self.lr, 1e-300), ("lr-final", self.lr_final, 0.0)):
            if value is not None and not (value >= low and math.isfinite(value)):
                raise ConfigError(
                    f"--{name} must be a finite number {'> 0' if low else '>= 0'}, got {value}"
                )
            if value is not None and value > MAX_LR:
                raise ConfigError(
                    f"--{name} {value:g} is above {MAX_LR:g}: Adam's steps would be that large "
                    "and the weights diverge"
                )
        for name in ("seed", "test_seed"):
            value = getattr(self, name)
            if not 0 <= value < 2**63:
                raise ConfigError(f"--{name.replace('_', '-')} must be in 0..2**63-1, got {value}")
        if self.clip < 0 or self.threads < 0:
            raise ConfigError("--clip and --threads must be >= 0")
        if self.segment is not None and self.segment < 1:
            raise ConfigError(f"--segment must be >= 1, got {self.segment}")
        if self.online and self.rule != "rtrl":
            raise ConfigError(
                "--online needs --rule rtrl: only RTRL can update during the sequence"
            )
        if self.online and self.segment not in (None, 1):
            raise ConfigError(
                "--online processes one step at a time; drop --segment (or set it to 1)"
            )

    def learning_rate(self, step: int) -> float:
        """The learning rate of batch `step` + 1 (0-based step count)."""
        if self.lr_final is None or self.train_steps == 0:
            return self.lr
        return self.lr + (self.lr_final - self.lr) * min(step / self.train_steps, 1.0)

    @property
    def schedule(self) -> str:
        if self.online:
            return "online"
        return "sequence" if self.segment is None else f"chunks of {self.segment}"
