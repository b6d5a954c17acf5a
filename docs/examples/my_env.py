"""Your own memory task as a Gymnasium env: `r2ac train --env gym/my_env:MyCue-v0`.

r2ac imports `my_env` (it must be on PYTHONPATH, e.g. `PYTHONPATH=docs/examples`), as
`gymnasium.make("my_env:MyCue-v0")` does; importing it registers the id below.
"""

import gymnasium as gym
import numpy as np


class MyCue(gym.Env):
    """A cue (0 or 1) is shown at the first step only; `delay` blank steps later the agent
    must name it: reward +1 if right, -1 if wrong, and the episode ends. Actions before
    that do nothing, so only an agent that remembers the cue scores above 0."""

    def __init__(self, delay: int = 8):
        self.delay = delay
        # observation: [cue is 0, cue is 1, answer now]; all zero during the delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        obs[2] = float(self.t == self.delay + 1)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # seeds self.np_random
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        answered = self.t == self.delay + 1
        reward = (1.0 if action == self.cue else -1.0) if answered else 0.0
        self.t += 1
        return self._obs(), reward, answered, False, {}  # terminated at the answer


gym.register(id="MyCue-v0", entry_point=MyCue)
