"""Test-wide settings.

Tests use small tensors, where a second intra-op thread only adds synchronisation (and, on a
loaded 2-core machine, stalls of milliseconds per op). One thread keeps the suite fast and
its timing stable; benchmarks set their own thread counts.
"""

import torch

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_signal_left_unhonoured():
    """A test that catches one of the CLI's signal exceptions itself (not through a command's
    exit code) would leave it 'unhonoured' (r2ac.runs.stop), and the next StopRequest in this
    process would stop at once: every test starts without one."""
    from r2ac.runs import stop

    stop._unhonoured = None
    yield


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test whose command sets torch's thread count (`--num-threads`, `--threads`) leaves the
    next test the suite's own count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
