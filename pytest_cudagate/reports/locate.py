"""Where each replayed case lives: its pytest node id, suite file, kernel source and case data.

An outcome names its suite only by name; the collected pytest items carry the real objects.
Without them (a runtime driven outside pytest) the harness requests of the outcome still say
which suite file, kernel source and input files were used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from pytest_cudagate.reports.hashes import case_files, relative

Key = tuple[str, str, str]  # (suite name, kernel, case)


@dataclass(frozen=True)
class ItemInfo:
    nodeid: str
    suite_path: Path | None = None
    source: Path | None = None
    files: list[Path] = field(default_factory=list)
    suite: Any = None  # Suite, when collected by pytest
    program: Any = None
    case: Any = None


def from_items(items: Iterable[Any]) -> dict[Key, ItemInfo]:
    """Index pytest case items (``item.case`` under a node with ``suite`` and ``program``)."""
    index: dict[Key, ItemInfo] = {}
    for item in items:
        parent = getattr(item, "parent", None)
        suite, program, case = getattr(parent, "suite", None), getattr(parent, "program", None), getattr(item, "case", None)
        if suite is None or program is None or case is None:
            continue
        index[(suite.name, program.name, case.name)] = ItemInfo(
            nodeid=item.nodeid, suite_path=Path(suite.path), source=Path(program.source),
            files=case_files(suite.case_dir(case)), suite=suite, program=program, case=case)
    return index


def from_requests(key: Key, requests: list[dict], root: Path | None) -> ItemInfo:
    """Best effort from the harness requests alone."""
    suite_name, kernel, case = key
    suite_path = source = None
    files: list[Path] = []
    for request in requests:
        if request.get("suite"):
            suite_path = Path(request["suite"])
        spec = request.get("kernel") or (request.get("kernels") or {}).get("current") or {}
        if spec.get("source_path"):
            source = Path(spec["source_path"])
        cases = request.get("cases") or ([request["case"]] if request.get("case") else [])
        for entry in cases:
            inputs = [Path(b["input"]) for b in entry.get("buffers", {}).values() if b.get("input")]
            for path in inputs:
                files += case_files(path.parent) or [path]
    nodeid = f"{relative(suite_path, root)}::{kernel}::{case}" if suite_path else f"{suite_name}::{kernel}::{case}"
    return ItemInfo(nodeid=nodeid, suite_path=suite_path, source=source, files=files)
