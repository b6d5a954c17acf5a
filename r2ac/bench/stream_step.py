"""CPU time of one streaming step: the eager StreamAC against the functional step
(r2ac/rl/learning/stream_step.py), eager and compiled.

    python -m r2ac.bench.stream_step --net matched --ks 1
    python -m r2ac.bench.stream_step --net preset --ks 1 16

`matched`: --core lru-rtrl --hidden-size 32 --stream-mlp (none) --prev-action on MemoryChain 32
(5 inputs, 2 actions); `preset`: the stream preset's network (rtu-rtrl 64 behind 128-128).
Each exact-RTRL core is timed beside its TBPTT(1) twin. Per (core, K, path): the learner alone
(act + learn on a fixed observation) and with the env (StreamRuntime's step: MemoryChain in
numpy, the previous-action input, the tracker), process CPU time at one torch thread, the
median over `--repeats` interleaved repeats after a warm-up. Compilation (once per process,
inductor's cache across processes: TORCHINDUCTOR_CACHE_DIR) is timed apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

NETS = {
    "matched": {"core": "lru-rtrl", "hidden_size": 32, "stream_mlp": (), "prev_action": True},
    "preset": {},
}
PATHS = ("eager", "functional", "compiled")


def _runtime(net: str, core: str | None, k: int):
    from r2ac.rl.presets import preset
    from r2ac.rl.stream.runtime import StreamRuntime

    options = dict(NETS[net])
    if core:
        options["core"] = core
    cfg = preset("stream").updated(
        num_agents=k, env_options=("length=32",), progress=False, **options
    )
    return StreamRuntime(cfg)


class _Count:
    update = 0

    def record(self, *args, **kwargs):
        self.update += 1


def _cpu(fn, steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        fn()
    return time.process_time() - start


class Subject:
    """One (net, core, K, path): a runtime whose agent is the eager StreamAC or the functional
    step over its state, and the two timed steps."""

    def __init__(self, net: str, core: str | None, k: int, path: str, mode: str | None):
        from r2ac.rl.stream.compiled import FusedStreamAC

        self.name, self.k, self.path = core or net, k, path
        self.runtime = rt = _runtime(net, core, k)
        self.core = rt.cfg.model.core
        self.compile_s = None
        if path != "eager":
            rt.agent = FusedStreamAC(rt.agent, compiled=path == "compiled", mode=mode)
            if path == "compiled":
                self.compile_s = rt.agent.warm_up()
        agent, counter = rt.agent, _Count()
        obs = np.zeros((k, rt.env.observation_spec.shape[0]), dtype=np.float32)
        zeros, no = np.zeros(k, dtype=np.float32), np.zeros(k, dtype=bool)

        def learner():
            agent.act()
            agent.learn(zeros, obs, obs, no, no)

        self.steps = {"alone": learner, "with_env": lambda: rt.step(counter)}
        self.seconds = {"alone": [], "with_env": []}

    def time(self, steps: int, record: bool = True) -> None:
        for kind, fn in self.steps.items():
            t = _cpu(fn, steps)
            if record:
                self.seconds[kind].append(t / steps)

    def row(self) -> dict:
        us = {kind: 1e6 * statistics.median(t) for kind, t in self.seconds.items()}
        return {
            "core": self.core,
            "K": self.k,
            "path": self.path,
            "us_alone": us["alone"],
            "us_with_env": us["with_env"],
            "steps_per_cpu_s_alone": 1e6 / us["alone"],
            "steps_per_cpu_s_with_env": 1e6 / us["with_env"],
            "compile_s": self.compile_s,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=list(NETS), default="matched")
    parser.add_argument("--ks", type=int, nargs="+", default=[1])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--twins", action="store_true", help="time the TBPTT(1) twin too")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mode", default=None, help="torch.compile mode")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = NETS[args.net].get("core", "rtu-rtrl")
    cores = [base.replace("-rtrl", "-bptt"), base] if args.twins else [base]
    rows = []
    for k in args.ks:
        subjects = [Subject(args.net, c, k, p, args.mode) for c in cores for p in args.paths]
        for s in subjects:
            s.time(args.warmup, record=False)
        for _ in range(args.repeats):  # interleaved: a passing load falls on all alike
            for s in subjects:
                s.time(args.steps)
        for s in subjects:
            row = s.row()
            rows.append(row)
            compiled = "" if row["compile_s"] is None else f"  compile {row['compile_s']:.1f} s"
            print(
                f"{row['core']:<9} K={k:<3} {row['path']:<10} alone {row['us_alone']:8.1f} us "
                f"({row['steps_per_cpu_s_alone']:7.0f}/cpu-s)  with env {row['us_with_env']:8.1f}"
                f" us ({row['steps_per_cpu_s_with_env']:7.0f}/cpu-s){compiled}",
                flush=True,
            )
            s.runtime.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
