"""The packages' imports form no cycle: each module stands above everything it imports.

A cycle makes import order matter (a name is missing when the loop closes) and hides which module is the floor
that both sides need. An import inside a function counts too: deferring it hides the loop, it does not break it.
Only `if TYPE_CHECKING:` blocks are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nightbatch", "functions", "gpu_worker", "infra")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    nodes: list[ast.AST] = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            nodes.extend(node.orelse)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        else:
            nodes.extend(ast.iter_child_nodes(node))
    return found


def _graph() -> dict[str, set[str]]:
    modules: dict[str, tuple[ast.Module, bool]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            modules[_module_name(path)] = (ast.parse(path.read_text(), str(path)), path.name == "__init__.py")
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


def test_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
