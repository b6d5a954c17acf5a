"""scripts/recall_probe.py: which steps of a segment have a target, and the online mode runs."""

from __future__ import annotations

import subprocess
import sys

import torch

from .scripts import SCRIPTS, load_script

SCRIPT = SCRIPTS / "recall_probe.py"


def _script():
    return load_script("recall_probe")


def test_each_step_answers_the_symbol_lag_steps_back_and_early_steps_have_none():
    script = _script()
    K, B = 4, 3
    symbols = torch.randint(0, K, (12, B), generator=torch.Generator().manual_seed(0))
    answers = torch.full((12, B, K), -30.0)
    answers[3:].scatter_(-1, symbols[:9, :, None], 30.0)  # step t says symbols[t - 3]
    loss, correct, count = script.cross_entropy_on_targets(answers[0:4], symbols, 0, 3)
    assert (correct, count) == (B, B) and loss.item() < 1e-12  # only local step 3 has a target
    loss, correct, count = script.cross_entropy_on_targets(answers[4:8], symbols, 4, 3)
    assert (correct, count) == (4 * B, 4 * B) and loss.item() < 1e-12
    wrong = script.cross_entropy_on_targets(answers[4:8].roll(1, 0), symbols, 4, 3)
    assert wrong[1] < wrong[2] and wrong[0].item() > 1.0  # answers one step late are scored wrong
    assert script.cross_entropy_on_targets(answers[0:4], symbols, 0, 5) is None


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_the_online_mode_trains_segment_by_segment_with_several_passes():
    done = run("elstm-rtrl", "3", "8", "2", "--segment", "4", "--passes", "2", "--length", "12")
    assert done.returncode == 0, done.stderr
    # 3 segments of 4 steps a batch, 2 passes each: 6 updates a batch, batches 0..2
    assert "M=4 passes=2 batch 2 (18 updates)" in done.stdout
    assert "running accuracy >= 0.99 over 20 batches: not reached" in done.stdout


def test_the_first_order_start_runs_and_bad_combinations_are_refused():
    done = run("elstm-rtrl", "3", "8", "1", "--segment", "4", "--passes", "2", "--start-correction")
    assert done.returncode == 0 and "passes=2 corrected batch 1" in done.stdout, done.stderr
    done = run("elstm-rtrl", "3", "8", "2", "--passes", "2")
    assert done.returncode == 2 and "--passes > 1 needs --segment" in done.stderr
    done = run("gru-bptt", "3", "8", "2", "--segment", "4", "--passes", "2", "--start-correction")
    assert done.returncode == 2 and "not gru-bptt" in done.stderr


def test_the_policy_gradient_rewards_the_symbol_lag_steps_back():
    script = _script()
    K, B, lag = 4, 2000, 3
    torch.manual_seed(0)  # the actions are sampled
    symbols = torch.randint(0, K, (8, B))
    sure = torch.full((4, B, K), -30.0)
    sure.scatter_(-1, symbols[1:5, :, None], 30.0)  # local steps 0..3 = global 4..7 say t - 3
    loss, correct, count = script.policy_gradient_on_targets(sure, symbols, 4, lag, 0.01)
    # every sampled action right: reward +1 everywhere, advantage 0, entropy ~0
    assert (correct, count) == (4 * B, 4 * B) and abs(loss.item()) < 1e-9
    uniform = torch.zeros(4, B, K, requires_grad=True)
    loss, correct, count = script.policy_gradient_on_targets(uniform, symbols, 4, lag, 0.0)
    loss.backward()
    targets = symbols[1:5]
    on_target = uniform.grad.gather(-1, targets[..., None]).squeeze(-1)  # (4, B)
    # a descent step raises the target's logit and lowers the others' (on average)
    assert on_target.mean() < -1e-5 and (uniform.grad.sum(-1).abs().max() < 1e-9)
    assert script.policy_gradient_on_targets(uniform[:2], symbols, 0, 3, 0.0) is None


def test_the_policy_gradient_mode_runs():
    done = run("elstm-rtrl", "3", "8", "2", "--segment", "4", "--length", "12", "--policy-gradient")
    assert done.returncode == 0, done.stderr
    assert "passes=1 policy-gradient batch 2 (9 updates)" in done.stdout


def test_forget_spans_are_one_over_one_minus_the_mean_forget_gate():
    from r2ac.rtrl.registry import make_core

    script = _script()
    core = make_core("elstm-rtrl", 5, 3)
    with torch.no_grad():
        core.F.zero_()
        core.w_f.zero_()
        core.b_f.copy_(torch.tensor([1.0, 9.0, 99.0]).log())  # f = 1/2, 9/10, 99/100
    features = torch.randn(14, 2, 5)  # (T, B, D)
    spans = script.forget_spans(core, features)
    torch.testing.assert_close(spans, torch.tensor([2.0, 10.0, 100.0]), rtol=1e-4, atol=0)


def test_the_stem_norm_mode_runs_and_reports_the_spans():
    done = run(
        "elstm-rtrl",
        "3",
        "8",
        "2",
        "--segment",
        "4",
        "--length",
        "14",
        "--policy-gradient",
        "--stem-norm",
    )
    assert done.returncode == 0, done.stderr
    assert "policy-gradient stem-norm batch 2 (12 updates)" in done.stdout
    assert " spans " in done.stdout and " |x| " in done.stdout
