"""r2ac.rl.runtimes.wire: segments (with the eLSTM's sensitivities) as plain trees of numpy arrays
and back, without copies, in the dims order the actor had; no class crosses, an unknown kind is
refused."""

from __future__ import annotations

import pickle
import pickletools

import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.rl.learning.actor import Actor, Segment
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.runtimes import wire
from r2ac.rtrl.elstm.deferred import CarriedBuffer
from r2ac.rtrl.registry import core_names

from .rl_helpers import tiny


def _segment(core: str = "elstm-rtrl") -> Segment:
    cfg = tiny(core=core, env_options=("delay=8",))
    torch.manual_seed(0)
    env = make_env(cfg, 3, seed=1)
    actor = Actor(agent_for_env(cfg, env), env, seed=1, unroll_length=cfg.runtime.unroll_length)
    actor.collect()
    seg, _ = actor.collect()  # the second: its start state carries sensitivities
    return seg


def test_pack_unpack_round_trip_keeps_values_types_layout_and_memory():
    seg = _segment()
    sens = seg.state.sens
    assert isinstance(sens, CarriedBuffer) and not sens.FZ.is_contiguous()  # a permuted view
    assert float(sens.FZ.abs().sum()) > 0
    packed = wire.pack(seg)
    assert len(wire.arrays(packed)) == len(pytree.tree_leaves(seg))
    back = wire.unpack(packed)
    assert type(back) is Segment and type(back.state) is type(seg.state)
    assert type(back.state.sens) is type(sens)
    for a, b in zip(pytree.tree_leaves(seg), pytree.tree_leaves(back)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)
    # no copy on either side: the unpacked sensitivities are the actor's memory
    assert back.state.sens.FZ.data_ptr() == sens.FZ.data_ptr()
    B, N, D = 3, 8, 6 + 1  # streams, hidden size, core input (stem features + last reward)
    sens_packed = wire.field(wire.field(packed, "state"), "sens")
    assert wire.nbytes(sens_packed) == (2 * B * N * D + 4 * B * N) * 4  # FZ and wb
    leaves = pytree.tree_leaves(seg)
    assert wire.nbytes(packed) == sum(t.numel() * t.element_size() for t in leaves)


def test_every_array_travels_out_of_band():
    """Pickle protocol 5 (what Ray uses) hands each array over as a buffer, not as bytes in
    the stream: the object store can map them instead of copying."""
    packed = wire.pack(_segment())
    buffers = []
    data = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(wire.arrays(packed)) == 13  # 10 segment fields, c, FZ, wb
    assert len(data) < 4096  # the tree, not the arrays
    back = wire.unpack(pickle.loads(data, buffers=buffers))
    assert torch.equal(back.state.sens.FZ, wire.unpack(packed).state.sens.FZ)


def test_light_and_none_states_pass_through():
    seg = _segment("elstm-bptt")
    assert seg.state.sens is None
    back = wire.unpack(wire.pack(seg))
    assert back.state.sens is None and torch.equal(back.state.c, seg.state.c)


def _globals_pickled(data: bytes) -> set[str]:
    """The names a pickle would import (GLOBAL / STACK_GLOBAL operands)."""
    ops, names, strings = list(pickletools.genops(data)), set(), []
    for op, arg, _ in ops:
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "GLOBAL":
            names.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.add(".".join(strings[-2:]))
    return names


@pytest.mark.parametrize("core", core_names(include_memoryless=True))
def test_every_core_s_segment_is_plain_data_and_comes_back(core):
    """No class of the project's in the pickle of a packed segment: only numpy's (the arrays'
    reconstructors) and builtins; unpacked, the same types and values."""
    seg = _segment(core)
    packed = wire.pack(seg)
    data = pickle.dumps(packed, protocol=5, buffer_callback=lambda b: None)
    assert all(n.startswith(("numpy.", "builtins.")) for n in _globals_pickled(data)), core
    back = wire.unpack(packed)
    assert type(back) is Segment and type(back.state) is type(seg.state)
    leaves, back_leaves = pytree.tree_leaves(seg), pytree.tree_leaves(back)
    assert len(leaves) == len(back_leaves)
    for a, b in zip(leaves, back_leaves):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize(
    "forged, said",
    [
        (lambda p: ("kind", "Popen", p[2]), "unknown kind 'Popen'"),
        (lambda p: ("kind", "Segment", p[2][:3]), "Segment with 3 fields, not 11"),
        (lambda p: ("kind", "Segment", [("exec", "x")] + p[2][1:]), "unknown node 'exec'"),
        (lambda p: ("kind", "Segment", [b"x"] + p[2][1:]), "a bytes, not a packed node"),
        (lambda p: ("kind", "Segment", [("tensor", [1.0], None)] + p[2][1:]), "malformed"),
        (lambda p: ("kind", "Segment", [("tensor", p[2][0][1], (5, 0))] + p[2][1:]), "bad perm"),
    ],
)
def test_what_pack_does_not_make_is_refused_in_one_line(forged, said):
    packed = wire.pack(_segment("rtu-rtrl"))
    with pytest.raises(wire.WireError, match=said) as caught:
        wire.unpack(forged(packed), "actor 1's segment")
    assert str(caught.value).startswith("actor 1's segment") and "\n" not in str(caught.value)


def test_a_type_outside_the_table_is_not_sent():
    with pytest.raises(TypeError, match="not a kind"):
        wire.pack(_Foreign(1))
    with pytest.raises(TypeError, match="cannot send a type"):
        wire.pack(Segment)  # a class is no value either


class _Foreign(tuple):
    _fields = ("a",)

    def __new__(cls, a):
        return super().__new__(cls, (a,))
