"""`r2ac bench core` on a tiny shape: runs end to end in both input modes and writes its rows."""

import json

import pytest
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
            "--copy-mib",
            "4",
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
        for r in rows:  # the history term + carry alone, against the copy bandwidth
            c = r["carry"]
            assert c["candidate"] == "cpu" and c["ms"] > 0 and c["copy_gbs"] > 0
            assert c["fraction"] == pytest.approx(c["gbs"] / c["copy_gbs"])
            assert c["history_candidate"] == "cpu" and c["history_ms"] > 0  # the learner's pass
            assert c["history_fraction"] == pytest.approx(c["history_gbs"] / c["copy_gbs"])
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert core.main(["--device", "cuda", "--json-out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "r2ac bench core: --device cuda: torch sees no CUDA device here; use --device cpu"
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "--device must be cpu or cuda, got 'tpu'"),
        (["--grid", "huge"], "unknown --grid 'huge'; choose one of gpu, gpu-512"),
        (["--gpu-carry", "magic"], "unknown --gpu-carry 'magic'; choose one of auto"),
        (["--copy-mib", "0"], "--copy-mib >= 1"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(capsys, argv, message):
    assert core.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_the_gpu_grid_is_the_issues_grid():
    grid = core.GRIDS["gpu"]
    assert len(grid) == 3 * 4 * 3 == len(set(grid))
    assert {s[0] for s in grid} == {1, 50, 100} and {s[1] for s in grid} == {32, 64, 128, 256}
    assert {s[2] for s in grid} == {512, 1024, 2048} and {s[3] for s in grid} == {257}
    parts = [core.GRIDS[f"gpu-{n}"] for n in (512, 1024, 2048)]
    assert sorted(sum(parts, ())) == sorted(grid)
