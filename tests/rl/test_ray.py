"""Ray runtime on one local Ray instance (`ray.init(num_cpus=2)`, shared by the module): the
learner's gradient on ray-collected segments equals the serial one (float64, lr 0), policy
lag stays bounded, a SIGKILLed actor is restarted and counted, an exception inside an actor
reaches the learner with its traceback."""

from __future__ import annotations

import logging
import math
import os
import signal
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from r2ac.envs import trust  # noqa: E402
from r2ac.rl.run.run_dir import RunDir, read_metrics  # noqa: E402
from r2ac.rl.runtimes import ray as runtime_ray  # noqa: E402
from r2ac.rl.runtimes.base import ActorError  # noqa: E402
from r2ac.rl.runtimes.ray import (  # noqa: E402
    IN_FLIGHT,
    RayRuntime,
    init_local_ray,
    sigterm_stays_ours,
)

from .rl_helpers import record_gradients, segments_wanted, serial_grads, tiny  # noqa: E402

K = 2  # actors


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    with sigterm_stays_ours():  # the other tests expect the default SIGTERM handler
        init_local_ray(K)
    yield
    ray.shutdown()


def _cfg(**kw):
    base = dict(runtime="ray", num_actors=K, env_options=("delay=8",), checkpoint_every=1000)
    return tiny(**{**base, **kw})


def _record(runtime: RayRuntime) -> tuple[list, list]:
    """Wrap the runtime: which segments (actor, epoch, seq) each update took, and the
    gradient of each update (before clipping)."""
    taken, real_gather = [], runtime._gather

    def gather():
        got = real_gather()
        taken.append([(m.actor, m.epoch, m.seq, m.instance) for m in got])
        return got

    runtime._gather = gather
    return taken, record_gradients(runtime)


@pytest.mark.parametrize("carry", ["actor", "learner"])
def test_gradient_on_ray_segments_equals_serial_float64(carry):
    """lr 0, two segments an update: each update's gradient is the sum of the serial
    gradients of the segments it took, to 1e-10 (the RTRL sensitivities of the start states
    crossed the object store intact, or the learner carried them itself)."""
    updates = 6
    cfg = _cfg(
        learning_rate=0.0,
        batch_size=6,
        total_frames=6 * 4 * updates,
        log_every=1000,
        sensitivity_carry=carry,
    )
    runtime = RayRuntime(cfg, None, dtype=torch.float64)
    weights = {k: v.clone() for k, v in runtime.agent.state_dict().items()}
    taken, grads = _record(runtime)
    runtime.train()
    assert len(taken) == len(grads) == updates
    for k, v in runtime.agent.state_dict().items():
        assert torch.equal(v, weights[k]), k  # lr 0: the actors acted with these weights
    wanted = segments_wanted(taken)
    assert max(wanted.values()) >= 3  # start states with sensitivities carried over segments
    ref = serial_grads(cfg, weights, wanted, torch.float64)
    for group, grad in zip(taken, grads):
        for name, g in grad.items():
            expected = sum(ref[a, s][name] for a, _, s, _ in group)
            assert (g - expected).abs().max() < 1e-10, (group, name)
    assert any(float(grad["core.F"].abs().max()) > 1e-6 for grad in grads)


@pytest.mark.parametrize("weights_by", ["request", "object_store"])
def test_trains_logs_bounded_lag_and_stops_its_actors(tmp_path, monkeypatch, weights_by):
    if weights_by == "object_store":  # as for weights too large to travel with a request
        monkeypatch.setattr(runtime_ray, "INLINE_WEIGHTS_BYTES", 0)
    updates = 30
    cfg = _cfg(total_frames=3 * 4 * updates, learning_rate=1e-3, checkpoint_every=10)
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = RayRuntime(cfg, run)
    published, publish = [], runtime.publish_weights

    def publish_and_record():
        publish()
        published.append(runtime.weights)

    runtime.publish_weights = publish_and_record
    before = {k: v.clone() for k, v in runtime.agent.state_dict().items()}
    actors = list(runtime.actors)
    # Ray's default would start them at nice 15: starved by anything else on the machine
    assert [p.niceness for p in runtime.actor_places()] == [os.nice(0)] * K
    tracker = runtime.train()
    assert tracker.update == updates
    assert [w.version for w in published] == list(range(updates + 1))
    assert all((w.arrays is None) == (weights_by == "object_store") for w in published)
    rows = read_metrics(run.metrics_path)
    assert [r["update"] for r in rows] == list(range(1, updates + 1))
    lags = [r["policy_lag"] for r in rows]
    # actors that never reloaded the weights would lag by the update count: 0, 1, .., 29;
    # with K * IN_FLIGHT requests in flight and the oldest ready one taken first, the lag
    # is about that many updates (more while one actor stalls: a loaded machine)
    assert all(math.isfinite(x) and x >= 0 for x in lags)
    assert sum(lags) / len(lags) <= K * IN_FLIGHT and max(lags) <= updates / 2, str(lags)
    assert max(lags) >= 1  # asynchronous: some segments come from older weights
    assert all(r["actor_restarts"] == 0 for r in rows)
    after = runtime.agent.state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in after)
    assert run.checkpoint_path.is_file()
    assert runtime.actors == [] and ray.is_initialized()  # the shared instance stays
    for a in actors:  # killed with the run
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(a.where.remote(), timeout=30)


def _wait_for_new_process(runtime: RayRuntime, k: int, old_pid: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ray.get(runtime.actors[k].where.remote(), timeout=timeout).pid != old_pid:
                return
        except ray.exceptions.RayActorError:  # still dying or restarting
            time.sleep(0.1)
    raise AssertionError(f"actor {k} not restarted in {timeout} s")


def test_sigkilled_actor_is_restarted_counted_and_the_run_goes_on(tmp_path):
    updates = 40
    cfg = _cfg(total_frames=3 * 4 * updates, max_actor_restarts=2)
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = RayRuntime(cfg, run)
    taken, _ = _record(runtime)
    victim = runtime.actor_places()[0].pid
    real_next_batch = runtime.next_batch

    def next_batch():
        if runtime.version == 5:
            os.kill(victim, signal.SIGKILL)
        if runtime.version == 6:  # go on once Ray has restarted it (a new process: seconds)
            _wait_for_new_process(runtime, 0, victim)
        return real_next_batch()

    runtime.next_batch = next_batch
    tracker = runtime.train()
    assert tracker.update == updates
    rows = read_metrics(run.metrics_path)
    assert rows[-1]["actor_restarts"] >= 1 and rows[0]["actor_restarts"] == 0
    victim_segments = [s for group in taken for s in group if s[0] == 0]
    instances = list(dict.fromkeys(s[3] for s in victim_segments))
    assert len(instances) >= 2  # a new process ...
    first_new = next(s for s in victim_segments if s[3] == instances[1])
    assert first_new[2] == 1  # ... whose streams started over (its segment 1)
    assert runtime.carry is not None and runtime.carry.gaps == 0  # the learner's carry (auto)


def _gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} still there after {timeout} s")


def test_an_actor_whose_restart_did_not_come_is_reported_at_the_end(tmp_path, caplog):
    """Actor 0 SIGKILLed 4 updates before the end of a run whose updates take milliseconds:
    its new process (an interpreter, torch, the env: seconds) cannot deliver before the end.
    Its requests were answered before it died, so none fails: Ray's actor table says it is
    restarting. The run ends normally; the last row says `actors_missing` 1, and the end
    says so in one line."""
    updates = 12
    cfg = _cfg(total_frames=3 * 4 * updates, max_actor_restarts=2)
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = RayRuntime(cfg, run)
    taken, _ = _record(runtime)
    victim = runtime.actor_places()[0].pid
    real_next_batch = runtime.next_batch

    def next_batch():
        if runtime.version == updates - 4:
            os.kill(victim, signal.SIGKILL)
            _gone(victim)
        return real_next_batch()

    runtime.next_batch = next_batch
    with caplog.at_level(logging.WARNING, logger=runtime_ray.__name__):
        tracker = runtime.train()
    assert tracker.update == updates
    assert len({s[3] for group in taken for s in group if s[0] == 0}) == 1  # no new process
    rows = read_metrics(run.metrics_path)
    assert [r["actors_missing"] for r in rows[: updates - 4]] == [0] * (updates - 4)
    assert rows[-1]["actors_missing"] == 1 and rows[-1]["actor_restarts"] == 0
    said = [r.getMessage() for r in caplog.records if "before the end of the run" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith("ray: actor 0 died ") and "ended with 1 of 2 actors" in said[0]


def test_a_death_past_the_restart_limit_stops_the_run_with_one_line(tmp_path):
    cfg = _cfg(total_frames=3 * 4 * 400, max_actor_restarts=0)
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = RayRuntime(cfg, run)
    victim = runtime.actor_places()[0].pid
    real_next_batch = runtime.next_batch

    def next_batch():
        if runtime.version == 3:
            os.kill(victim, signal.SIGKILL)
        return real_next_batch()

    runtime.next_batch = next_batch
    t0 = time.monotonic()
    with pytest.raises(ActorError) as info:
        runtime.train()
    assert time.monotonic() - t0 < 60
    message = str(info.value)
    assert message.startswith("actor 0 died") and "--max-actor-restarts 0" in message
    assert "\n" not in message and run.checkpoint_path.is_file() and runtime.actors == []


def test_exception_inside_an_actor_reaches_the_learner_with_its_traceback(tmp_path):
    cfg = _cfg(total_frames=3 * 4 * 50)
    run = RunDir.create(tmp_path / "run", cfg)
    runtime = RayRuntime(cfg, run)
    real_publish = runtime.publish_weights

    def publish():  # weights the actors' agents cannot load, from version 3 on
        if runtime.version >= 3:
            runtime.agent.register_buffer("not_in_the_actor", torch.zeros(1))
        real_publish()

    runtime.publish_weights = publish
    with pytest.raises(ActorError) as info:
        runtime.train()
    message, trace = str(info.value), info.value.traceback
    assert message.startswith("actor ") and "\n" not in message  # one line naming it ...
    assert 'Unexpected key(s) in state_dict: "not_in_the_actor"' in message  # ... and why
    assert "ray::RayActor.collect()" in trace  # the actor's own traceback
    assert "in collect\n" in trace and "load_state_dict" in trace
    assert "\x1b[" not in trace
    assert runtime.actors == []
    assert run.checkpoint_path.is_file()  # the last complete update


def test_resume_continues_from_the_checkpoint(tmp_path):
    """A run stopped after 8 updates (its checkpoint), resumed by a new runtime: the rows
    go on from update 9 to the end, the weights and the restart count come back."""
    cfg = _cfg(total_frames=3 * 4 * 16, checkpoint_every=8)
    run = RunDir.create(tmp_path / "run", cfg)
    first = RayRuntime(cfg, run)
    first.restarts = 2  # as if two actors had died: the count is part of the checkpoint
    real_next_batch = first.next_batch

    def next_batch():
        if first.version == 8:
            raise ActorError("stop here")  # the base checkpoints update 8 and re-raises
        return real_next_batch()

    first.next_batch = next_batch
    with pytest.raises(ActorError):
        first.train()
    payload = run.load_checkpoint()
    assert payload["counters"]["update"] == 8 and payload["runtime"] == "ray"
    second = RayRuntime(cfg, run)
    second.restore(payload)
    assert all(torch.equal(v, payload["agent"][k]) for k, v in second.agent.state_dict().items())
    tracker = second.train()
    assert tracker.update == 16
    rows = read_metrics(run.metrics_path)
    assert [r["update"] for r in rows] == list(range(1, 17))
    assert rows[-1]["actor_restarts"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_learner_on_cuda_trains_from_ray_actors(tmp_path):
    updates = 6
    cfg = _cfg(device="cuda", total_frames=3 * 4 * updates)
    runtime = RayRuntime(cfg, RunDir.create(tmp_path / "run", cfg))
    before = {k: v.detach().cpu().clone() for k, v in runtime.agent.state_dict().items()}
    assert next(runtime.agent.parameters()).is_cuda
    tracker = runtime.train()
    assert tracker.update == updates
    after = runtime.agent.state_dict()
    assert any(not torch.equal(after[k].cpu(), before[k]) for k in after)


@ray.remote(num_cpus=0)
class _TrustProbe:
    def verdict(self, env_id: str) -> str:
        from r2ac.envs import trust
        from r2ac.errors import ConfigError

        try:
            trust.check_may_import(env_id)
        except ConfigError as exc:
            return f"refused: {exc}"
        return "allowed"


def test_actors_get_the_drivers_env_module_trust_by_runtime_env(monkeypatch):
    """Trust set in the driver after Ray started (as on a cluster, whose other nodes' workers
    never see the driver's environment) reaches an actor through its runtime_env; an actor
    without it does not see it; with nothing trusted the actor refuses the module too."""
    env_id = "gym/r2ac_planted_env_mod:Planted-v0"
    monkeypatch.delenv(trust.TRUST_VAR, raising=False)
    monkeypatch.setenv(trust.TRUST_VAR, "r2ac_planted_env_mod")
    assert runtime_ray.actor_runtime_env() == {
        "env_vars": {trust.TRUST_VAR: "r2ac_planted_env_mod"}
    }
    carried = _TrustProbe.options(runtime_env=runtime_ray.actor_runtime_env()).remote()
    bare = _TrustProbe.remote()  # the raylet's environment only (Ray started before setenv)
    assert ray.get(carried.verdict.remote(env_id), timeout=120) == "allowed"
    assert ray.get(bare.verdict.remote(env_id), timeout=120).startswith("refused:")

    monkeypatch.setenv(trust.TRUST_VAR, "")  # nothing trusted: refused there as well
    untrusted = _TrustProbe.options(runtime_env=runtime_ray.actor_runtime_env()).remote()
    said = ray.get(untrusted.verdict.remote(env_id), timeout=120)
    assert said.startswith("refused:") and "--trust-env-module" in said
    for actor in (carried, bare, untrusted):
        ray.kill(actor)
