"""The copy task: generator properties, the honest metric, both schedules, and the CLI."""

import dataclasses
import json

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.runs import checkpoint as rl_checkpoint
from r2ac.tasks import copy as ct
from r2ac.tasks import copy_cli


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: one thread is faster, and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def batch(seed=0, B=64, max_len=7, **kw):
    return ct.make_batch(B, max_len, torch.Generator().manual_seed(seed), **kw)


# ---------------------------------------------------------------- generator


def test_lengths_and_padding():
    b = batch(B=400, max_len=7)
    T, B = b.mask.shape
    k = b.pattern_len
    assert int(k.min()) == 1 and int(k.max()) == 7 and T == 2 * 7
    assert b.x.shape == (T, B, 3)
    t = torch.arange(T)[:, None]
    real = t < 2 * k
    # one symbol per real step, nothing at padded steps
    assert torch.equal(b.x.sum(-1), real.float())
    # bits while reading, blanks while writing
    sym = b.x.argmax(-1)
    assert bool((sym[t.expand(-1, B) < k] < 2).all())
    assert bool((sym[(t >= k) & real] == ct.BLANK).all())
    # the mask is exactly the writing phase: k output bits per sequence
    assert torch.equal(b.mask, (t >= k) & real)
    assert torch.equal(b.mask.sum(0), k)
    assert not bool(b.target[~b.mask].any())


def test_targets_are_the_pattern_delayed_by_k():
    b = batch(B=50, max_len=9)
    sym = b.x.argmax(-1)
    for i in range(50):
        k = int(b.pattern_len[i])
        assert torch.equal(b.target[k : 2 * k, i], sym[:k, i])


def test_pattern_lengths_cover_the_range_uniformly():
    k = batch(B=6000, max_len=5).pattern_len
    counts = torch.bincount(k, minlength=6)[1:].float()
    assert counts.min() > 0.8 * 1200 and counts.max() < 1.2 * 1200


def test_both_bit_values_in_targets():
    b = batch(B=200, max_len=10)
    out = b.target[b.mask]
    frac_ones = out.float().mean().item()
    assert 0.4 < frac_ones < 0.6  # the '1's are scored too, not dropped as padding


def test_deterministic_per_seed():
    a, b, c = batch(seed=3), batch(seed=3), batch(seed=4)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(u.shape == v.shape and torch.equal(u, v) for u, v in zip(a, c))
    s1, s2 = (
        ct.make_test_set(6, 250, seed=1, batch_size=100),
        ct.make_test_set(6, 250, seed=1, batch_size=100),
    )
    assert [x.mask.shape[1] for x in s1] == [100, 100, 50]
    assert all(torch.equal(u, v) for x, y in zip(s1, s2) for u, v in zip(x, y))


def test_min_length_and_bad_arguments():
    assert int(batch(B=100, max_len=6, min_len=6).pattern_len.min()) == 6
    with pytest.raises(ValueError):
        batch(max_len=0)


# ---------------------------------------------------------------- metric and schedules


def test_untrained_model_scores_near_chance():
    torch.manual_seed(0)
    model = ct.CopyModel(32, "rtrl")
    test_set = ct.make_test_set(20, 500, seed=5)
    ev = ct.evaluate(model, test_set)
    assert 0.4 < ev["bit_accuracy"] < 0.6
    assert ev["sequence_accuracy"] < 0.15
    assert ev["n_bits"] == sum(int(b.pattern_len.sum()) for b in test_set)  # every output bit


def test_metric_counts_ones_and_zeros():
    # A model that always writes '1' (what the reference's metric would call perfect: its
    # '1' is the ignored index) gets exactly the fraction of ones here.
    class AlwaysOne(torch.nn.Module):
        def initial_state(self, B, with_sensitivities=None):
            return None

        def forward(self, x, state):
            T, B, _ = x.shape
            return torch.tensor([-1.0, 1.0]).expand(T, B, 2), state

    test_set = ct.make_test_set(10, 300, seed=2)
    ev = ct.evaluate(AlwaysOne(), test_set)
    ones = sum(int(b.target[b.mask].sum()) for b in test_set)
    assert ev["bit_accuracy"] == pytest.approx(ones / ev["n_bits"])
    assert ev["bit_accuracy_ones"] == 1.0 and ev["bit_accuracy_zeros"] == 0.0
    assert 0.4 < ev["bit_accuracy"] < 0.6


def test_accuracy_by_length_agrees_with_sequence_accuracy():
    torch.manual_seed(1)
    model = ct.CopyModel(16, "bptt")
    test_set = ct.make_test_set(5, 300, seed=3, batch_size=128)
    by_len = ct.sequence_accuracy_by_length(model, test_set)
    counts = torch.bincount(torch.cat([b.pattern_len for b in test_set]), minlength=6)[1:]
    assert list(by_len) == [1, 2, 3, 4, 5]
    total = sum(by_len[k] * int(counts[k - 1]) for k in by_len) / 300
    assert total == pytest.approx(ct.evaluate(model, test_set)["sequence_accuracy"])


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_rtrl_chunks_give_the_full_bptt_gradient():
    """rtrl with any segment == bptt over the whole sequence; bptt with short chunks differs."""
    b = batch(seed=1, B=6, max_len=6)
    b = ct.CopyBatch(b.x.double(), *b[1:])
    grads = {}
    for rule, seg in (("bptt", None), ("rtrl", 1), ("rtrl", 3), ("bptt", 3)):
        torch.manual_seed(0)
        model = ct.CopyModel(8, rule).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        ct.sequence_update(model, opt, b, seg, clip=0.0)
        grads[rule, seg] = _grads(model)
    full = grads["bptt", None]
    for key in (("rtrl", 1), ("rtrl", 3)):
        for n, g in full.items():
            torch.testing.assert_close(grads[key][n], g, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(grads["bptt", 3]["core.w_f"], full["core.w_f"])


def test_online_with_zero_lr_sums_to_the_sequence_gradient():
    """With frozen weights the online step losses add up to the per-sequence loss * n_out / B."""
    b = batch(seed=2, B=5, max_len=5)
    b = ct.CopyBatch(b.x.double(), *b[1:])
    torch.manual_seed(0)
    seq = ct.CopyModel(6, "rtrl").double()
    ct.sequence_update(seq, torch.optim.SGD(seq.parameters(), lr=0.0), b, None, clip=0.0)
    torch.manual_seed(0)
    onl = ct.CopyModel(6, "rtrl").double()
    acc = {n: torch.zeros_like(p) for n, p in onl.named_parameters()}

    class Accumulate(torch.optim.SGD):
        def step(self, closure=None):
            for n, p in onl.named_parameters():
                acc[n] += p.grad

    stats = ct.online_update(onl, Accumulate(onl.parameters(), lr=0.0), b, clip=0.0)
    assert stats.updates == int(b.mask.any(1).sum())
    scale = int(b.mask.sum()) / 5
    for n, p in seq.named_parameters():
        torch.testing.assert_close(acc[n], p.grad * scale, rtol=1e-10, atol=1e-12)


def test_linear_learning_rate_decay():
    cfg = ct.CopyConfig(lr=1e-2, lr_final=1e-4, train_steps=100)
    assert cfg.learning_rate(0) == 1e-2
    assert cfg.learning_rate(50) == pytest.approx(0.5 * (1e-2 + 1e-4))
    assert cfg.learning_rate(100) == pytest.approx(1e-4)
    assert ct.CopyConfig(lr=1e-3).learning_rate(77) == 1e-3


def test_online_needs_rtrl():
    model = ct.CopyModel(4, "bptt")
    with pytest.raises(ConfigError):
        ct.online_update(model, torch.optim.Adam(model.parameters()), batch(B=2, max_len=3))


@pytest.mark.parametrize("online", [False, True])
def test_tiny_copy_is_learnt_to_100_percent(online):
    cfg = ct.CopyConfig(
        length=4,
        hidden=32,
        batch_size=32,
        lr=1e-2,
        train_steps=1500,
        segment=None if online else 2,
        online=online,
        eval_every=50,
        test_size=200,
        threads=0,
    )
    _, result = ct.train(cfg)
    assert result.solved_at_step is not None, result.curve[-1]
    assert result.final["bit_accuracy"] == 1.0 and result.final["sequence_accuracy"] == 1.0
    assert result.curve[0]["test_bit_accuracy"] < 0.7


@pytest.mark.slow
def test_copy_l6_is_learnt_by_rtrl_with_short_chunks():
    # measured: solved at batch 2000 (45 s of training on one loaded core)
    cfg = ct.CopyConfig(
        length=6,
        hidden=64,
        batch_size=32,
        lr=1e-2,
        train_steps=5000,
        segment=3,
        eval_every=250,
        test_size=500,
    )
    _, result = ct.train(cfg)
    assert result.final["sequence_accuracy"] == 1.0, result.curve[-1]


# ---------------------------------------------------------------- CLI


def test_cli_untrained_writes_results(tmp_path):
    out = tmp_path / "run"
    rc = copy_cli.main(
        [
            "--length",
            "6",
            "--hidden",
            "16",
            "--train-steps",
            "0",
            "--test-size",
            "200",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert 0.35 < res["bit_accuracy"] < 0.65 and "sequence_accuracy" in res
    assert set(res["sequence_accuracy_by_length"]) == {str(k) for k in range(1, 7)}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["length"] == 6 and cfg["git_revision"]
    assert (out / "curve.csv").read_text().startswith("step,")
    assert (out / "curve.png").stat().st_size > 0


def test_cli_trains_and_records_a_curve(tmp_path):
    out = tmp_path / "run"
    rc = copy_cli.main(
        [
            "--length",
            "3",
            "--hidden",
            "8",
            "--batch-size",
            "4",
            "--train-steps",
            "6",
            "--eval-every",
            "3",
            "--segment",
            "2",
            "--rule",
            "bptt",
            "--test-size",
            "20",
            "--no-stop-when-solved",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    curve = ct.read_curve_csv(out / "curve.csv")
    assert [r["step"] for r in curve] == [0, 3, 6]
    assert json.loads((out / "results.json").read_text())["updates"] == 6


def test_cli_resume_continues_from_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    common = [
        "--length",
        "3",
        "--hidden",
        "8",
        "--batch-size",
        "4",
        "--eval-every",
        "2",
        "--test-size",
        "20",
        "--no-stop-when-solved",
        "--out",
        str(out),
    ]
    assert copy_cli.main([*common, "--train-steps", "4"]) == 0
    assert copy_cli.main([*common, "--train-steps", "6", "--resume"]) == 0
    resumed = ct.read_curve_csv(out / "curve.csv")
    straight = tmp_path / "straight"
    assert copy_cli.main([*common[:-1], str(straight), "--train-steps", "6"]) == 0
    assert [r["step"] for r in resumed] == [0, 2, 4, 6]
    for a, b in zip(resumed, ct.read_curve_csv(straight / "curve.csv")):  # bit-identical
        assert {k: v for k, v in a.items() if k != "seconds"} == pytest.approx(
            {k: v for k, v in b.items() if k != "seconds"}, rel=0, abs=0, nan_ok=True
        )
    weights = [rl_checkpoint.load(d / "checkpoint.pt")["model"] for d in (out, straight)]
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[1])


def test_cli_resume_refuses_a_checkpoint_of_other_options_and_keeps_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    common = [
        "--length",
        "3",
        "--batch-size",
        "4",
        "--eval-every",
        "2",
        "--test-size",
        "20",
        "--no-stop-when-solved",
        "--out",
        str(out),
    ]
    assert copy_cli.main([*common, "--hidden", "8", "--train-steps", "2"]) == 0
    kept = {
        name: (out / name).read_bytes() for name in ("config.json", "checkpoint.pt", "results.json")
    }
    # another width, another readout, another seed: each is a different experiment
    for change in (
        ["--hidden", "16"],
        ["--hidden", "8", "--readout-hidden", "4"],
        ["--hidden", "8", "--seed", "1"],
    ):
        assert copy_cli.main([*common, *change, "--train-steps", "4", "--resume"]) == 2
        err = capsys.readouterr().err
        assert "trained with other options" in err and change[-2] in err
        assert {name: (out / name).read_bytes() for name in kept} == kept
    # a longer budget and a new learning rate are a continuation
    assert (
        copy_cli.main([*common, "--hidden", "8", "--train-steps", "4", "--lr", "1e-3", "--resume"])
        == 0
    )
    meta = json.loads((out / "config.json").read_text())
    assert meta["config"]["train_steps"] == 4
    assert [m["config"]["train_steps"] for m in meta["earlier_invocations"]] == [2]


def test_resume_mismatch_treats_options_a_checkpoint_predates_as_defaults():
    cfg = ct.CopyConfig(length=3, hidden=8)
    saved = dataclasses.asdict(cfg)
    del saved["readout_hidden"]
    assert ct.resume_mismatch(saved, cfg) == []
    assert ct.resume_mismatch(saved, dataclasses.replace(cfg, readout_hidden=4)) == [
        "--readout-hidden 0 -> 4"
    ]
    assert ct.resume_mismatch(saved, dataclasses.replace(cfg, train_steps=9, lr=1.0)) == []


def test_mlp_readout_sits_outside_the_recurrence():
    torch.manual_seed(0)
    linear = ct.CopyModel(8, "rtrl")
    mlp = ct.CopyModel(8, "rtrl", readout_hidden=5)
    mlp.core.load_state_dict(linear.core.state_dict())
    x = torch.nn.functional.one_hot(torch.randint(0, 3, (6, 2)), 3).float()
    h_lin, _ = linear.core(x, linear.initial_state(2))
    h_mlp, _ = mlp.core(x, mlp.initial_state(2))
    assert torch.equal(h_lin, h_mlp)
    logits, _ = mlp(x, mlp.initial_state(2))
    assert logits.shape == (6, 2, 2)
    assert torch.allclose(logits, mlp.readout[2](torch.relu(mlp.readout[0](h_mlp))))
    assert sum(p.numel() for p in mlp.readout.parameters()) == 8 * 5 + 5 + 5 * 2 + 2


@pytest.mark.parametrize(
    "args",
    [
        ["--length", "0"],
        ["--rule", "snap"],
        ["--readout-hidden", "-1"],
        ["--online", "--rule", "bptt"],
        ["--segment", "0"],
        ["--hidden", "0"],
        ["--online", "--segment", "5"],
        ["--lr", "0"],
        ["--lr-final", "-1"],
        ["--core", "lstm"],
        ["--core", "gru", "--rule", "rtrl"],
        ["--core", "fwp", "--chrono-init"],
        ["--dtype", "float16"],
    ],
)
def test_cli_rejects_bad_options_and_writes_nothing(tmp_path, capsys, args):
    out = tmp_path / "run"
    assert copy_cli.main([*args, "--out", str(out)]) == 2
    assert "r2ac copy:" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("core", ["elstm", "lstm"])
def test_float64_runs_train_and_evaluate_in_float64(core):
    cfg = ct.CopyConfig(
        length=3,
        hidden=6,
        batch_size=4,
        train_steps=2,
        eval_every=2,
        segment=2,
        test_size=10,
        dtype="float64",
        core=core,
        rule="rtrl" if core == "elstm" else "bptt",
    )
    model, result = ct.train(cfg)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    # the same seed in float32 starts from the same weights and scores the same untrained model
    _, result32 = ct.train(dataclasses.replace(cfg, dtype="float32", train_steps=0))
    assert result.curve[0]["test_loss"] == pytest.approx(result32.curve[0]["test_loss"], rel=1e-5)
    assert result.steps == 2 and 0.0 <= result.final["bit_accuracy"] <= 1.0


@pytest.mark.parametrize("core, rule", [("lstm", "bptt"), ("fwp", "rtrl"), ("elman", "rtrl")])
def test_other_cores_as_diagnostics(tmp_path, core, rule):
    """--core swaps the recurrent layer; exact rules keep the full-BPTT gradient over chunks."""
    out = tmp_path / "run"
    rc = copy_cli.main(
        [
            "--core",
            core,
            "--rule",
            rule,
            "--length",
            "3",
            "--hidden",
            "6",
            "--batch-size",
            "4",
            "--train-steps",
            "2",
            "--eval-every",
            "2",
            "--segment",
            "2",
            "--test-size",
            "10",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert json.loads((out / "results.json").read_text())["core"] == core
    if rule == "rtrl":  # chunks of 2 under rtrl == one whole-sequence BPTT
        b = batch(seed=3, B=4, max_len=4)
        b = ct.CopyBatch(b.x.double(), *b[1:])
        grads = {}
        for r, seg in ((rule, 2), ("bptt", None)):
            torch.manual_seed(0)
            model = ct.CopyModel(5, r, core=core).double()
            ct.sequence_update(model, torch.optim.SGD(model.parameters(), lr=0.0), b, seg, clip=0.0)
            grads[r] = _grads(model)
        for n, g in grads["bptt"].items():
            torch.testing.assert_close(grads[rule][n], g, rtol=1e-9, atol=1e-11)


def test_a_finished_run_records_its_capacity_and_recipe(tmp_path):
    """results.json holds the capacity figures and config.json the options it does not repeat
    (lr_final, dtype): what a table of capacity against width reads from each run."""
    out = tmp_path / "n16"
    argv = ["--length", "4", "--hidden", "16", "--train-steps", "0", "--test-size", "20",
            "--lr", "1e-2", "--lr-final", "1e-3", "--dtype", "float64", "--out", str(out)]  # fmt: skip
    assert copy_cli.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    for key in ("core", "rule", "hidden", "batch_size", "lr", "train_steps", "length",
                "longest_all_right", "bit_accuracy", "sequence_accuracy", "train_seconds"):  # fmt: skip
        assert key in result, key
    assert result["hidden"] == 16 and result["length"] == 4 and result["train_steps"] == 0
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["lr_final"] == 1e-3 and config["dtype"] == "float64"
