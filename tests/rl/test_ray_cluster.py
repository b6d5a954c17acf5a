"""Ray runtime on a simulated two-node cluster (`ray.cluster_utils.Cluster`, one CPU per
node): joined by address, one actor on each node, the run finishes, and the runtime leaves
the cluster running without its actors."""

from __future__ import annotations

import signal
import time

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from r2ac.rl.run.run_dir import RunDir, read_metrics  # noqa: E402
from r2ac.rl.runtimes.ray import RayRuntime, sigterm_stays_ours  # noqa: E402

from .rl_helpers import tiny  # noqa: E402


@pytest.fixture()
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_run_on_two_nodes_finishes(tmp_path, two_nodes):
    sigterm = signal.getsignal(signal.SIGTERM)
    updates = 20
    cfg = tiny(
        runtime="ray",
        num_actors=2,
        ray_address=two_nodes.address,
        total_frames=3 * 4 * updates,
        checkpoint_every=1000,
    )
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = RayRuntime(cfg, run)
    nodes = {p.node for p in runtime.actor_places()}
    assert len(nodes) == 2  # one CPU a node: the two actors cannot share one
    tracker = runtime.train()
    assert tracker.update == updates
    rows = read_metrics(run.metrics_path)
    assert [r["update"] for r in rows] == list(range(1, updates + 1))
    assert all(r["actor_restarts"] == 0 for r in rows)
    assert not ray.is_initialized()  # the runtime disconnected ...
    assert signal.getsignal(signal.SIGTERM) is sigterm  # and left no handler of Ray's
    with sigterm_stays_ours():
        ray.init(address=two_nodes.address)
    try:  # ... and left the cluster up, with both nodes and no actor of the run alive
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        deadline = time.monotonic() + 30  # the killed actors' CPUs come back
        while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ray.available_resources().get("CPU", 0) == 2
    finally:
        ray.shutdown()
