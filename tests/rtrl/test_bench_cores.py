"""`r2ac bench cores` on tiny sizes: runs end to end and its exactness part has teeth."""

import json

import torch

from r2ac.bench import cores


def test_bench_cores_smoke(tmp_path):
    threads = torch.get_num_threads()
    argv = [
        "--cores",
        "elman-rtrl",
        "fwp-rtrl",
        "felstm-snap1",
        "--sizes",
        "4",
        "8",
        "--input-size",
        "8",
        "--hybrid-sizes",
        "4",
        "--hybrid-lengths",
        "3",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--no-memory",
        "--no-exactness",
        "--plot",
        str(tmp_path / "p.png"),
        "--json-out",
        str(tmp_path / "r.json"),
    ]
    assert cores.main(argv) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert {(r["core"], r["n"]) for r in result["scaling"]} == {
        (c, n) for c in ("elman-rtrl", "fwp-rtrl", "felstm-snap1") for n in (4, 8)
    }
    elman = {
        r["n"]: r["state_kib_per_stream"] for r in result["scaling"] if r["core"] == "elman-rtrl"
    }
    assert elman[8] == (8 * 8 * (8 + 8 + 1) + 8) * 4 / 1024  # N^2 (N + D + 1) and h, float32
    assert [(r["n"], r["t"]) for r in result["hybrid"]] == [(4, 3)]
    assert (tmp_path / "p.png").stat().st_size > 0
    assert cores.main(["--cores", "gru-rtrl"]) == 2
    assert torch.get_num_threads() == threads  # the bench's thread setting does not leak


def test_exactness_and_cosine():
    errors = cores.exactness(["elman-rtrl", "fwp-rtrl", "elstm-snap1", "felstm-snap1", "lstm-bptt"])
    assert max(errors.values()) < 1e-10, errors
    snap, bptt = cores.snap1_cosine(5, N=8, D=4, B=2, steps=20)
    assert 0.9 < snap < 1 - 1e-6 and bptt < snap
