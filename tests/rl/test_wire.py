"""r2ac.rl.runtimes.wire: segments (with the eLSTM's sensitivities) as numpy trees and back, without
copies, in the dims order the actor had."""

from __future__ import annotations

import pickle

import torch
from torch.utils import _pytree as pytree

from r2ac.rl.learning.actor import Actor, Segment
from r2ac.rl.model.build import agent_for_env, make_env
from r2ac.rl.runtimes import wire
from r2ac.rtrl.elstm.deferred import CarriedBuffer

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
    assert wire.nbytes(packed.state.sens) == (2 * B * N * D + 4 * B * N) * 4  # FZ and wb
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
