"""Signal and noise of a learner's gradient: exact RTRL against TBPTT on the same batches.

Restores a training checkpoint of a run whose core carries sensitivities (elstm-rtrl,
rtu-rtrl, ...; the actors' states, sensitivities included, come with it), then collects
BATCHES batches with the weights held fixed and takes, on each, the first pass's gradient of
the learner's loss over the whole batch twice, from the same stored start state: with the
history term `d_hat(t0) . S(t0)` (exact RTRL) and without it (BPTT truncated at the segment
start, what rule "bptt" gives on the same weights and inputs; `core.without_history()`).
Their difference is the history term.

For each parameter group (core, stem, heads) and each of RTRL, TBPTT and the history term it
prints the signal |E g|^2 (debiased: the squared mean less tr(Cov) / BATCHES), the noise
tr(Cov) of one batch's gradient, their ratio (one batch's signal-to-noise), and the cosine
between the RTRL and TBPTT mean gradients. Batches follow each other in the same streams, so
they are not independent: the noise is that of the gradients the learner actually steps on.

    python scripts/gradient_noise.py CHECKPOINT [BATCHES] [--term loss|policy|value|entropy]

CHECKPOINT: a run's `checkpoints/latest.pt` or a copy of it (its config is inside), of a PPO
run (`--preset popgym`); the targets are those of the batch's own no-grad forward (the first
pass: ratio 1); --term takes one of the loss's terms (each with its coefficient).
"""

from __future__ import annotations

import argparse
import math
import statistics
from contextlib import nullcontext

import torch

from r2ac.rl.config import from_dict, validate
from r2ac.rl.run_dir import REQUIRED_FIELDS, TRAINING_CHECKPOINT
from r2ac.rl.train_cli import make_runtime
from r2ac.runs import checkpoint

RULES = ("rtrl", "tbptt", "history")
SPLIT = ("all", "steady", "boundary")


def parameter_groups(agent) -> dict[str, list[torch.nn.Parameter]]:
    """core / stem / heads: every trainable parameter in exactly one group."""
    core = {id(p) for p in agent.core.parameters()}
    stem = {id(p) for p in agent.stem.parameters()} - core
    groups = {"core": [], "stem": [], "heads": []}
    for p in agent.parameters():
        if p.requires_grad:
            key = "core" if id(p) in core else "stem" if id(p) in stem else "heads"
            groups[key].append(p)
    return groups


def flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]
    )


# --term: the key of each term in `ppo_losses` (each with its coefficient)
TERMS = {"loss": "loss", "policy": "pg_loss", "value": "baseline_loss", "entropy": "entropy_loss"}


def batch_gradients(runtime, seg, term: str, groups) -> dict[str, dict[str, torch.Tensor]]:
    """{rule: {group: flat gradient}} of `term` on the whole batch `seg` (the first pass)."""
    learner, core = runtime.learner, runtime.agent.core
    targets = learner.prepare(seg)
    M = seg.actions.shape[0]
    out = {}
    for rule in ("rtrl", "tbptt"):
        runtime.agent.zero_grad(set_to_none=True)
        state = seg.state if rule == "rtrl" else core.light_state(seg.state)
        with core.without_history() if rule == "tbptt" else nullcontext():
            logits, values, _, entropy_logits = runtime.agent(
                seg.obs[:M], seg.last_reward[:M], seg.reset[:M], state, carry=False,
                last_action=seg.last_action[:M], entropy_params=True,
                episode_step=seg.episode_step[:M],
            )  # fmt: skip
            losses = learner.ppo_loss(
                logits, values, seg, targets, keep_graph=True, entropy_logits=entropy_logits
            )
            losses[TERMS[term]].backward()
        out[rule] = {name: flat_grad(params) for name, params in groups.items()}
    out["history"] = {g: out["rtrl"][g] - out["tbptt"][g] for g in groups}
    return out


def summarise(grads: list[torch.Tensor]) -> tuple[float, float]:
    """(debiased |E g|^2, tr Cov) of one batch's gradient, from K batches' gradients."""
    g = torch.stack(grads).double()  # (K, P)
    k = g.shape[0]
    mean = g.mean(0)
    noise = float(((g - mean) ** 2).sum(1).sum() / (k - 1))
    signal = float(mean.pow(2).sum()) - noise / k
    return signal, noise


def cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    ma, mb = torch.stack(a).double().mean(0), torch.stack(b).double().mean(0)
    return float(ma @ mb / (ma.norm() * mb.norm() + 1e-30))


def report(per: dict, groups, title: str) -> None:
    """One table of `per[rule][group]` (lists of flat gradients) under `title`."""
    k = len(per["rtrl"]["core"])
    if k < 2:
        print(f"{title}: {k} batch(es), too few for a variance")
        return
    print(f"{title}, {k} batches:")
    print("| group | rule | mean abs(g) | signal abs(E g)^2 | noise tr Cov | signal / noise |")
    print("|---|---|---|---|---|---|")
    for g in groups:
        for rule in RULES:
            signal, noise = summarise(per[rule][g])
            norm = statistics.fmean(float(x.norm()) for x in per[rule][g])
            ratio = signal / noise if noise > 0 else math.nan
            print(f"| {g} | {rule} | {norm:.3e} | {signal:.3e} | {noise:.3e} | {ratio:.4f} |")
    cos = ", ".join(f"{g} {cosine(per['rtrl'][g], per['tbptt'][g]):.3f}" for g in groups)
    print(f"cosine(E g_rtrl, E g_tbptt): {cos}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("batches", type=int, nargs="?", default=100)
    parser.add_argument("--term", default="loss", choices=tuple(TERMS))
    parser.add_argument(
        "--warmup", type=int, default=16, help="batches collected first, without gradients"
    )
    args = parser.parse_args()
    if args.batches < 2 or args.warmup < 0:
        parser.error("BATCHES >= 2 (the noise is a variance over batches), --warmup >= 0")
    payload = checkpoint.load(
        args.checkpoint, expect=TRAINING_CHECKPOINT, what="training checkpoint"
    )
    cfg = validate(from_dict(payload["config"], require=REQUIRED_FIELDS))
    if cfg.loss.algorithm != "ppo":
        parser.error("the run's learner is IMPALA: this script takes PPO's first pass")
    runtime = make_runtime(cfg, None)
    if not runtime.agent.core.carries_sensitivities:
        parser.error(f"{cfg.model.core}: no sensitivities to compare (give an RTRL core's run)")
    runtime.restore(payload)
    runtime.start()
    for _ in range(args.warmup):  # the envs restart their episodes on a restore
        runtime.next_batch()
    groups = parameter_groups(runtime.agent)
    # batches with an episode boundary inside, and the others: fixed-length episodes keep
    # every stream in step, and the boundary batches' gradients are many times the others'
    split = {kind: {rule: {g: [] for g in groups} for rule in RULES} for kind in SPLIT}
    for _ in range(args.batches):
        seg = runtime.next_batch().segment
        boundary = bool(seg.reset[1:].any() | seg.terminated.any() | seg.truncated.any())
        grads = batch_gradients(runtime, seg, args.term, groups)
        for kind in ("all", "boundary" if boundary else "steady"):
            for rule in RULES:
                for g in groups:
                    split[kind][rule][g].append(grads[rule][g])
    update = payload["counters"].get("update", "?")
    print(f"{cfg.model.core} {cfg.env.id} update {update}: term {args.term}")
    for kind in SPLIT:
        report(split[kind], groups, f"{kind} batches")


if __name__ == "__main__":
    main()
