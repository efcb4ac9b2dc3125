"""The packages' imports form no cycle, and every room imports only rooms on the floors below it.

A cycle makes import order matter (a name is missing when the loop closes) and hides which module is the floor
that both sides need. An import inside a function counts too: deferring it hides the loop, it does not break it.
So does an import under `if TYPE_CHECKING:`: it never runs, but the types then know each other both ways; where
one side needs only the other's shape, it declares that shape as a Protocol of its own.

A room is a package of nightbatch/ (files, batches, ...), one of its top-level modules (layout, wire, ...), or one
of the other packages (functions, gpu_worker, infra). FLOORS lists them from the ground up (docs/ARCHITECTURE.md,
"The layout by noun"): a room may import the rooms of any floor below its own, none on its floor or above. A new
room is placed on a floor here before it can land.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nightbatch", "functions", "gpu_worker", "infra")

# From the ground up. Each floor may import every floor below it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("nightbatch.clock", "nightbatch.errors", "nightbatch.ids", "nightbatch.jsonl", "nightbatch.lambda_quota",
     "nightbatch.logs", "nightbatch.models", "nightbatch.phases", "nightbatch.wire"),
    ("nightbatch.settings",),
    ("nightbatch.metrics", "nightbatch.aws"),
    ("nightbatch.layout", "nightbatch.listing", "nightbatch.tenancy"),
    ("nightbatch.validation",),
    ("nightbatch.files",),
    ("nightbatch.shards",),
    ("nightbatch.batches",),
    ("nightbatch.notifications",),
    ("nightbatch.wiring",),
    ("nightbatch.results",),
    ("nightbatch.messages",),
    ("nightbatch.pipeline",),
    ("functions", "gpu_worker", "infra"),
    ("nightbatch.local",),
    ("nightbatch.cli",),
    ("nightbatch.__main__",),
)
# The package itself (its version) stands apart: every room may read it.
APART = ("nightbatch",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every module an import statement names, wherever it stands (a function, `if TYPE_CHECKING:`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _modules() -> dict[str, tuple[ast.Module, bool]]:
    modules: dict[str, tuple[ast.Module, bool]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            modules[_module_name(path)] = (ast.parse(path.read_text(), str(path)), path.name == "__init__.py")
    return modules


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (tree, is_package) in modules.items():
        targets = set()
        for imported in _imports(tree, name, is_package):
            # The deepest module named: `from a.b import c` is a.b.c when c is a module, else a.b.
            parts = imported.split(".")
            deepest = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules),
                           None)
            if deepest is None:
                continue
            # Importing a.b.c runs a/__init__ and a/b/__init__ first: they are imported too. A module's own
            # packages are not (they are running, or done, when it is imported).
            for i in range(1, deepest.count(".") + 2):
                candidate = ".".join(deepest.split(".")[:i])
                if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                    targets.add(candidate)
        graph[name] = targets
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def _room(module: str, rooms: dict[str, int]) -> str | None:
    """The room a module belongs to: the longest room name it is, or is inside of."""
    parts = module.split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in rooms), None)


def _floors() -> dict[str, int]:
    return {room: n for n, floor in enumerate(FLOORS) for room in floor}


def _not_downward(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """Each import from a room to a room on its own floor or above: `module -> module (room floor -> floor)`."""
    found = []
    for module, targets in sorted(graph.items()):
        room = _room(module, floors)
        for target in sorted(targets):
            other = _room(target, floors)
            if room is None or other is None or other == room:
                continue
            if floors[other] >= floors[room]:
                found.append(f"{module} -> {target} ({room} on floor {floors[room]}, {other} on {floors[other]})")
    return found


def test_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_room_stands_on_a_floor() -> None:
    floors = _floors()
    assert len(floors) == sum(len(floor) for floor in FLOORS), "a room is named twice"
    unplaced = sorted(m for m in _modules() if m not in APART and _room(m, floors) is None)
    assert unplaced == [], "modules in no room of FLOORS: " + ", ".join(unplaced)


def test_rooms_import_only_the_floors_below() -> None:
    wrong = _not_downward(_graph(), _floors())
    assert wrong == [], "imports that do not run down a floor:\n" + "\n".join(wrong)


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_checker_finds_an_import_that_does_not_run_down() -> None:
    floors = {"p.low": 0, "p.mid": 1, "p.mid2": 1, "p.high": 2}
    graph = {"p.low.a": {"p.high.b"}, "p.mid.c": {"p.mid2.d", "p.low.a"}, "p.high.b": {"p.high.e", "p.low.a"}}
    assert _not_downward(graph, floors) == [
        "p.low.a -> p.high.b (p.low on floor 0, p.high on 2)", "p.mid.c -> p.mid2.d (p.mid on floor 1, p.mid2 on 1)"]


def test_the_checker_reads_type_only_and_deferred_imports() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.b import C\n"
                     "def f() -> None:\n    import d.e\n")
    assert {"a.b.C", "d.e"} <= _imports(tree, "x.y", False)
