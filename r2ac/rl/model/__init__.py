"""The model: the agent and what it is made of.

nets.py           stems (ResNet, shallow conv, MLP) and the policy / value heads
agent.py          `Agent` = stem -> core([features, last reward, previous action]) -> heads
distributions.py  the policy's distribution per action space
build.py          envs and agents from a config; seeding
"""
