"""The house's layering (docs/architecture.md): a module imports only from layers below its
own, r2ac/tasks imports no part of r2ac.rl, and no two modules import each other (directly
or round a circle). Read from the source with ast, lazy imports inside functions included."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "r2ac"
# Lowest first: a layer may import its own and any layer before it.
LAYERS = [
    {
        "r2ac",
        "r2ac.errors",
        "r2ac.flat",
        "r2ac.environ",
        "r2ac.perf",
        "r2ac.counter_hash",
        "r2ac.allocator",
    },
    {"r2ac.envs", "r2ac.rtrl"},
    {"r2ac.runs"},
    {"r2ac.rl", "r2ac.tasks"},
    {"r2ac.experiments", "r2ac.bench"},
    {"r2ac.demo", "r2ac.cli"},
]
FORBIDDEN = {("r2ac.tasks", "r2ac.rl"), ("r2ac.rtrl", "r2ac.envs"), ("r2ac.envs", "r2ac.rtrl")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _imports(path: Path) -> set[str]:
    """The r2ac modules `path` imports; `from pkg import sub` counts as pkg.sub."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("r2ac")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("r2ac"):
            subs = [f"{node.module}.{a.name}" for a in node.names]
            modules = [s for s in subs if _is_module(s)]
            found |= set(modules) if len(modules) == len(subs) else {node.module, *modules}
    return found


def _graph() -> dict[str, set[str]]:
    graph = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    return {m: {d for d in deps if d != m} for m, deps in graph.items()}


def _top(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_import_points_down():
    upward = [
        f"{m} -> {d}"
        for m, deps in _graph().items()
        for d in deps
        if _layer(_top(d)) > _layer(_top(m)) or (_top(m), _top(d)) in FORBIDDEN
    ]
    assert upward == []


def test_no_circle_of_imports():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                circles.append(" -> ".join([*path[path.index(d) :], d]))
            elif d in graph and d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def _part(module: str, package: str) -> str | None:
    """The part of `package` (a subpackage or a top-level module) that `module` belongs to."""
    prefix = package + "."
    if not module.startswith(prefix):
        return None
    return prefix + module[len(prefix) :].split(".")[0]


def _parts_graph(package: str) -> dict[str, set[str]]:
    """Which parts of `package` import which (lazy imports inside functions included)."""
    graph: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        src = _part(m, package)
        if src is None:
            continue
        graph.setdefault(src, set())
        graph[src] |= {d for d in map(lambda x: _part(x, package), deps) if d and d != src}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                found.append(" -> ".join([*path[path.index(d) :], d]))
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_the_parts_of_the_trainer_form_layers():
    """r2ac/rl's subpackages and top-level modules import each other without a circle, so
    they stack in layers (config at the bottom, the commands in harness/ at the top)."""
    graph = _parts_graph("r2ac.rl")
    assert {"r2ac.rl.stream", "r2ac.rl.run", "r2ac.rl.runtimes", "r2ac.rl.harness"} <= set(graph)
    assert _cycles(graph) == []


def test_the_part_cycle_check_has_teeth():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_branch_on_the_streaming_runtime_outside_the_wing():
    """Nothing outside r2ac/rl/stream asks whether the runtime is the streaming one: each
    trainer answers for itself (restore, evaluate, memory estimate)."""
    hits = [
        f"{path.relative_to(PACKAGE.parent)}:{i}"
        for path in PACKAGE.rglob("*.py")
        if "stream" not in path.relative_to(PACKAGE).parts[:2]
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if 'runtime.name == "stream"' in line or 'streaming == "' in line or '== "stream"' in line
    ]
    assert hits == []


def test_the_streaming_wing_is_split_small():
    """r2ac/rl/stream: no file over 450 lines, no function over 60."""
    long_files, long_functions = [], []
    for path in sorted((PACKAGE / "rl" / "stream").glob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 450:
            long_files.append(path.name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 60:
                    long_functions.append(f"{path.name}:{node.name}")
    assert long_files == [] and long_functions == []
