"""Reference policies for the built-in tasks: random, best memoryless, optimal scripted.

Each policy maps a batch of observations (and, for those with memory, the `done` flags of
the previous step) to actions (B,). They measure the score table in docs/envs.md; the tests
assert it. `evaluate` runs any of them for a number of episodes per stream.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from r2ac.envs.base import BatchedEnv
from r2ac.envs.builtin import MOVES, DelayedCue, KMemoryChain, MemoryChain, Watermaze
from r2ac.envs.spaces import ActionSpace, as_action_space

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs (B, D), done (B,)) -> (B,)


def random_policy(space: ActionSpace | int, seed: int) -> Policy:
    """Uniform actions of `space` (an int: Discrete with that many); a Box's are uniform in
    the normalised [-1, 1], i.e. uniform between the env's bounds."""
    rng, space = np.random.default_rng(seed), as_action_space(space)
    if space.is_float:
        return lambda obs, done: rng.uniform(-1.0, 1.0, size=(len(obs), space.dims))
    if space.kind == "discrete":
        return lambda obs, done: rng.integers(0, space.nvec[0], size=len(obs))
    return lambda obs, done: rng.integers(0, space.nvec, size=(len(obs), space.dims))


def delayed_cue_memory_policy(env: DelayedCue) -> Policy:
    """Optimal: remembers what slot a showed at the cue step, answers at the choice step."""
    k = env.num_cues
    remembered = np.zeros(env.num_envs, dtype=np.int64)

    def act(obs: np.ndarray, done: np.ndarray) -> np.ndarray:
        at_cue, at_choice = obs[:, 2 * k] == 1, obs[:, 2 * k + 2] == 1
        remembered[at_cue] = obs[at_cue, :k].argmax(axis=1)
        if env.variant == "cue":
            return remembered.copy()
        slot_a_object = obs[:, :k].argmax(axis=1)
        return np.where(at_choice & (slot_a_object == remembered), 1, 0)

    return act


def delayed_cue_memoryless_policy(env: DelayedCue) -> Policy:
    """Best memoryless: at the choice the observation carries no information about the answer
    (cue variant: the choice observation is constant; nonmatch: the two slots are exchangeable),
    so every memoryless policy scores (2/K - 1) resp. 0. This one always answers 0."""
    return lambda obs, done: np.zeros(len(obs), dtype=np.int64)


def _move_toward(pos: np.ndarray, target: np.ndarray, size: int) -> np.ndarray:
    """A shortest-path move (B,) from cell pos to cell target (rows first, then columns)."""
    drow = target // size - pos // size
    dcol = target % size - pos % size
    horizontal = np.where(dcol < 0, 2, 3)
    return np.where(drow < 0, 0, np.where(drow > 0, 1, horizontal))


def watermaze_oracle_policy(env: Watermaze) -> Policy:
    """Upper bound: reads the hidden goal from the env and walks straight to it."""
    return lambda obs, done: _move_toward(env.pos, env.goal, env.size)


def _decode_position(obs: np.ndarray, size: int) -> np.ndarray:
    return obs[:, :size].argmax(axis=1) * size + obs[:, size : 2 * size].argmax(axis=1)


def watermaze_memory_policy(env: Watermaze) -> Policy:
    """Scripted with memory, from observations only: sweep to the nearest unvisited cell until
    the goal is found (the cell entered when the reward came), then walk straight back."""
    size, cells = env.size, env.num_cells
    rows, cols = np.divmod(np.arange(cells), size)
    visited = np.zeros((env.num_envs, cells), dtype=bool)  # (B, N)
    goal = np.full(env.num_envs, -1, dtype=np.int64)  # (B,) -1 while unknown
    last = {"pos": np.zeros(env.num_envs, np.int64), "act": np.zeros(env.num_envs, np.int64)}

    def act(obs: np.ndarray, done: np.ndarray) -> np.ndarray:
        visited[done] = False
        goal[done] = -1
        pos = _decode_position(obs, size)
        found = (obs[:, -1] == 1) & (goal < 0)
        entered = np.clip(last["pos"] // size + MOVES[last["act"], 0], 0, size - 1) * size
        entered += np.clip(last["pos"] % size + MOVES[last["act"], 1], 0, size - 1)
        goal[found] = entered[found]
        visited[np.arange(env.num_envs), pos] = True
        distance = np.abs(rows - (pos // size)[:, None]) + np.abs(cols - (pos % size)[:, None])
        nearest = np.where(visited, cells * 2, distance).argmin(axis=1)  # (B,)
        target = np.where(goal >= 0, goal, nearest)
        actions = _move_toward(pos, target, size)
        last["pos"], last["act"] = pos, actions
        return actions

    return act


def cycle_actions(size: int) -> np.ndarray:
    """A move per cell (N,) tracing one cycle through all cells (even size only).

    Column 0 is the way back up; rows snake through columns 1..size-1.
    """
    if size % 2:
        raise ValueError("a cycle through every cell needs an even arena size")
    moves = np.empty((size, size), dtype=np.int64)
    for r in range(size):
        inner = 3 if r % 2 == 0 else 2  # even rows run right, odd rows run left
        moves[r, 1:] = inner
        moves[r, size - 1 if r % 2 == 0 else 1] = 1  # the row's end goes down
        moves[r, 0] = 0  # back up column 0
    moves[size - 1, 1] = 2  # the last row enters column 0
    moves[0, 0] = 3  # the top of column 0 enters row 0
    return moves.reshape(-1)


def watermaze_cycle_policy(env: Watermaze) -> Policy:
    """Best memoryless (deterministic): follow one cycle through every cell. Each search then
    takes U{1..N-1} steps, the least any memoryless policy can manage (docs/envs.md)."""
    moves = cycle_actions(env.size)
    return lambda obs, done: moves[_decode_position(obs, env.size)]


def memory_chain_memory_policy(env: MemoryChain) -> Policy:
    """Optimal, from observations only: keeps the context bit shown at the first step (the
    observation's time to live is 1 there) and answers it at the query."""
    remembered = np.zeros(env.num_envs, dtype=np.int64)

    def act(obs: np.ndarray, done: np.ndarray) -> np.ndarray:
        first = obs[:, 0] == 1.0
        remembered[first] = obs[first, 2] > 0
        return remembered.copy()

    return act


def k_memory_chain_memory_policy(env: KMemoryChain) -> Policy:
    """Optimal, from observations only: a ring of the last k + 1 bits seen per stream; each
    step answers the one seen k steps ago (any answer before the first query)."""
    k = env.k
    seen = np.zeros((env.num_envs, k + 1), dtype=np.int64)  # (B, k+1) bit of step t at t % (k+1)
    t = np.zeros(env.num_envs, dtype=np.int64)  # (B,) step within the episode

    def act(obs: np.ndarray, done: np.ndarray) -> np.ndarray:
        t[done] = 0
        rows = np.arange(env.num_envs)
        seen[rows, t % (k + 1)] = obs[:, 2] > 0
        answer = seen[rows, (t - k) % (k + 1)]
        t[:] += 1
        return answer

    return act


def constant_policy(action: int = 0) -> Policy:
    """The same action everywhere: on the memory chains a best memoryless policy (the query's
    observation says nothing about the bit asked for, so every memoryless policy scores 0)."""
    return lambda obs, done: np.full(len(obs), action, dtype=np.int64)


def evaluate(env: BatchedEnv, policy: Policy, episodes_per_env: int, seed: int = 0):
    """Mean and standard error of the episode return over episodes_per_env * B episodes."""
    obs = env.reset(seed)
    done = np.ones(env.num_envs, dtype=bool)
    returns: list[np.ndarray] = []
    finished = np.zeros(env.num_envs, dtype=np.int64)
    while finished.min() < episodes_per_env:
        obs, _, terminated, truncated, info = env.step(policy(obs, done))
        done = terminated | truncated
        keep = done & (finished < episodes_per_env)
        returns.append(info["episode_return"][keep])
        finished += done
    values = np.concatenate(returns)
    return float(values.mean()), float(values.std() / np.sqrt(len(values)))


# POPGym oracles: upper bounds that read each stream's hidden env state (as the watermaze
# oracle reads the goal); they reach POPGym's optimum of +1 where it is reachable.
def _repeat_first(env) -> int:
    return int(env.card)


def _repeat_previous(env) -> int:
    hand = env.deck["player"]
    return int(env.deck.suits_idx[hand[-env.k]]) if len(hand) >= env.k else 0


def _count_recall(env) -> int:
    return int(env.counts[env.query])  # the answer is the query's count before this step


def _autoencode(env) -> int:
    hand = env.deck["system"]
    return int(env.deck.suits_idx[hand[-1]]) if env.mode.name == "PLAY" and len(hand) else 0


POPGYM_ORACLES: dict[str, Callable] = {
    "RepeatFirst": _repeat_first,
    "RepeatPrevious": _repeat_previous,
    "CountRecall": _count_recall,
    "Autoencode": _autoencode,
}


def popgym_oracle_policy(env) -> Policy:
    """For a `gym/popgym-<Game><Level>-v0` batch (r2ac.envs.gym_adapter.GymEnv): the action
    each stream's hidden state says is right. KeyError for games without an oracle here."""
    game = next(name for name in POPGYM_ORACLES if env.env_id.startswith(f"popgym-{name}"))
    answer = POPGYM_ORACLES[game]
    streams = [e.unwrapped for e in env.envs]
    return lambda obs, done: np.array([answer(s) for s in streams], dtype=np.int64)
