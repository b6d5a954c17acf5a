"""The learning algorithms: what turns experience into an update.

vtrace.py   V-trace targets and the truncation bootstrap (docs/rules/vtrace.md)
losses.py   the actor-critic loss terms
ppo.py      PPO-clip, GAE, stream minibatches (docs/rules/passes.md)
actor.py    `Actor`: steps a batch of envs with the agent, returns segments
learner.py  `Learner`: the optimiser, the passes over a batch, the entropy floor
"""
