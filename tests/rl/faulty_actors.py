"""Actor process bodies with a fault, for the parallel runtime's tests (module level, so
that a spawned process can import them)."""

from __future__ import annotations

from r2ac.rl.learning import actor as actor_module
from r2ac.rl.runtimes.parallel import actor_main
from r2ac.rl.runtimes.processes import WeightBoard


def _fail_inside_the_actor() -> None:
    raise ValueError("boom inside the actor")


def raising_actor(spec, cfg, conn, slots, board) -> None:
    """An actor whose third segment raises."""
    collect, calls = actor_module.Actor.collect, []

    def failing_collect(self):
        calls.append(1)
        if len(calls) == 3:
            _fail_inside_the_actor()
        return collect(self)

    actor_module.Actor.collect = failing_collect
    actor_main(spec, cfg, conn, slots, board)


def stale_actor_1(spec, cfg, conn, slots, board) -> None:
    """Actor 1 reads the weights once and never again; the others behave."""
    if spec.index == 1:
        read_into = WeightBoard.read_into

        def read_once(self, module, seen, timeout_s=60.0):
            return read_into(self, module, seen, timeout_s) if seen < 0 else seen

        WeightBoard.read_into = read_once
    actor_main(spec, cfg, conn, slots, board)
