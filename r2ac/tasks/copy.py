"""The copy task (SPEC.md section 4; the paper's Sec. 4.1 and Appendix B.1), honestly scored.

A sequence with pattern length k (uniform in 1..l) has 2k steps: k random bits, then k blanks
'#'. While reading the j-th blank (step k + j) the model must write bit j. Batches mix lengths,
so they are padded to the longest sequence; padded steps have an all-zero input and no target.

    step      0   1  ...  k-1 | k    k+1  ...  2k-1 | 2k ... (padding)
    input     b0  b1 ...  bk-1| #    #    ...  #    | 0 ...
    target    -   -  ...  -   | b0   b1   ...  bk-1 | -

Every output bit counts in the metric, whatever its value (the reference implementation maps
the target '1' to the index its loss and metric ignore, so an untrained model scores 100%
there). Here `bit_accuracy` of a model that has learnt nothing is about 0.5.

Model: one-hot input (D = 3) straight into an eLSTM core (whose output h = o * c already has
the output gate), then a linear readout over {0, 1} (as in the paper; `readout_hidden` > 0
puts one ReLU layer in between, a diagnostic of whether decoding or storage limits the core).
Training: Adam, global gradient-norm clipping, and one of two schedules (docs/tasks/copy.md):

- per sequence (`sequence_update`): the batch is run in chunks of `segment` steps with the
  state carried; every chunk that has outputs calls its own `loss.backward()` and .grad
  accumulates; one optimiser step at the end. Rule "rtrl" gives the exact gradient through
  the whole sequence whatever the chunk length; rule "bptt" truncates it at chunk starts
  (truncated BPTT; a chunk as long as the sequence is full BPTT).
- fully online (`online_update`, rule "rtrl" only): one step at a time, an optimiser step
  after every step that has an output, so the weights change during the sequence.
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from r2ac.errors import ConfigError
from r2ac.rl import checkpoint as rl_checkpoint
from r2ac.rtrl import ELSTM
from r2ac.rtrl.registry import CORES, make_core

SYMBOLS = ("0", "1", "#")  # input vocabulary, one-hot; padding is the all-zero vector
INPUT_SIZE = len(SYMBOLS)
BLANK = 2
RULES = ("bptt", "rtrl")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class CopyBatch(NamedTuple):
    """A padded batch of copy sequences (time-major, like the eLSTM contract)."""

    x: Tensor  # (T, B, 3) one-hot input, zeros at padded steps
    target: Tensor  # (T, B) int64 bit to write (0 where mask is False)
    mask: Tensor  # (T, B) bool, True at the output-phase steps (k <= t < 2k)
    pattern_len: Tensor  # (B,) int64, k; the sequence has 2k real steps


def make_batch(
    batch_size: int, max_len: int, generator: torch.Generator, min_len: int = 1
) -> CopyBatch:
    """Draw `batch_size` sequences with pattern lengths uniform in min_len..max_len (on CPU).

    Deterministic given the generator's state; T = 2 * (longest pattern in the batch).
    """
    if batch_size < 1 or not 1 <= min_len <= max_len:
        raise ValueError(
            f"make_batch: need batch_size >= 1 and 1 <= min_len <= max_len, "
            f"got {batch_size}, {min_len}, {max_len}"
        )
    k = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (B,)
    k_max = int(k.max())
    bits = torch.randint(0, 2, (k_max, batch_size), generator=generator)  # (K, B)
    t = torch.arange(2 * k_max)[:, None]  # (T, 1)
    reading = t < k  # (T, B)
    mask = (t >= k) & (t < 2 * k)
    read_idx = t.clamp(max=k_max - 1).expand(-1, batch_size)  # (T, B)
    symbol = torch.where(reading, bits.gather(0, read_idx), BLANK)
    x = nn.functional.one_hot(symbol, INPUT_SIZE).float()
    x = x * (t < 2 * k).unsqueeze(-1)  # zero the padding
    src = (t - k).clamp(0, k_max - 1)  # (T, B) index of the bit to write at step t
    target = bits.gather(0, src) * mask
    return CopyBatch(x, target, mask, k)


def make_test_set(max_len: int, size: int, seed: int, batch_size: int = 500) -> list[CopyBatch]:
    """A fixed held-out set of `size` sequences (lengths uniform in 1..max_len), in batches."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [min(batch_size, size - i) for i in range(0, size, batch_size)]
    return [make_batch(n, max_len, gen) for n in sizes]


def batch_to(
    batch: CopyBatch, device: torch.device | str, dtype: torch.dtype | None = None
) -> CopyBatch:
    """The batch on `device`, its one-hot input in `dtype` (the model's; None: unchanged)."""
    return CopyBatch(batch.x.to(device, dtype), *(v.to(device) for v in batch[1:]))


def _dtype_of(model: nn.Module) -> torch.dtype | None:
    first = next(model.parameters(), None)
    return None if first is None else first.dtype


class CopyModel(nn.Module):
    """One-hot input -> recurrent core (the eLSTM by default) -> Linear(N, 2) over {0, 1}.

    `core` names a family of r2ac.rtrl.registry (elstm, lstm, fwp, felstm, elman); the layer is
    `<core>-<rule>`. The other families are there as diagnostics against the eLSTM.
    `readout_hidden` > 0 makes the readout Linear(N, H) -> ReLU -> Linear(H, 2): it is outside
    the recurrence, so the core's gradient rule (and RTRL's exactness) is unchanged.
    """

    def __init__(
        self,
        hidden_size: int,
        rule: str = "rtrl",
        fused_step: bool = False,
        chrono_span: int | None = None,
        core: str = "elstm",
        readout_hidden: int = 0,
    ):
        super().__init__()
        extra = {"fused_step": True} if fused_step else {}  # an eLSTM option (CopyConfig checks)
        self.core = make_core(f"{core}-{rule}", INPUT_SIZE, hidden_size, **extra)
        self.readout = (
            nn.Sequential(
                nn.Linear(hidden_size, readout_hidden), nn.ReLU(), nn.Linear(readout_hidden, 2)
            )
            if readout_hidden
            else nn.Linear(hidden_size, 2)
        )
        if chrono_span is not None:
            chrono_forget_bias_(self.core, chrono_span)

    def initial_state(self, batch_size: int, with_sensitivities: bool | None = None):
        return self.core.initial_state(batch_size, with_sensitivities)

    def forward(self, x: Tensor, state):
        h, state = self.core(x, state)  # (T, B, N)
        return self.readout(h), state  # logits (T, B, 2)


@torch.no_grad()
def chrono_forget_bias_(core: ELSTM, span: int) -> None:
    """Spread the cells' memory time scales over 2..span steps (chrono init, Tallec & Ollivier 2018).

    b_f = log(u), u ~ U(1, span - 1): ignoring the F x and w_f c terms, f = u / (1 + u), so a cell keeps
    c for about 1 / (1 - f) = 1 + u steps. The layer's default, b_f = 1, gives every cell a
    memory of ~3.7 steps, far below the l..2l steps the copy task needs.
    """
    if span < 3:
        raise ValueError(f"chrono span must be >= 3, got {span}")
    core.b_f.uniform_(1.0, span - 1.0).log_()


def masked_ce_sum(logits: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Sum of the cross-entropy over the masked steps: logits (T, B, 2), target/mask (T, B)."""
    ce = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
    return (ce * mask.flatten()).sum()


def _count_correct(logits: Tensor, target: Tensor, mask: Tensor) -> int:
    return int(((logits.argmax(-1) == target) & mask).sum())


class UpdateStats(NamedTuple):
    loss: float  # mean cross-entropy per output bit of the batch
    bit_accuracy: float  # on the training batch (before/while updating)
    updates: int  # optimiser steps taken


def _clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, clip: float) -> None:
    if clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()


def sequence_update(
    model: CopyModel,
    optimizer: torch.optim.Optimizer,
    batch: CopyBatch,
    segment: int | None = None,
    clip: float = 1.0,
) -> UpdateStats:
    """One optimiser step on the batch's whole-sequence loss, processed in chunks of `segment`.

    Loss = cross-entropy summed over output bits / number of output bits in the batch. Each
    chunk with outputs backpropagates its share; chunks without outputs (the reading phase)
    run without autograd (rule "rtrl" still carries its sensitivities through them).
    """
    T, B = batch.mask.shape
    segment = T if segment is None else segment
    n_out = int(batch.mask.sum())
    optimizer.zero_grad(set_to_none=True)
    state = model.initial_state(B)
    total, correct = 0.0, 0
    for t0 in range(0, T, segment):
        x, target, mask = (v[t0 : t0 + segment] for v in batch[:3])
        if not bool(mask.any()):
            with torch.no_grad():
                _, state = model(x, state)
            continue
        logits, state = model(x, state)
        loss = masked_ce_sum(logits, target, mask) / n_out
        loss.backward()
        total += float(loss.detach())
        correct += _count_correct(logits.detach(), target, mask)
    _clip_and_step(model, optimizer, clip)
    return UpdateStats(total, correct / n_out, 1)


def online_update(
    model: CopyModel, optimizer: torch.optim.Optimizer, batch: CopyBatch, clip: float = 1.0
) -> UpdateStats:
    """Fully online RTRL: one step at a time, an optimiser step after every step with outputs.

    The loss of step t is the cross-entropy summed over the streams that write at t, divided
    by the batch size, so the step losses of a sequence add up to the per-sequence loss (sum
    over bits / B). The carried sensitivities were accumulated under earlier weights: RTRL's
    usual online approximation (docs/rules/rtrl.md, "Staleness").
    """
    if model.core.rule != "rtrl":
        raise ConfigError("online learning needs rule 'rtrl' (BPTT cannot update mid-sequence)")
    T, B = batch.mask.shape
    n_out = int(batch.mask.sum())
    state = model.initial_state(B)
    total, correct, updates = 0.0, 0, 0
    for t in range(T):
        x, target, mask = (v[t : t + 1] for v in batch[:3])
        if not bool(mask.any()):
            with torch.no_grad():
                _, state = model(x, state)
            continue
        optimizer.zero_grad(set_to_none=True)
        logits, state = model(x, state)
        loss_sum = masked_ce_sum(logits, target, mask)
        (loss_sum / B).backward()
        _clip_and_step(model, optimizer, clip)
        total += float(loss_sum.detach())
        correct += _count_correct(logits.detach(), target, mask)
        updates += 1
    return UpdateStats(total / n_out, correct / n_out, updates)


@torch.no_grad()
def evaluate(model: CopyModel, test_set: Iterable[CopyBatch], device="cpu") -> dict[str, float]:
    """Accuracy over every output bit of the test set (0s and 1s alike), and per sequence.

    Returns bit_accuracy, sequence_accuracy, bit_accuracy_zeros / _ones (the two target
    values separately), sequence_accuracy_longest (patterns longer than 3/4 of the longest
    in the set), loss (cross-entropy per output bit), n_sequences and n_bits.
    """
    bits = right = seqs = seqs_right = 0
    by_value = {0: [0, 0], 1: [0, 0]}
    long_right = long_n = 0
    loss = 0.0
    batches = [batch_to(b, device, _dtype_of(model)) for b in test_set]
    k_max = max(int(b.pattern_len.max()) for b in batches)
    for batch in batches:
        B = batch.mask.shape[1]
        logits, _ = model(batch.x, model.initial_state(B, with_sensitivities=False))
        ok = (logits.argmax(-1) == batch.target) | ~batch.mask  # (T, B)
        loss += float(masked_ce_sum(logits, batch.target, batch.mask))
        bits += int(batch.mask.sum())
        right += int((ok & batch.mask).sum())
        for v in (0, 1):
            sel = batch.mask & (batch.target == v)
            by_value[v][0] += int(sel.sum())
            by_value[v][1] += int((ok & sel).sum())
        seq_ok = ok.all(0)  # (B,)
        seqs += B
        seqs_right += int(seq_ok.sum())
        longest = batch.pattern_len * 4 > 3 * k_max
        long_n += int(longest.sum())
        long_right += int((seq_ok & longest).sum())
    return {
        "bit_accuracy": right / bits,
        "sequence_accuracy": seqs_right / seqs,
        "bit_accuracy_zeros": by_value[0][1] / max(by_value[0][0], 1),
        "bit_accuracy_ones": by_value[1][1] / max(by_value[1][0], 1),
        "sequence_accuracy_longest": long_right / max(long_n, 1),
        "loss": loss / bits,
        "n_sequences": seqs,
        "n_bits": bits,
    }


@torch.no_grad()
def sequence_accuracy_by_length(
    model: CopyModel, test_set: Iterable[CopyBatch], device="cpu"
) -> dict[int, float]:
    """Fraction of test sequences with every output bit right, per pattern length k."""
    right: dict[int, list[int]] = {}
    for batch in (batch_to(b, device, _dtype_of(model)) for b in test_set):
        logits, _ = model(
            batch.x, model.initial_state(batch.mask.shape[1], with_sensitivities=False)
        )
        seq_ok = ((logits.argmax(-1) == batch.target) | ~batch.mask).all(0)  # (B,)
        for k, ok in zip(batch.pattern_len.tolist(), seq_ok.tolist()):
            right.setdefault(k, []).append(ok)
    return {k: sum(v) / len(v) for k, v in sorted(right.items())}


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
    """Continue from DIR/checkpoint.pt (saved at every evaluation) up to --train-steps in total."""
    dtype: str = "float32"
    """float32, or float64 as a diagnostic (does float32 precision limit what the core holds?)."""
    fused_step: bool = False
    """Online mode: run the per-step RTRL carry as a torch.compile'd kernel."""
    threads: int = 0
    """torch threads (0: torch's default)."""
    device: str = "cpu"
    """cpu or cuda."""
    out: str = "runs/copy"
    """Output directory: config.json, results.json, curve.csv, curve.png."""

    def validate(self) -> CopyConfig:
        """Raise ConfigError on a bad value; return self."""
        if self.length < 1:
            raise ConfigError(f"--length must be >= 1, got {self.length}")
        if self.rule not in RULES:
            raise ConfigError(f"unknown --rule {self.rule!r}; choose one of {', '.join(RULES)}")
        if f"{self.core}-{self.rule}" not in CORES:
            known = ", ".join(name for name in sorted(CORES) if name.rsplit("-", 1)[1] in RULES)
            raise ConfigError(f"no core {self.core}-{self.rule}; --core/--rule pairs: {known}")
        if self.core != "elstm" and (self.chrono_init or self.fused_step):
            raise ConfigError("--chrono-init and --fused-step apply to the eLSTM core only")
        for name in ("hidden", "batch_size", "test_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
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


CURVE_FIELDS = (
    "step",
    "updates",
    "seconds",
    "train_loss",
    "train_bit_accuracy",
    "test_loss",
    "test_bit_accuracy",
    "test_sequence_accuracy",
)


@dataclass
class RunResult:
    curve: list[dict[str, float]]
    final: dict[str, float]
    steps: int
    updates: int
    train_seconds: float
    solved_at_step: int | None


def build_model(cfg: CopyConfig) -> CopyModel:
    torch.manual_seed(cfg.seed)
    span = max(2 * cfg.length, 3) if cfg.chrono_init else None
    return CopyModel(cfg.hidden, cfg.rule, cfg.fused_step, span, cfg.core, cfg.readout_hidden).to(
        cfg.device, DTYPES[cfg.dtype]
    )


def update(cfg: CopyConfig, model: CopyModel, optimizer, batch: CopyBatch) -> UpdateStats:
    """One training batch under the schedule of `cfg` (online or per sequence)."""
    if cfg.online:
        return online_update(model, optimizer, batch, cfg.clip)
    return sequence_update(model, optimizer, batch, cfg.segment, cfg.clip)


@dataclass
class _Progress:
    curve: list[dict[str, float]]
    step: int = 0
    updates: int = 0
    seconds: float = 0.0
    solved: int | None = None


# Options a resumed run may change: how long and how fast it trains, and where it runs. Every
# other option defines the model, its gradient, the data stream or the test set, so changing
# it would splice two different experiments into one curve.
RESUMABLE_CHANGES = frozenset(
    {
        "train_steps",
        "lr",
        "lr_final",
        "clip",
        "eval_every",
        "stop_when_solved",
        "resume",
        "fused_step",
        "threads",
        "device",
        "out",
    }
)


def resume_mismatch(saved: dict, cfg: CopyConfig) -> list[str]:
    """The options of `cfg` that differ from the checkpoint's config `saved` and may not.

    An option missing from `saved` (a checkpoint written before it existed) must be at its
    default value.
    """
    defaults = asdict(CopyConfig())
    return [
        f"--{name.replace('_', '-')} {saved.get(name, defaults[name])!r} -> {value!r}"
        for name, value in asdict(cfg).items()
        if name not in RESUMABLE_CHANGES and saved.get(name, defaults[name]) != value
    ]


def checkpoint_config(path: str) -> dict | None:
    """The config dict stored in a copy-task checkpoint (None if it predates storing it)."""
    try:
        saved = rl_checkpoint.load(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: not a copy-task checkpoint")
    return saved.get("config")


def check_resumable(saved: dict | None, cfg: CopyConfig, path: str) -> None:
    """Raise ConfigError if a checkpoint (at `path`, with config `saved`) cannot be continued
    under `cfg`. A checkpoint without a config predates storing it: only loading can tell."""
    bad = resume_mismatch(saved, cfg) if saved is not None else []
    if bad:
        raise ConfigError(
            f"--resume: {path} was trained with other options ({'; '.join(bad)}); "
            "use the same options or another --out"
        )


def _save(
    path: str, cfg: CopyConfig, model, optimizer, gen: torch.Generator, progress: _Progress
) -> None:
    state = {
        "config": asdict(cfg),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "generator": gen.get_state(),
        "progress": asdict(progress),
    }
    rl_checkpoint.save_atomic(state, path)  # fsynced, checksummed, atomic


def _load(path: str, cfg: CopyConfig, model, optimizer, gen: torch.Generator, device) -> _Progress:
    ck = rl_checkpoint.load(path, map_location=device)  # weights-only, checksum checked
    if not isinstance(ck, dict) or not {"model", "optimizer", "generator", "progress"} <= set(ck):
        raise ConfigError(f"{path}: not a copy-task checkpoint")
    check_resumable(ck.get("config"), cfg, path)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as exc:  # a checkpoint from before the config was stored in it
        raise ConfigError(f"--resume: {path} holds another model: {exc}") from exc
    optimizer.load_state_dict(ck["optimizer"])
    gen.set_state(ck["generator"])
    return _Progress(**ck["progress"])


def train(
    cfg: CopyConfig,
    on_batch: Callable[[int, UpdateStats], None] | None = None,
    on_eval: Callable[[dict[str, float]], None] | None = None,
    checkpoint: str | None = None,
) -> tuple[CopyModel, RunResult]:
    """Train per `cfg`, evaluating on the fixed test set every `eval_every` batches.

    `seconds` in the curve counts training time only (evaluation excluded). With `checkpoint`
    (a path) the run is saved there at every evaluation, and with `cfg.resume` it continues
    from it when the file exists (same model, optimiser and data stream).
    """
    cfg.validate()
    model = build_model(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    test_set = make_test_set(cfg.length, cfg.test_size, cfg.test_seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    run = _Progress([])
    if cfg.resume and checkpoint and os.path.exists(checkpoint):
        run = _load(checkpoint, cfg, model, optimizer, gen, cfg.device)
    window: list[UpdateStats] = []

    def record() -> dict[str, float]:
        ev = evaluate(model, test_set, cfg.device)
        row = {
            "step": run.step,
            "updates": run.updates,
            "seconds": round(run.seconds, 3),
            "train_loss": _mean(s.loss for s in window),
            "train_bit_accuracy": _mean(s.bit_accuracy for s in window),
            "test_loss": ev["loss"],
            "test_bit_accuracy": ev["bit_accuracy"],
            "test_sequence_accuracy": ev["sequence_accuracy"],
        }
        window.clear()
        run.curve.append(row)
        if on_eval:
            on_eval(row)
        return ev

    final = record() if not run.curve else {}
    while run.step < cfg.train_steps and not (run.solved is not None and cfg.stop_when_solved):
        batch = batch_to(make_batch(cfg.batch_size, cfg.length, gen), cfg.device, DTYPES[cfg.dtype])
        for group in optimizer.param_groups:
            group["lr"] = cfg.learning_rate(run.step)
        t0 = time.perf_counter()
        stats = update(cfg, model, optimizer, batch)
        run.seconds += time.perf_counter() - t0
        run.step += 1
        run.updates += stats.updates
        window.append(stats)
        if on_batch:
            on_batch(run.step, stats)
        if run.step % cfg.eval_every == 0 or run.step == cfg.train_steps:
            final = record()
            if final["sequence_accuracy"] == 1.0 and run.solved is None:
                run.solved = run.step
            if checkpoint:
                _save(checkpoint, cfg, model, optimizer, gen, run)
    if not final:  # resumed a run that had already reached its budget
        final = evaluate(model, test_set, cfg.device)
    return model, RunResult(run.curve, final, run.step, run.updates, run.seconds, run.solved)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def write_curve_csv(curve: list[dict[str, float]], path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CURVE_FIELDS)
        writer.writeheader()
        writer.writerows(curve)


def read_curve_csv(path) -> list[dict[str, float]]:
    with open(path, newline="") as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def plot_curves(runs: list[tuple[str, list[dict[str, float]]]], path, title: str = "") -> None:
    """Test bit and sequence accuracy against training batches, one line pair per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for label, curve in runs:
        steps = [r["step"] for r in curve]
        for ax, key in zip(axes, ("test_bit_accuracy", "test_sequence_accuracy")):
            ax.plot(steps, [r[key] for r in curve], label=label)
    for ax, name in zip(axes, ("test bit accuracy (every output bit)", "test sequence accuracy")):
        ax.set_xlabel("training batches")
        ax.set_title(name)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.5, color="grey", lw=0.8, ls=":")
    axes[1].legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
