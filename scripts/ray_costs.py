"""The inputs of the Ray runtime's scaling model (docs/rl.md, "Scaling model"), measured.

    python scripts/ray_costs.py [r2ac train options, e.g. --hidden-size 128]

For the config the options give (default: `r2ac train`'s), one thread each:
- actor: frames/s of one `Actor` (no Ray);
- learner: frames/s of `Learner.update` on a batch already there (no Ray);
- bytes: a segment through the object store (all / its start state) and a weights version;
- Ray: local start-up, the round trip of an empty actor call, and a segment through the
  object store, split in two: from the request to the ready segment (the call and the
  actor's copy into the store; actors do this in parallel), and the learner's own work once
  it is ready (get, unpack, join batch_size / num_envs of them, or copy one: the runtime's
  path), which bounds what one learner process can take: T = frames / that time.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.utils import _pytree as pytree


def _timed(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def local_rates(cfg):
    """(actor frames/s, learner frames/s, a packed segment, weights bytes)."""
    from r2ac.rl.actor import Actor, cat_segments
    from r2ac.rl.build import agent_for_env, make_env
    from r2ac.rl.learner import Learner
    from r2ac.rl.runtimes import wire

    env = make_env(cfg, cfg.runtime.num_envs, 1)
    agent = agent_for_env(cfg, env)
    actor = Actor(agent, env, 1, cfg.loss.unroll_length)
    per_segment = _timed(actor.collect, 20)
    segs = [actor.collect()[0] for _ in range(cfg.segments_per_batch)]
    learner = Learner(agent, cfg)

    def update():
        learner.update(cat_segments([wire.unpack(wire.pack(s)) for s in segs]))

    per_update = _timed(update, 20)
    frames = cfg.loss.unroll_length * cfg.runtime.num_envs
    weights = sum(v.numel() * v.element_size() for v in agent.state_dict().values())
    return (
        frames / per_segment,
        frames * cfg.segments_per_batch / per_update,
        wire.pack(segs[0]),
        weights,
    )


def ray_costs(packed, segments_per_batch: int) -> dict[str, float]:
    import ray

    from r2ac.rl.actor import cat_segments
    from r2ac.rl.runtimes import wire
    from r2ac.rl.runtimes.ray import init_local_ray

    t0 = time.perf_counter()
    init_local_ray(1)  # the runtime's way: workers at this process's niceness
    start = time.perf_counter() - t0

    @ray.remote(num_cpus=1)
    class Source:
        def __init__(self, packed):
            self.packed = packed

        def ping(self):
            return None

        def segment(self):
            return self.packed

    src = Source.remote(packed)
    ray.get(src.ping.remote())
    ping = _timed(lambda: ray.get(src.ping.remote()), 200)

    def batch(n: int) -> tuple[float, float]:
        """(seconds the learner spends on a segment once it is ready: get, unpack, join;
        seconds from the request to a ready segment: the call, the actor's copy into the
        store), for a batch of n segments."""
        t0 = time.perf_counter()
        refs = [src.segment.remote() for _ in range(n)]
        ray.wait(refs, num_returns=n)
        t1 = time.perf_counter()
        segs = [wire.unpack(m) for m in ray.get(refs)]
        cat_segments(segs) if n > 1 else pytree.tree_map(
            lambda t: None if t is None else t.clone(), segs[0]
        )
        return (time.perf_counter() - t1) / n, (t1 - t0) / n

    batch(segments_per_batch)
    times = [batch(segments_per_batch) for _ in range(40)]
    learner = statistics.median(t for t, _ in times)
    request = statistics.median(r for _, r in times)
    ray.shutdown()
    return {
        "start_s": start,
        "ping_ms": ping * 1e3,
        "learner_ms": learner * 1e3,
        "request_ms": request * 1e3,
    }


def main(argv: list[str]) -> int:
    from r2ac.rl.config import validate
    from r2ac.rl.runtimes import wire
    from r2ac.rl.train_cli import parse_config

    torch.set_num_threads(1)
    cfg = validate(parse_config(argv))
    actor_fps, learner_fps, packed, weights = local_rates(cfg)
    seg_bytes, state_bytes = wire.nbytes(packed), wire.nbytes(packed.state)
    frames = cfg.loss.unroll_length * cfg.runtime.num_envs
    print(
        f"config: {cfg.env.id} {cfg.model.core} N={cfg.model.hidden_size} M={cfg.loss.unroll_length} "
        f"B={cfg.runtime.num_envs} batch={cfg.runtime.batch_size}"
    )
    print(f"actor   {actor_fps:9.0f} frames/s (one process, one thread)")
    print(f"learner {learner_fps:9.0f} frames/s (one thread, batch already there)")
    print(
        f"segment {seg_bytes / 1e3:9.1f} kB ({state_bytes / 1e3:.1f} kB start state), "
        f"{seg_bytes / frames:.0f} B a frame; weights {weights / 1e3:.1f} kB a version"
    )
    costs = ray_costs(packed, cfg.segments_per_batch)
    print(f"ray     start-up {costs['start_s']:.1f} s, empty call {costs['ping_ms']:.2f} ms")
    print(
        f"ray     a segment: requested to ready {costs['request_ms']:.2f} ms (the actor's "
        f"side); the learner's get + unpack + join {costs['learner_ms']:.2f} ms "
        f"(T = {frames / costs['learner_ms'] * 1e3:.0f} frames/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
