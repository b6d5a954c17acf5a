"""Helpers shared by every core: input checks, reset masks, per-stream state indexing.

Every core state is a NamedTuple pytree whose tensor leaves are batch-first ``(B, ...)``
(leaves may be None). That single rule lets the RL runtime pick, stack and store the state of
individual env streams without knowing which core it is talking to. A sensitivity buffer with a
carry still pending (r2ac.rtrl.elstm.deferred) runs it when the helpers below flatten it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from r2ac.errors import ConfigError
from r2ac.flat import FlatTensors


def check_rule(rule: str, allowed: Sequence[str], core: str) -> str:
    if rule not in allowed:
        raise ConfigError(f"{core}: unknown rule {rule!r}; choose one of {', '.join(allowed)}")
    return rule


def check_segment(
    x: torch.Tensor, reset: torch.Tensor | None, input_size: int, ref: torch.Tensor, core: str
) -> tuple[int, int]:
    """Validate a segment input ``x: (T, B, D)`` and ``reset: (T, B)``; return (T, B)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{core}: x must be a (T, B, D={input_size}) tensor, got shape {got}")
    T, B, D = x.shape
    if D != input_size:
        raise ValueError(
            f"{core}: x has {D} features in its last dim, the layer expects {input_size}"
        )
    if T < 1 or B < 1:
        raise ValueError(
            f"{core}: x must have T >= 1 steps and B >= 1 streams, got {tuple(x.shape)}"
        )
    if x.dtype != ref.dtype:
        raise TypeError(f"{core}: x has dtype {x.dtype} but the parameters are {ref.dtype}")
    if x.device != ref.device:
        raise ValueError(f"{core}: x is on {x.device} but the parameters are on {ref.device}")
    if reset is not None:
        if not isinstance(reset, torch.Tensor) or tuple(reset.shape) != (T, B):
            got = tuple(reset.shape) if isinstance(reset, torch.Tensor) else type(reset).__name__
            raise ValueError(f"{core}: reset must be a (T={T}, B={B}) bool tensor, got {got}")
        if reset.dtype != torch.bool:
            raise TypeError(f"{core}: reset must have dtype torch.bool, got {reset.dtype}")
        if reset.device != x.device:
            raise ValueError(f"{core}: reset is on {reset.device} but x is on {x.device}")
    return T, B


def check_state_tensor(
    name: str, tensor: torch.Tensor, shape: tuple[int, ...], ref: torch.Tensor, core: str
) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{core}: state.{name} must be a tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{core}: state.{name} has shape {tuple(tensor.shape)}, expected {shape}")
    if tensor.dtype != ref.dtype:
        raise TypeError(f"{core}: state.{name} has dtype {tensor.dtype}, expected {ref.dtype}")
    if tensor.device != ref.device:
        raise ValueError(f"{core}: state.{name} is on {tensor.device}, expected {ref.device}")


def keep_mask(reset: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(T, B) bool reset -> (T, B, 1) float multiplier that zeroes the carried state, or None.

    None means "no reset anywhere in this segment", which lets cores skip the multiply.
    """
    if reset is None or not bool(reset.any()):
        return None
    return (~reset).to(dtype).unsqueeze(-1)


def cat_resets(
    resets: Sequence[torch.Tensor | None], xs: Sequence[torch.Tensor]
) -> torch.Tensor | None:
    """Reset masks (T_i, B) bool or None of consecutive calls on inputs xs (T_i, B, D) ->
    (sum T_i, B), a None part read as "no reset"; None if every part is None."""
    if all(r is None for r in resets):
        return None
    parts = [
        x.new_zeros(x.shape[:2], dtype=torch.bool) if r is None else r for r, x in zip(resets, xs)
    ]
    return torch.cat(parts)


def run_in_reset_chunks(
    x: torch.Tensor,
    reset: torch.Tensor | None,
    carried: tuple[torch.Tensor, ...],
    run: Callable[..., tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run a fused multi-step kernel over x (T, B, D) in chunks split at every step where some
    stream restarts, zeroing the restarting streams' carried tensors (B, ...) between chunks.

    `run(x_chunk, *carried) -> (y_chunk (t, B, N), *carried)`. Returns y (T, B, N) and the
    carried tensors after the last step (what the LSTM and GRU do with PyTorch's kernels).
    """
    T = x.shape[0]
    starts = [0] if reset is None else sorted({0, *torch.nonzero(reset.any(1)).flatten().tolist()})
    ys = []
    for start, end in zip(starts, starts[1:] + [T], strict=True):
        if reset is not None:
            keep = (~reset[start]).to(x.dtype)[:, None]  # (B, 1)
            carried = tuple(t * keep for t in carried)
        y, *carried = run(x[start:end], *carried)
        ys.append(y)
    return (ys[0] if len(ys) == 1 else torch.cat(ys)), tuple(carried)


def select_streams(state: Any, index: torch.Tensor | slice | int) -> Any:
    """The state of a subset of streams (indexing dim 0 of every leaf)."""
    return pytree.tree_map(lambda t: None if t is None else t[index], state)


def cat_streams(states: Sequence[Any]) -> Any:
    """Concatenate the states of several batches of streams along the batch dim."""
    leaves = [pytree.tree_flatten(s) for s in states]
    spec = leaves[0][1]
    columns = zip(*[leaf for leaf, _ in leaves])
    joined = [None if col[0] is None else cat_keeping_layout(col) for col in columns]
    return pytree.tree_unflatten(joined, spec)


def cat_keeping_layout(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.cat along dim 0, in the memory layout the parts share.

    torch.cat writes a row-major result, so parts stored in a permuted layout (the eLSTM's
    sensitivities FZ: (B, 2, N, D) views of (B, D, 2, N) blocks) would be transposed while
    copied (15x slower for 8 x 32 streams) and leave the kernels that want the layer's
    layout. Parts whose dims, ordered by stride, agree and start with dim 0 are joined in
    that order instead (one memcpy), and the result has their layout."""
    order = _layout_order(parts[0])
    if order is None or any(_layout_order(t) != order for t in parts[1:]):
        return torch.cat(parts, 0)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return torch.cat([t.permute(order) for t in parts], 0).permute(inverse)


def _layout_order(t: torch.Tensor) -> list[int] | None:
    """The permutation that makes `t` contiguous, if there is one with dim 0 outermost."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    if not order or order[0] != 0 or not t.permute(order).is_contiguous():
        return None
    return order


def write_state(out: Any, state: Any) -> Any:
    """Copy `state`'s tensors into `out`'s (a state of the same core and streams) and return
    `out`; `out` None returns `state`. Tensors already in place (the same memory and strides,
    as a carry that wrote into `out` leaves them) are not copied."""
    if out is None:
        return state
    targets, sources = pytree.tree_leaves(out), pytree.tree_leaves(state)
    shapes = [[None if t is None else tuple(t.shape) for t in ts] for ts in (targets, sources)]
    if shapes[0] != shapes[1]:
        raise ValueError(
            "write_state: `out` must be a state of the same core and streams; got tensors "
            f"{shapes[0]} for {shapes[1]}"
        )
    for target, source in zip(targets, sources, strict=True):
        if target is None:
            continue
        if target.data_ptr() != source.data_ptr() or target.stride() != source.stride():
            target.copy_(source)
    return out


def detach_state(state: Any) -> Any:
    return pytree.tree_map(lambda t: None if t is None else t.detach(), state)


def state_to(state: Any, device: torch.device | str) -> Any:
    return pytree.tree_map(lambda t: None if t is None else t.to(device), state)


# --- a core state as plain data (checkpoints) ---------------------------------------------------


def plain_state(state: Any) -> Any:
    """`state` as plain data for a file: a NamedTuple as a dict of its fields, a carried
    sensitivity (`FlatTensors`) as the list of its tensors, tensors and None as they are.
    No type is named: `state_from_plain` rebuilds the types from a state of the reader's."""
    if state is None or isinstance(state, torch.Tensor):
        return state
    if isinstance(state, FlatTensors):  # reading it runs a pending carry
        return list(state.tensors())
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return {name: plain_state(value) for name, value in zip(state._fields, state)}
    raise TypeError(f"a core state holds tensors, None and NamedTuples, not {type(state).__name__}")


def state_from_plain(saved: Any, like: Any, where: str = "state") -> Any:
    """The state `plain_state` wrote, with the types of `like` (a state of the same core that
    this process built): the reader knows the type, the file names none. ValueError naming
    the first field that does not fit (its shapes and dtypes are the caller's to check)."""
    if like is None or isinstance(like, torch.Tensor):
        want = "None" if like is None else "a tensor"
        if (saved is None) != (like is None) or not (saved is None or _is_tensor(saved)):
            raise ValueError(f"{where}: {_kind(saved)}, expected {want}")
        return saved
    if isinstance(like, FlatTensors):
        count = len(like.tensors())
        if not (isinstance(saved, list) and len(saved) == count and all(map(_is_tensor, saved))):
            raise ValueError(f"{where}: {_kind(saved)}, expected a list of {count} tensors")
        return type(like).from_tensors(*saved)
    fields = like._fields
    want = f"the fields ({', '.join(fields)})"
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: {_kind(saved)}, expected a dict of {want}")
    if set(saved) != set(fields):
        keys = ", ".join(repr(k)[:40] for k in list(saved)[:8])
        more = ", ..." if len(saved) > 8 else ""
        raise ValueError(f"{where}: a dict of the keys ({keys}{more}), expected {want}")
    values = zip(fields, like, strict=True)
    return type(like)(*(state_from_plain(saved[n], v, f"{where}.{n}") for n, v in values))


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a dict"
    return "None" if value is None else f"a {type(value).__name__}"
