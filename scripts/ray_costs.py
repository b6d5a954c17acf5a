"""The inputs of the Ray runtime's scaling model (docs/rl.md, "Scaling model"), measured.

    python scripts/ray_costs.py [r2ac train options, e.g. --hidden-size 128]

For the config the options give (default: `r2ac train`'s), one thread each:
- actor: frames/s of one `Actor` (no Ray);
- learner: frames/s of `Learner.update` on a batch already there (no Ray);
- bytes: a segment through the object store (all / its start state) and a weights version;
- Ray: local start-up, the round trip of an empty actor call, and the cost of a segment
  through the object store (an actor returns a stored packed segment; the learner gets it,
  unpacks it and joins batch_size / num_envs of them, the runtime's path), with 4 requests
  in flight as the runtime keeps them.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

import torch


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
    from r2ac.rl import wire
    from r2ac.rl.actor import Actor, cat_segments
    from r2ac.rl.build import agent_for_env, make_env
    from r2ac.rl.learner import Learner

    env = make_env(cfg, cfg.num_envs, 1)
    agent = agent_for_env(cfg, env)
    actor = Actor(agent, env, 1, cfg.unroll_length)
    per_segment = _timed(actor.collect, 20)
    segs = [actor.collect()[0] for _ in range(cfg.segments_per_batch)]
    learner = Learner(agent, cfg)

    def update():
        learner.update(cat_segments([wire.unpack(wire.pack(s)) for s in segs]))

    per_update = _timed(update, 20)
    frames = cfg.unroll_length * cfg.num_envs
    weights = sum(v.numel() * v.element_size() for v in agent.state_dict().values())
    return (
        frames / per_segment,
        frames * cfg.segments_per_batch / per_update,
        wire.pack(segs[0]),
        weights,
    )


def ray_costs(packed, segments_per_batch: int) -> dict[str, float]:
    import ray

    from r2ac.rl import wire
    from r2ac.rl.actor import cat_segments

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)
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

    def batches(n: int = 20) -> float:
        """Seconds a segment, with 4 requests in flight (the runtime's pipelining)."""
        pending = [src.segment.remote() for _ in range(4)]
        t0 = time.perf_counter()
        for _ in range(n):
            got = []
            for _ in range(segments_per_batch):
                got.append(ray.get(pending.pop(0)))
                pending.append(src.segment.remote())
            segs = [wire.unpack(m) for m in got]
            cat_segments(segs) if len(segs) > 1 else segs[0].state.c.clone()
        return (time.perf_counter() - t0) / (n * segments_per_batch)

    batches(5)
    per_segment = statistics.median(batches() for _ in range(5))
    ray.shutdown()
    return {"start_s": start, "ping_ms": ping * 1e3, "segment_ms": per_segment * 1e3}


def main(argv: list[str]) -> int:
    from r2ac.rl import wire
    from r2ac.rl.config import validate
    from r2ac.rl.train_cli import parse_config

    torch.set_num_threads(1)
    cfg = validate(parse_config(argv))
    actor_fps, learner_fps, packed, weights = local_rates(cfg)
    seg_bytes, state_bytes = wire.nbytes(packed), wire.nbytes(packed.state)
    frames = cfg.unroll_length * cfg.num_envs
    print(
        f"config: {cfg.env} {cfg.core} N={cfg.hidden_size} M={cfg.unroll_length} "
        f"B={cfg.num_envs} batch={cfg.batch_size}"
    )
    print(f"actor   {actor_fps:9.0f} frames/s (one process, one thread)")
    print(f"learner {learner_fps:9.0f} frames/s (one thread, batch already there)")
    print(
        f"segment {seg_bytes / 1e3:9.1f} kB ({state_bytes / 1e3:.1f} kB start state), "
        f"{seg_bytes / frames:.0f} B a frame; weights {weights / 1e3:.1f} kB a version"
    )
    costs = ray_costs(packed, cfg.segments_per_batch)
    print(
        f"ray     start-up {costs['start_s']:.1f} s, empty call {costs['ping_ms']:.2f} ms, "
        f"a segment through the object store {costs['segment_ms']:.2f} ms "
        f"({seg_bytes / costs['segment_ms'] / 1e6:.2f} GB/s, "
        f"{frames / costs['segment_ms'] * 1e3:.0f} frames/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
