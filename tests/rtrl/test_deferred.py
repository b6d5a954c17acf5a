"""The in-place carry's bookkeeping lives on the state's buffers (r2ac.rtrl.elstm.deferred).

Dropped graphs and dropped states leave nothing behind; a consumed state is refused.
"""

import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

from r2ac.rtrl import ELSTM, ConsumedStateError, ELSTMSensitivity
from r2ac.rtrl.elstm.deferred import PendingCarry
from r2ac.rtrl.state import detach_state, select_streams

from .common import F64

D, N = 5, 4


def live_pending_carries() -> int:
    gc.collect()
    return sum(type(o) is PendingCarry for o in gc.get_objects())


def test_dropped_graphs_leave_no_bookkeeping():
    torch.manual_seed(0)
    layer = ELSTM(D, N, "rtrl", dtype=F64)
    state = layer.initial_state(3)
    x = torch.randn(4, 3, D, dtype=F64)
    base = live_pending_carries()
    for _ in range(20):
        y, new = layer(x, state)  # under autograd: a carry pending, a graph reading state
        assert new.sens.is_pending and state.sens.reader_count() == 2
        del y, new  # dropped without a backward
    assert live_pending_carries() == base
    assert state.sens.reader_count() == 0
    y, new = layer(x, state)  # the state is intact and still carries in place
    y.sum().backward()
    assert state.sens.consumed and not new.sens.is_pending


def test_dropped_state_is_not_carried_and_input_stays_usable():
    """A graph whose returned state was dropped backpropagates without consuming its input."""
    torch.manual_seed(0)
    layer = ELSTM(D, N, "rtrl", dtype=F64)
    state = layer.initial_state(2)
    y, new = layer(torch.randn(3, 2, D, dtype=F64), state)
    del new
    y.sum().backward()
    assert not state.sens.consumed
    layer(torch.randn(3, 2, D, dtype=F64), state)


def test_consumed_buffer_refuses_every_read():
    torch.manual_seed(0)
    layer = ELSTM(D, N, "rtrl", dtype=F64)
    state = layer.initial_state(2)
    y, new = layer(torch.randn(3, 2, D, dtype=F64), state)
    y.sum().backward()
    for read in (
        lambda: state.sens.FZ,
        lambda: list(state.sens),
        lambda: pytree.tree_leaves(state),
        lambda: layer(torch.randn(3, 2, D, dtype=F64), state),
    ):
        with pytest.raises(ConsumedStateError, match="overwritten in place"):
            read()
    assert "consumed" in repr(state.sens)


def test_buffer_is_a_pytree_node_and_pickles_settled():
    sens = ELSTMSensitivity(torch.ones(2, 2, N, D), torch.zeros(2, 4, N))
    leaves, spec = pytree.tree_flatten(sens)
    assert [t.shape for t in leaves] == [(2, 2, N, D), (2, 4, N)]
    back = pytree.tree_unflatten([t + 1 for t in leaves], spec)
    assert isinstance(back, ELSTMSensitivity) and float(back.wb.sum()) == 2 * 4 * N
    copy = pickle.loads(pickle.dumps(sens))
    assert torch.equal(copy.FZ, sens.FZ) and torch.equal(copy.wb, sens.wb)


PROBE = textwrap.dedent(
    """
    import gc, os, sys
    import torch
    torch.set_num_threads(1)
    from r2ac.rtrl import ELSTM
    from r2ac.rtrl.elstm.deferred import PendingCarry

    def rss_mb():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    T, B, N, D = 10, 32, 256, 257
    torch.manual_seed(0)
    layer, x = ELSTM(D, N, "rtrl"), torch.randn(T, B, D)
    state = layer.initial_state(B)
    for _ in range(3):  # warm up the allocator and the native kernel
        y, state = layer(x, state)
        y.sum().backward()
    del y
    gc.collect()
    before = rss_mb()
    for _ in range(100):
        y, new = layer(x, state)
        loss = y.sum()  # e.g. a value computed for logging with grad on, never backpropagated
        del y, new, loss
    gc.collect()
    pending = sum(type(o) is PendingCarry for o in gc.get_objects())
    print(rss_mb() - before, pending, state.sens.reader_count())
    """
)


def test_100_dropped_forwards_grow_rss_by_less_than_one_state():
    """At (T, B, N, D) = (10, 32, 256, 257), float32: one state is 16.2 MB."""
    root = str(Path(__file__).resolve().parents[2])  # this checkout's r2ac, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env
    )
    growth_mb, pending, readers = out.stdout.split()
    state_mb = 32 * 256 * (2 * 257 + 4) * 4 / 2**20
    assert int(pending) == 0 and int(readers) == 0
    assert float(growth_mb) < state_mb, out.stdout


@pytest.mark.parametrize("derive", ["detach_state", "select_streams"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])  # float32: the native kernel's path
def test_a_buffer_derived_over_the_same_storage_shares_its_readers(derive, dtype):
    """A graph from `detach_state(S)` (or a slice of S) reads S's storage: the carry of a graph
    from S must not run in place over it. Gradients equal those of the eager carry."""
    x = torch.randn(3, 2, D, dtype=dtype, generator=torch.Generator().manual_seed(1))
    grads = []
    for inplace in (True, False):
        torch.manual_seed(0)
        layer = ELSTM(D, 8, "rtrl", dtype=dtype, inplace_carry=inplace)
        with torch.no_grad():
            _, S = layer(x, layer.initial_state(2))
        S2 = detach_state(S) if derive == "detach_state" else select_streams(S, slice(0, 2))
        y_a, s_a = layer(x, S)
        y_b, s_b = layer(x.flip(0), S2)
        y_a.sum().backward()
        (y_b**2).sum().backward()
        grads.append([p.grad.clone() for p in layer.parameters()] + [*s_a.sens, *s_b.sens])
    for got, want in zip(*grads):
        torch.testing.assert_close(
            got, want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6
        )
