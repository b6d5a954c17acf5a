"""How segments reach the learner and weights reach the actors (docs/rl.md, "Runtimes").

base.py           `Runtime`: the training loop written once (restore, checkpoints,
                  tracker, stop, shutdown); a runtime supplies next_batch() and
                  publish_weights()
serial.py         one process, deterministic, exact resume
parallel.py       actor processes -> shared-memory slots -> learner
processes.py      the parallel plumbing: messages, the weights' seqlock, actor start-up
ray.py            Ray actors (here or on a cluster) -> object store -> learner
wire.py           segments and weights as numpy trees for the object store
learner_carry.py  the learner carries the actors' RTRL sensitivities
"""
