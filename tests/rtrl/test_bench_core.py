"""`r2ac bench core` on a tiny shape: runs end to end in both input modes and writes its rows."""

import json

import torch

from r2ac.bench import core


def test_bench_core_tiny_shape_both_input_modes(tmp_path):
    threads = torch.get_num_threads()
    for flag in ("--no-input-grad", "--input-grad"):
        out = tmp_path / f"{flag}.json"
        argv = [
            "--shapes",
            "3,2,4,5",
            "1,2,4,5",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--no-memory",
            flag,
        ]
        assert core.main([*argv, "--json-out", str(out)]) == 0
        rows = json.loads(out.read_text())
        assert [tuple(r["shape"]) for r in rows] == [(3, 2, 4, 5), (1, 2, 4, 5)]
        for r in rows:
            assert r["ms"]["bptt"] > 0 and r["ms"]["rtrl"] > 0 and r["ratio"] > 0
            assert (
                r["held_mb"]["rtrl"] == r["held_mb"]["bptt"]
            )  # the carry holds nothing for backward
        assert set(rows[1]["gbs"]) == {"eager", "fused", "copy"}  # T = 1: bandwidth figures
    assert torch.get_num_threads() == threads


def test_input_grad_reaches_the_input():
    layer, x, readout, state = core._setup(
        (3, 2, 4, 5), "rtrl", torch.float64, "cpu", input_grad=True
    )
    core.segment_fn(layer, x, readout, state)()
    assert x.requires_grad and x.grad is None  # computed, then cleared for the next repeat
    h, _ = layer(x, layer.initial_state(2))  # the setup state was consumed by the run above
    (h * readout).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
