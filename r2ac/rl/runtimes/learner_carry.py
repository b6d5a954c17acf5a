"""The learner carries the RTRL sensitivities of every actor's streams (`sensitivity_carry
learner`, the ray runtime's default).

The reference way (`actor`) has each actor carry its streams' full core state and ship the
start state, sensitivities included, with every segment: for the eLSTM 2 B N D + 4 B N
floats, 97% of a segment's bytes at the default sizes (docs/results.md), which pushes every
segment through Ray's shared-memory store. Here the actors act and carry the light state
only (the cell state), and the learner keeps, for every actor, the sensitivities of its
streams after the last segment it took from it:

    start(S)  = the actor's light start state, with the learner's carried sensitivities
                (zero when the actor's streams (re)started: its first segment)
    carried'  = advance_state over the segment's first M steps from start(S), with the
                learner's weights of the moment (no gradient)

`advance_state` is the core's own carry (for the eLSTM the segment-wise carry of
docs/rules/rtrl.md): the same computation the actor would have run, on the learner, with
weights that are as fresh as the learner's and never staler than the actor's. With equal
weights (lr 0, or the serial order) the result equals the actor's carry to rounding
(tests/rl/test_learner_carry.py). The light cell state always comes from the actor, whose
trajectory the segment's actions followed.

Each actor's segments must arrive in order with none skipped (true of Ray: one actor's
calls run and answer in order; a restarted actor's streams start over with seq 1). A gap
(a segment lost with its actor still alive) cannot be carried over: that actor's streams
then start from zero sensitivities (the gradient of their history before the gap is
dropped, as TBPTT would) and a warning says so.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from r2ac.rl.learning.actor import Segment
from r2ac.rl.model.agent import Agent
from r2ac.rl.runtimes.base import segment_to

log = logging.getLogger(__name__)


class LearnerCarry:
    """Per actor: the (epoch, seq) of the last segment taken and its streams' sensitivities
    after it (computed here)."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.carried: dict[int, tuple[tuple[int, int], Any]] = {}  # actor -> ((epoch, seq), sens)
        self.gaps = 0  # segments whose predecessor never arrived

    @property
    def active(self) -> bool:
        """False for cores without sensitivities (their light state is their whole state)."""
        return self.agent.core.carries_sensitivities

    @torch.no_grad()
    def complete(self, actor: int, epoch: int, seq: int, seg: Segment) -> Segment:
        """`seg` (light start state, from `actor`'s `seq`-th segment since its streams
        (re)started in `epoch`) with the full start state; carries the sensitivities to the
        segment's end for the actor's next one."""
        if not self.active:
            return seg
        seg = segment_to(seg, next(self.agent.parameters()).device)
        sens = self._start_sensitivities(actor, epoch, seq, seg.actions.shape[1])
        start = seg.state._replace(sens=sens)  # the actor's cell state, our sensitivities
        M = seg.actions.shape[0]
        x = self.agent.core_input(
            seg.obs[:M], seg.last_reward[:M], seg.reset[:M], seg.last_action[:M]
        )  # (M, B, D)
        end = self.agent.core.advance_state(x, start, reset=seg.reset[:M])
        self.carried[actor] = ((epoch, seq), end.sens)
        return seg._replace(state=start)

    def _start_sensitivities(self, actor: int, epoch: int, seq: int, batch_size: int) -> Any:
        """The actor's carried sensitivities if this segment follows the last one taken from
        it; zero ones for the first segment of its streams, and after a gap (with a warning)."""
        previous = self.carried.get(actor)
        if seq > 1 and previous is not None and previous[0] == (epoch, seq - 1):
            return previous[1]
        if seq > 1:
            self.gaps += 1
            log.warning(
                "learner carry: actor %d's segment %d arrived after %s; its streams restart "
                "from zero sensitivities",
                actor,
                seq,
                f"segment {previous[0][1]}" if previous else "none",
            )
        return self.agent.initial_state(batch_size, True).sens  # zero, on the agent's device
