"""Supervised probe: can a core output the symbol seen `lag` steps ago (the memory of POPGym's
RepeatPrevious) through R2AC's stem -> core -> linear readout? Adam.

Two modes:
- whole sequences (default): one update per batch of sequences, the core run over all
  `--length` steps as one segment (its "bptt" rule inside one segment is exact BPTT);
- online (`--segment M`): each batch of sequences is cut into segments of M steps and the
  weights are updated after every segment, as R2AC's learner does: the state enters each
  segment carried from the last (with an "-rtrl" core its sensitivities too, so the gradient
  reaches every earlier step of the sequence; with "-bptt" it stops at the segment start).
  `--passes K` updates K times on each segment from the same start state, as PPO's epochs
  do: the start state (and its sensitivities) was carried under the weights before the
  segment's first update, so passes 2..K see it stale (docs/rules/passes.md). The next
  segment starts from the state carried under those same weights (an actor's).
  `--start-correction` (eLSTM with RTRL): passes 2..K start from c(t0) + S(t0) . (theta -
  theta at the first pass), the start state to first order under the current weights.

    python scripts/recall_probe.py elstm-bptt 3 128 2000                 # core, lag, N, batches
    python scripts/recall_probe.py elstm-rtrl 3 128 300 --segment 4 --passes 4

`--policy-gradient` replaces the supervised loss by the policy gradient of POPGym's reward
(REINFORCE, one sampled action a step, reward +1 for the right symbol and -1 for a wrong one,
the batch's mean reward as baseline, entropy bonus `--entropy-cost`): the signal an RL agent
gets, without a critic, PPO or credit assignment across steps (each step's reward is its own).
The accuracy printed is the greedy action's.

    python scripts/recall_probe.py elstm-rtrl 3 128 2000 --segment 4 --policy-gradient

`--stem-norm` puts a LayerNorm on the stem's features before the core, as `r2ac train
--stem-norm` does. With an eLSTM core each report also gives the scale of the stem's features
(mean |x|) and the quantiles 10/50/90 % of the cells' memory spans 1 / (1 - mean f) over a
fresh batch: exact RTRL under the policy gradient without the norm lets the features grow
until the forget gates saturate (spans of 1 and of thousands of steps), docs/rl.md "The
stem's scale".

    python scripts/recall_probe.py elstm-rtrl 3 128 300 --segment 4 --policy-gradient --stem-norm

Prints loss and accuracy (every step with a target; online: of each segment's first pass,
before its update) five times during training, and the first batch at which the running
accuracy over 20 batches reached 99%.
"""

from __future__ import annotations

import argparse
import time

import torch

from r2ac.rtrl.registry import make_core

SOLVED = 0.99  # running accuracy that counts as holding the recall
WINDOW = 20  # batches in the running accuracy


def scored_steps(logits, symbols, start: int, lag: int):
    """The steps start.. of `logits` (T', B, K) that have a target (global step t >= lag
    answers symbols[t - lag]) and their targets: (logits (T'', B, K), targets (T'', B)), or
    None where the segment has none."""
    T = logits.shape[0]
    first = max(0, lag - start)  # first local step with a target
    if first >= T:
        return None
    steps = torch.arange(start + first, start + T)
    return logits[first:], symbols[steps - lag]


def cross_entropy_on_targets(logits, symbols, start: int, lag: int):
    """Loss and correct count of the steps of `logits` that have a target (`scored_steps`);
    None where the segment has none."""
    scored = scored_steps(logits, symbols, start, lag)
    if scored is None:
        return None
    out, targets = scored
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
    return loss, (out.argmax(-1) == targets).sum().item(), targets.numel()


def policy_gradient_on_targets(logits, symbols, start: int, lag: int, entropy_cost: float):
    """REINFORCE on the steps of `logits` (T', B, K) that have a target: one action sampled a
    step, reward +1 if it is the symbol `lag` steps back, else -1, minus the mean reward of
    those steps (the baseline); minus `entropy_cost` x the mean entropy. Returns the loss, the
    greedy action's correct count and the number of scored steps; None where nothing is scored."""
    scored = scored_steps(logits, symbols, start, lag)
    if scored is None:
        return None
    out, targets = scored
    policy = torch.distributions.Categorical(logits=out)
    actions = policy.sample()  # (T'', B)
    reward = (actions == targets).to(logits.dtype) * 2.0 - 1.0
    advantage = reward - reward.mean()
    loss = -(policy.log_prob(actions) * advantage).mean() - entropy_cost * policy.entropy().mean()
    return loss, (out.argmax(-1) == targets).sum().item(), targets.numel()


@torch.no_grad()
def forget_spans(core, features) -> torch.Tensor:
    """Each eLSTM cell's memory span 1 / (1 - mean f(t)) over `features` (T, B, D), the
    steps after the first 10 (past the zero start state); sorted, (N,)."""
    from r2ac.rtrl.elstm import math as em

    N = core.hidden_size
    pre = torch.nn.functional.linear(
        features, torch.cat([core.F, core.Z]), torch.cat([core.b_f, core.b_z])
    )  # (T, B, 2N)
    c0 = features.new_zeros(features.shape[1], N)
    _, gates = em.recurrence_steps(pre[..., :N], pre[..., N:], core.w_f, core.w_z, c0, None)
    return (1.0 / (1.0 - gates.f[10:].mean((0, 1)))).sort().values


def gate_report(core, stem, K: int, T: int) -> str:
    """The stem's feature scale and the forget spans' quantiles on a fresh batch of 256
    sequences (eLSTM cores; '' for the others)."""
    if not hasattr(core, "w_f"):
        return ""
    with torch.no_grad():
        symbols = torch.randint(0, K, (T, 256), generator=torch.Generator().manual_seed(1))
        x = stem(torch.nn.functional.one_hot(symbols, K).float())  # (T, 256, D)
    spans = forget_spans(core, x)
    q = [spans[int(f * (len(spans) - 1))].item() for f in (0.1, 0.5, 0.9)]
    return f" |x| {x.abs().mean():.2f} spans {q[0]:.1f}/{q[1]:.1f}/{q[2]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("core")
    parser.add_argument("lag", type=int)
    parser.add_argument("hidden", type=int)
    parser.add_argument("updates", type=int, help="batches of sequences")
    parser.add_argument("--symbols", type=int, default=4)
    parser.add_argument("--length", type=int, default=52)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--segment", type=int, default=0, help="M; 0: whole sequences")
    parser.add_argument("--passes", type=int, default=1, help="updates per segment (online)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-correction", action="store_true")
    parser.add_argument("--policy-gradient", action="store_true", help="REINFORCE, not labels")
    parser.add_argument("--entropy-cost", type=float, default=0.01)
    parser.add_argument("--stem-norm", action="store_true", help="LayerNorm on the features")
    args = parser.parse_args()
    if args.segment < 0 or args.passes < 1 or (args.passes > 1 and not args.segment):
        parser.error("--segment >= 0 and --passes >= 1; --passes > 1 needs --segment")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    K, T, B = args.symbols, args.length, args.batch
    M = args.segment or T
    stem = torch.nn.Sequential(
        torch.nn.Linear(K, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        *([torch.nn.LayerNorm(64)] if args.stem_norm else []),
    )
    core = make_core(args.core, 64, args.hidden)
    if args.start_correction and not (core.has_first_order_start and core.carries_sensitivities):
        parser.error(
            f"--start-correction needs sensitivities to move the state by, not {args.core}"
        )
    head = torch.nn.Linear(args.hidden, K)
    params = [*stem.parameters(), *core.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=args.lr)
    start_time = time.perf_counter()
    recent: list[float] = []
    solved_at = None
    steps = 0
    for update in range(args.updates + 1):
        symbols = torch.randint(0, K, (T, B))  # (T, B)
        x = torch.nn.functional.one_hot(symbols, K).float()  # (T, B, K)
        state = core.initial_state(B)
        loss_sum, correct, count = 0.0, 0, 0
        for start in range(0, T, M):
            x_seg = x[start : start + M]
            # the actor's carry: the next start state under the weights before this
            # segment's updates (leaves `state` intact for the passes)
            next_state = core.advance_state(stem(x_seg).detach(), state) if M < T else None
            snapshot = core.recurrent_snapshot() if args.start_correction else None
            for k in range(args.passes):
                start_state = state
                if snapshot is not None and k > 0:  # c(t0) + S(t0) . (theta - snapshot)
                    start_state = core.first_order_start(state, snapshot)
                h, _ = core(stem(x_seg), start_state, carry=False)  # (M, B, N)
                if args.policy_gradient:
                    got = policy_gradient_on_targets(
                        head(h), symbols, start, args.lag, args.entropy_cost
                    )
                else:
                    got = cross_entropy_on_targets(head(h), symbols, start, args.lag)
                if got is None:
                    break
                loss, right, n = got
                if k == 0:  # scored before the segment's first update
                    loss_sum += loss.item() * n
                    correct, count = correct + right, count + n
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
            state = next_state
        accuracy = correct / count
        recent = [*recent[-(WINDOW - 1) :], accuracy]
        if solved_at is None and len(recent) == WINDOW and sum(recent) / WINDOW >= SOLVED:
            solved_at = update
        if update % max(1, args.updates // 5) == 0:
            print(
                f"{args.core} lag={args.lag} N={args.hidden} M={M} passes={args.passes}"
                f"{' corrected' if args.start_correction else ''}"
                f"{' policy-gradient' if args.policy_gradient else ''}"
                f"{' stem-norm' if args.stem_norm else ''} "
                f"batch {update} ({steps} updates) loss {loss_sum / count:.3f} accuracy "
                f"{accuracy:.3f}{gate_report(core, stem, K, T)} "
                f"({time.perf_counter() - start_time:.0f} s)",
                flush=True,
            )
    where = "not reached" if solved_at is None else f"batch {solved_at}"
    print(f"running accuracy >= {SOLVED} over {WINDOW} batches: {where}")


if __name__ == "__main__":
    main()
