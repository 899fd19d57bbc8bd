"""Imports point one way: the package's import graph, read from its source (ast; nothing is imported).

Every import counts, at module level or inside a function (a lazy import still ties the two modules),
and under ``TYPE_CHECKING`` too (a type named from above is a dependency on what is above).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_cudagate

PACKAGE = Path(pytest_cudagate.__file__).parent

# From the bottom. A module belongs to the layer of its package (a top-level module: its own name).
LAYERS = (
    ("__init__", "errors", "host", "boundary", "config", "hookspecs"),
    ("suite",),
    ("trust", "judge", "worker"),
    ("defences",),
    ("gate", "phases"),
    ("reports", "history", "approvals", "extensions"),
    ("plugin", "items", "session", "xdist_hooks", "bisect", "optimize", "cli", "commands", "suite_commands"),
)
# A command's module (its parser and handler) sits with the CLI, whichever package holds its subject.
COMMANDS = ("trust.cli", "trust.gate_command", "reports.cli", "history.cli", "optimize.cli", "approvals.approve")
# (importer, imported): the imports that must go up a layer, each with why. At most 4.
UPWARD: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    """Dotted names below pytest_cudagate (a package by its own name) -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"] = path
    return found


def imports(known: dict[str, Path]) -> dict[str, dict[str, int]]:
    """importer -> {imported: line}, both as names of :func:`modules`; `from A import B` names A.B
    where B is a module."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" and name != "__init__" else name.split(".")[:-1]
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(["pytest_cudagate", *package[:len(package) - node.level + 1], *base.split(".")]
                                    ).rstrip(".")
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target != "pytest_cudagate" and not target.startswith("pytest_cudagate."):
                    continue
                target = target.removeprefix("pytest_cudagate").lstrip(".") or "__init__"
                while target not in known:  # `from package import name`: the package
                    target = target.rpartition(".")[0] or "__init__"
                if target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def layer(name: str) -> int:
    if name in COMMANDS:
        return len(LAYERS) - 1
    return next(i for i, names in enumerate(LAYERS) if name.split(".")[0] in names)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules():
    graph = {name: set(edges) for name, edges in imports(modules()).items()}
    assert cycles(graph) == []


def unit(name: str) -> str:
    """A module's package (a top-level module and a command: itself)."""
    return name if name in COMMANDS else name.split(".")[0]


def test_no_import_cycle_between_layers_or_packages():
    """Layers, and the packages of one layer, use each other one way only."""
    layers: dict[int, set[int]] = {}
    packages: dict[str, set[str]] = {}
    for name, edges in imports(modules()).items():
        layers.setdefault(layer(name), set()).update(layer(e) for e in edges if layer(e) != layer(name))
        packages.setdefault(unit(name), set()).update(unit(e) for e in edges if unit(e) != unit(name))
    assert cycles(layers) == []
    assert cycles(packages) == []


def test_imports_point_down_but_for_the_few_listed():
    # every module has a layer, and each command named is a module
    assert [name for name in modules() if not any(name.split(".")[0] in names for names in LAYERS)] == []
    assert set(COMMANDS) <= set(modules())
    upward = {(name, target): f"{name} -> {target} (line {line})"
              for name, edges in imports(modules()).items() for target, line in edges.items()
              if layer(target) > layer(name)}
    assert sorted(v for k, v in upward.items() if k not in UPWARD) == []
    assert len(UPWARD) <= 4
    assert sorted(set(UPWARD) - set(upward)) == []  # one moved down is taken off the list


def test_the_harness_imports_nothing_of_pytest_cudagate():
    """The worker runs alone on a runner (``python -m cudagate_harness``): its package stands on numpy,
    cuda-bindings and the standard library, so its messages keep a reader of their own."""
    harness = Path(__file__).resolve().parents[2] / "harness" / "cudagate_harness"
    found = []
    for path in sorted(harness.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}:{node.lineno} {name}" for name in names
                      if name == "pytest_cudagate" or name.startswith("pytest_cudagate.")]
    assert found == []
