"""The streaming agents (`r2ac train stream-ac | stream-q`; docs/rules/stream.md): K agents in
lockstep, one env stream each, an update after every step, recurrent cores trained by exact
RTRL. By role:

protocol.py     what a streaming agent is to the runtime (StreamAgent)
pair_agent.py   what stream AC and QRC share: two networks as one 2K-row body, normalisers
ac.py           stream AC(lambda) (Elsayed et al. 2024)
qrc.py          QRC(lambda) (Farr et al. 2026's value-based agent)
obgd.py         ObGD, the step-size-bounded optimiser
intentional.py  intentional updates, stream AC's other rule (docs/rules/intentional.md)
nets.py         flat parameter layout, sparse init, stacked networks, forward passes and VJPs
sampling.py     actions from counter-hash uniforms
envs.py         the agents' env streams, the previous-action input
build.py        the agents from a config; their memory estimate
checkpoint.py   the checkpoint's streaming section; older forms converted
runtime.py      the trainer on the shared loop (r2ac/rl/run/loop.py)
evaluate.py     each agent's frozen policy on seeded sets of episodes
compiled.py     stream AC's or QRC's step as one compiled function (--compile-step); its
                description and state in compiled_spec.py, its math in compiled_math.py
                (its RTU / LRU core in compiled_pair.py, QRC's own parts in compiled_qrc.py)
compiled_loop.py  up to 64 compiled steps a call, a built-in env's step inside
"""
