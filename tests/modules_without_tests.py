"""Which modules of pytest_cudagate/ and harness/cudagate_harness/ have no test file named for them.

    python tests/modules_without_tests.py

A module ``PKG/MOD.py`` (at any depth under the package PKG) has its own file when ``tests/PKG/test_MOD.py``
or ``tests/PKG/test_PKG_MOD.py`` exists (the prefix keeps basenames unique: ``trust/cli.py`` is tested by
``tests/trust/test_trust_cli.py``); a top-level module ``MOD.py`` when ``tests/*/test_MOD.py`` does. A module
without one is listed with the test files that import it directly, and marked "face" when its package's
public face has a file (``tests/PKG/test_PKG.py``), which then covers it (tests/README.md, "Where a test goes").
Package ``__init__`` and ``__main__`` files are left out.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ROOTS = {"pytest_cudagate": REPO / "pytest_cudagate", "cudagate_harness": REPO / "harness" / "cudagate_harness"}
FACES = {"cudagate_harness": "harness"}  # the harness's tests live in tests/harness/


def modules() -> list[str]:
    found = []
    for top, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            if path.stem in ("__init__", "__main__"):
                continue
            found.append(".".join([top, *path.relative_to(root).with_suffix("").parts]))
    return found


def imported(path: Path, known: set[str]) -> set[str]:
    """The project modules a test file imports by name (``from pkg import mod`` counts for ``pkg.mod``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names & known


def main() -> int:
    mods = modules()
    tests = sorted(p for p in TESTS.rglob("test_*.py") if "public" not in p.parts)
    files = {str(p.relative_to(TESTS)) for p in tests}
    users = defaultdict(list)
    for path in tests:
        for name in imported(path, set(mods)):
            users[name].append(str(path.relative_to(TESTS)))
    missing = []
    for name in mods:
        parts = name.split(".")
        if len(parts) == 2 and parts[0] not in FACES:  # a top-level module: its file may sit in any folder
            if any(Path(f).name == f"test_{parts[1]}.py" for f in files):
                continue
            missing.append((name, False, sorted(users[name])))
            continue
        folder = FACES.get(parts[0], parts[1])
        if {f"{folder}/test_{parts[-1]}.py", f"{folder}/test_{folder}_{parts[-1]}.py"} & files:
            continue
        missing.append((name, f"{folder}/test_{folder}.py" in files, sorted(users[name])))
    for name, face, importers in missing:
        print(f"{name}{'  [face]' if face else ''}: " + (", ".join(importers) or "imported by no test file"))
    print(f"{len(mods) - len(missing)} of {len(mods)} modules have a test file named for them; "
          f"{sum(face for _, face, _ in missing)} more are covered by their package's face file", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
