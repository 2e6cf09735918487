"""No import cycle among the broker's modules (broker/ installs as tidewater.broker).

Every ``tidewater.broker.*`` import counts, wherever it is written: at the top, inside
a function (a late import that dodges a cycle at run time) or under ``TYPE_CHECKING``
(a cycle for the reader and for mypy all the same). A cycle is broken by moving the
piece both modules need to a module of its own, not by hiding the import.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "broker"
PACKAGE = "tidewater.broker"


def module_name(path: Path) -> str:
    parts = path.relative_to(BROKER).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The broker modules ``tree`` (module ``name``) imports, anywhere in it."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from package import module` imports the module; `from module import name`
            # the module that holds the name.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                       else source for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in BROKER.rglob("*.py")}
    modules = set(paths)
    return {name: imported(ast.parse(path.read_text(), str(path)), name,
                           path.name == "__init__.py", modules)
            for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (iterative depth-first search)."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(sorted(graph[root]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_inside_functions_and_type_checking_count():
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from tidewater.broker.storage.log import Log\n"
                     "def f():\n    from . import segment\n")
    modules = {"tidewater.broker.storage.log", "tidewater.broker.storage.segment",
               "tidewater.broker.storage.x"}
    assert imported(tree, "tidewater.broker.storage.x", False, modules) == {
        "tidewater.broker.storage.log", "tidewater.broker.storage.segment"}


def test_broker_has_no_import_cycle():
    graph = import_graph()
    assert "tidewater.broker.storage.log" in graph  # the walk found the modules
    assert "tidewater.broker.storage.segment" in graph["tidewater.broker.storage.log"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_storage_imports_tidewater_only_at_module_level():
    # The storage modules' order of imports is their dependency order: none hides one
    # in a function or under TYPE_CHECKING (where a cycle would go unnoticed at run time).
    late = []
    for path in sorted((BROKER / "storage").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top
                    and any(name.startswith("tidewater")
                            for name in ([a.name for a in node.names]
                                         if isinstance(node, ast.Import)
                                         else [node.module or ""]))):
                late.append(f"{path.name}:{node.lineno}")
    assert late == []
