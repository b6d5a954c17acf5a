"""Parallel runtime, lr 0: each update's gradient is the sum of the serial gradients of the
segments it took, whether the actors carry the RTRL sensitivities (and ship them through
shared memory) or the learner carries them (r2ac/rl/runtimes/learner_carry.py). float32 (the
parallel runtime's dtype): the actors' carry is the serial one computed in another process
and the learner's recomputes the stem over the segment in one batch; a batch of two
segments sums in another order than two gradients: so float32 rounding, tolerance 1e-4 of
each gradient's largest entry (measured: 1.8e-5 with either carry)."""

from __future__ import annotations

import pytest
import torch

from r2ac.rl.runtimes.parallel import ParallelRuntime

from .rl_helpers import record_gradients, segments_wanted, serial_grads, tiny


@pytest.mark.parametrize("carry", ["actor", "learner"])
def test_gradient_on_parallel_segments_equals_serial(carry):
    updates = 6
    cfg = tiny(
        runtime="parallel",
        num_actors=2,
        env_options=("delay=8",),
        learning_rate=0.0,
        batch_size=6,
        total_frames=6 * 4 * updates,
        log_every=1000,
        checkpoint_every=1000,
        sensitivity_carry=carry,
    )
    runtime = ParallelRuntime(cfg)
    weights = {k: v.clone() for k, v in runtime.agent.state_dict().items()}
    taken, real_take = [], runtime._take

    def take(need):
        items = real_take(need)
        taken.append([(m.actor, m.generation, m.seq) for m in items])
        return items

    runtime._take = take
    grads = record_gradients(runtime)
    runtime.train()
    assert len(taken) == len(grads) == updates
    wanted = segments_wanted(taken)
    assert max(wanted.values()) >= 3  # start states with sensitivities carried over segments
    ref = serial_grads(cfg, weights, wanted, torch.float32)
    worst = 0.0
    for group, grad in zip(taken, grads):
        for name, g in grad.items():
            expected = sum(ref[a, s][name] for a, _, s in group)
            scale = max(float(expected.abs().max()), 1e-6)
            err = float((g - expected).abs().max())
            worst = max(worst, err / scale)
            assert err <= 1e-4 * scale, (group, name, err, scale)
    assert any(float(grad["core.F"].abs().max()) > 1e-6 for grad in grads)
    print(f"largest error / largest entry: {worst:.1e}")
