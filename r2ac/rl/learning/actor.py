"""The actor: steps a batched env with the agent (no grad) and emits segments of M steps.

Segment layout (time-major, M steps, B streams; see docs/rl.md):

    obs              (M+1, B, ...)  obs[t] is what action t was taken on; obs[M] bootstraps
    last_reward      (M+1, B)       raw reward received before obs[t]; 0 where reset[t]
    last_action      (M+1, B, *S)   action taken before obs[t]; 0 where reset[t]
    reset            (M+1, B) bool  obs[t] is the first observation of an episode
    actions          (M, B, *S)     S = action_space.action_shape: () for Discrete; int64,
                                    or the agent's float dtype for a Box (unclipped samples)
    rewards          (M, B)         raw (the learner clips)
    terminated       (M, B) bool
    truncated        (M, B) bool    time-limit ends (bootstrapped, not terminal)
    behaviour_logits (M, B, P)      the acting policy's distribution parameters (logits;
                                    a Gaussian's means and log-stds), r2ac/rl/model/distributions.py
    final_values     (M, B)         V(final_obs) at truncation steps, 0 elsewhere
    state                           the core state of the B streams before obs[0]

Core-state flow: the actor carries every stream's full core state across segments. It acts
with `core.light_state(start)` (for RTRL cores the state without sensitivities) through
`core.act`, which also returns a trace of each step, and at the segment end brings the full
state up to date with `core.carry_traces(start, traces)`: the segment-wise carry, computed
from what the steps already computed (the eLSTM's gates, the RTU's and LRU's input maps and
previous states) instead of re-running the recurrence. A core without such traces re-runs
it once over the recorded inputs (`advance_state`); a core with nothing to drop has carried
its full state while acting. The sensitivities therefore accumulate over the stream's whole
history since its last reset, computed with the actor's weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.envs.base import BatchedEnv
from r2ac.rl.model.agent import Agent
from r2ac.rl.model.distributions import action_dtype, zero_where
from r2ac.rtrl.state import cat_streams, plain_state, select_streams, state_from_plain
from r2ac.runs.plain import from_numpy, to_numpy


class Segment(NamedTuple):
    obs: torch.Tensor
    last_reward: torch.Tensor
    last_action: torch.Tensor
    reset: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    behaviour_logits: torch.Tensor
    final_values: torch.Tensor
    state: Any


@dataclass
class EpisodeLog:
    """Episodes that ended during a segment (for logging only)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


def cat_segments(segments: list[Segment], state: Any = None) -> Segment:
    """Join segments of different streams along the batch dim (dim 1; the state's dim 0).
    `state`: their start states already joined (`StateSlots.joined`), taken as it is."""
    if len(segments) == 1:
        return segments[0]
    tensors = [torch.cat(parts, dim=1) for parts in zip(*[s[:-1] for s in segments])]
    if state is None:
        state = cat_streams([s.state for s in segments])
    return Segment(*tensors, state)


class StateSlots:
    """Two batch buffers of core state, each holding the streams of all `num_actors` actors
    side by side, and every actor's slice of both (its `carry_slots`).

    The actors carry into their slices in turn, so the start states of one batch's segments
    lie in one buffer: `joined` hands it over whole, instead of a join that copies every
    stream's state (for the eLSTM's sensitivities, B x 2N x D floats an update). A batch
    is done with before the actors write into its buffer again: the serial runtime's order
    (collect, update, collect, ...). `count=1`: one buffer, for actors that carry in place
    after the update (`Actor(defer_carry=True)`)."""

    def __init__(self, agent: Agent, streams_per_actor: int, num_actors: int, count: int = 2):
        B = streams_per_actor
        self.buffers = [agent.initial_state(B * num_actors) for _ in range(count)]
        self.slots = [
            tuple(select_streams(buf, slice(i * B, (i + 1) * B)) for buf in self.buffers)
            for i in range(num_actors)
        ]

    def joined(self, states: list[Any]) -> Any:
        """The buffer whose slices `states` are, in order; None if they are not (then the
        caller joins them: the first batch, and the first after a resume)."""
        for k, buffer in enumerate(self.buffers):
            if all(state is slot[k] for state, slot in zip(states, self.slots, strict=True)):
                return buffer
        return None


class Actor:
    """Steps `env` with `agent` and carries each stream's core state across segments.

    `sensitivities=False`: the actor carries the light state only (no RTRL sensitivities),
    and its segments' start states are light; a learner that carries the sensitivities
    itself (r2ac/rl/runtimes/learner_carry.py) completes them.

    `carry_slots`: full states of the actor's streams (slices of its runtime's batch
    buffers, `StateSlots`) that the segment-wise carry writes into, so that the runtime finds
    the actors' start states already side by side. Two, written in turn: the state a segment
    starts from is never written while that segment is in use (until the next collect).

    `defer_carry` (with a core that `defers_carry`, and carry slots): `collect` keeps the
    traces and the weights it acted with, and the carry runs at `finish_carry`, which the
    serial runtime calls once the learner is done with the batch: in place over the segment's
    start state, in the first slot (one buffer, not two: the carry writes the lines it has
    just read, not a second buffer's). The same numbers as carrying at once. The segment's start
    state then holds the carried state: a batch is used up by its update."""

    def __init__(
        self,
        agent: Agent,
        env: BatchedEnv,
        seed: int,
        unroll_length: int,
        sensitivities: bool = True,
        carry_slots: tuple[Any, ...] | None = None,
        defer_carry: bool = False,
    ):
        self.agent, self.env, self.unroll_length = agent, env, unroll_length
        self.dtype = next(agent.parameters()).dtype
        self.generator = torch.Generator().manual_seed(seed)
        B, self.space = env.num_envs, agent.action_space
        self.action_dtype = action_dtype(self.space, self.dtype)
        self.obs = torch.from_numpy(env.reset(seed=seed))  # (B, ...)
        self.last_reward = torch.zeros(B, dtype=self.dtype)  # (B,)
        self.last_action = torch.zeros(
            (B, *self.space.action_shape), dtype=self.action_dtype
        )  # (B, *S)
        self.reset = torch.ones(B, dtype=torch.bool)  # (B,)
        self.state = agent.initial_state(B, None if sensitivities else False)
        self.carry_slots, self.defer_carry = carry_slots, defer_carry
        if defer_carry and (carry_slots is None or not agent.core.defers_carry):
            raise ValueError(
                f"defer_carry needs carry slots and a core that defers its carry "
                f"({type(agent.core).__name__}.defers_carry is {agent.core.defers_carry})"
            )
        self._pending: tuple[Any, list, Any] | None = None  # start, traces, carry weights

    def segment_buffers(self) -> dict[str, torch.Tensor]:
        """Empty tensors of one segment's fields (M+1 inputs, M actions and outcomes): what
        `collect` fills, and what a runtime sizes its shared slots by."""
        M, B, P = self.unroll_length, self.env.num_envs, self.space.param_size
        f, S = {"dtype": self.dtype}, self.space.action_shape
        return {
            "obs": torch.empty((M + 1, *self.obs.shape), dtype=self.obs.dtype),
            "last_reward": torch.empty(M + 1, B, **f),
            "last_action": torch.empty(M + 1, B, *S, dtype=self.action_dtype),
            "reset": torch.empty(M + 1, B, dtype=torch.bool),
            "actions": torch.empty(M, B, *S, dtype=self.action_dtype),
            "rewards": torch.empty(M, B, **f),
            "terminated": torch.empty(M, B, dtype=torch.bool),
            "truncated": torch.empty(M, B, dtype=torch.bool),
            "behaviour_logits": torch.empty(M, B, P, **f),
            "final_values": torch.zeros(M, B, **f),
        }

    def _record_input(self, buf: dict, t: int) -> None:
        buf["obs"][t], buf["last_reward"][t], buf["reset"][t] = (
            self.obs,
            self.last_reward,
            self.reset,
        )
        buf["last_action"][t] = self.last_action

    @torch.no_grad()
    def collect(self) -> tuple[Segment, EpisodeLog]:
        """Act M steps in every stream; return the segment and the episodes that ended."""
        self.finish_carry()
        agent, buf, log = self.agent, self.segment_buffers(), EpisodeLog()
        start = self.state
        state = agent.core.light_state(start)  # `start` itself when there is nothing to drop
        traces = []
        for t in range(self.unroll_length):
            self._record_input(buf, t)
            reset = self.reset.unsqueeze(0)  # (1, B)
            x = agent.core_input(
                self.obs.unsqueeze(0),
                self.last_reward.unsqueeze(0),
                reset,
                self.last_action.unsqueeze(0),
            )
            h, state, trace = agent.core.act(x, state, reset=reset)
            traces.append(trace)
            logits = agent.heads(h)[0][0]  # (B, P); values need not be computed
            action = agent.distribution(logits).sample(self.generator)  # (B, *S)
            result = self.env.step(action.numpy())
            reward = torch.from_numpy(np.asarray(result.reward)).to(self.dtype)
            terminated = torch.from_numpy(np.asarray(result.terminated, dtype=bool))
            truncated = torch.from_numpy(np.asarray(result.truncated, dtype=bool))
            buf["actions"][t], buf["behaviour_logits"][t] = action, logits
            buf["rewards"][t], buf["terminated"][t], buf["truncated"][t] = (
                reward,
                terminated,
                truncated,
            )
            if bool(truncated.any()):
                buf["final_values"][t] = self._final_values(
                    result.info["final_obs"], reward, action, state
                )
            self._log_episodes(result.info, log)
            done = terminated | truncated
            self.obs = torch.from_numpy(np.asarray(result.obs))
            self.last_reward = reward.masked_fill(done, 0.0)
            self.last_action = zero_where(action, done)
            self.reset = done
        self._record_input(buf, self.unroll_length)
        if self.defer_carry:  # `state` stays `start` until finish_carry
            self._pending = (start, traces, agent.core.carry_weights())
        else:
            out = self._free_slot(start)
            self.state = agent.core.carry_traces(start, traces, out=out)  # the segment-wise carry
        return Segment(**buf, state=start), log

    def finish_carry(self) -> None:
        """Run the carry `collect` deferred (if any), into the first carry slot: in place when
        the segment started from it. Call it once the segment's start state is no longer read."""
        if self._pending is None:
            return
        start, traces, weights = self._pending
        self._pending = None
        out = self.carry_slots[0]
        self.state = self.agent.core.carry_traces(start, traces, out=out, weights=weights)

    def _free_slot(self, start: Any) -> Any:
        """The carry slot that does not hold `start` (None without slots)."""
        if self.carry_slots is None:
            return None
        first, second = self.carry_slots
        return second if start is first else first

    def _final_values(
        self,
        final_obs,
        reward: torch.Tensor,
        action: torch.Tensor,
        state: Any,
    ) -> torch.Tensor:
        """V(final_obs) from the state after the step (the state of the ended episode)."""
        obs = torch.from_numpy(np.asarray(final_obs)).unsqueeze(0)
        x = self.agent.core_input(obs, reward.unsqueeze(0), None, action.unsqueeze(0))
        h, _ = self.agent.core(x, state, reset=None)
        return self.agent.heads(h)[1][0]  # (B,)

    @staticmethod
    def _log_episodes(info: dict, log: EpisodeLog) -> None:
        returns = np.asarray(info["episode_return"])
        ended = ~np.isnan(returns)
        if ended.any():
            log.returns += returns[ended].tolist()
            log.lengths += np.asarray(info["episode_length"])[ended].tolist()

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically (env state if the env supports it),
        as plain data: the core state a dict of its fields, the env's arrays tensors."""
        self.finish_carry()
        try:
            env_state = from_numpy(self.env.get_state())
        except (NotImplementedError, AttributeError):
            env_state = None
        return {
            "obs": self.obs.clone(),
            "last_reward": self.last_reward.clone(),
            "last_action": self.last_action.clone(),
            "reset": self.reset.clone(),
            "state": plain_state(self.state),
            "generator": self.generator.get_state(),
            "env": env_state,
        }

    def set_state(self, saved: dict[str, Any]) -> bool:
        """Restore get_state(); returns False (episodes restart) if the env state is missing.
        The core state is rebuilt with the types of this actor's own (ValueError naming the
        field that does not fit)."""
        state = state_from_plain(saved["state"], self.state)
        self.generator.set_state(saved["generator"])
        self._pending = None
        if saved["env"] is None:
            return False
        self.env.set_state(to_numpy(saved["env"]))
        self.obs, self.last_reward = saved["obs"], saved["last_reward"]
        # checkpoints written before the previous action was tracked: an agent without
        # prev_action ignores it, so zeros continue such a run exactly
        self.last_action = saved.get("last_action", torch.zeros_like(self.last_action))
        self.reset, self.state = saved["reset"], state
        return True
