"""Merge the reports of matrix jobs (one per GPU model or runner) into one report.

Runs are kept side by side, each with its fingerprint; an item keeps pointing at the run that
measured it. Request files are carried over (renamed when two jobs chose the same name) and the
reproduction commands are rewritten for the merged folder.
"""

from __future__ import annotations

from pathlib import Path

from pytest_cudagate.boundary import MAX_REQUEST_BYTES, load_json
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.boundary.wire import replace
from pytest_cudagate.reports.document import Built, assemble, reproduce
from pytest_cudagate.reports.model import Item, Run, SkippedItem, Suite
from pytest_cudagate.reports.writer import REQUESTS_DIR, one_line, read_report
from pytest_cudagate.boundary.schema import validate


def _load_request(folder: Path, name: str) -> dict:
    """A request file the report names (``requests/NAME.json``, by the report's schema), checked here so
    that a bad one is named where it is, not where the merged copy would go."""
    path = folder / name
    try:
        request = load_json(path, MAX_REQUEST_BYTES, "request file")
        validate(request, "harness-request", path)
    except FileNotFoundError:
        raise CudagateError(f"{path}: cannot read a request the report names: no such file; copy the report "
                            f"folder whole, {REQUESTS_DIR}/ included") from None
    except FileError as exc:
        raise one_line(exc) from None
    return request


def _merge_suites(suites: list[Suite]) -> list[Suite]:
    merged: dict[str, Suite] = {}
    for suite in suites:
        entry = merged.setdefault(suite.path, replace(suite, signature=None))
        status = suite.signature
        if status and status not in (entry.signature or "").split(" | "):
            entry.signature = f"{entry.signature} | {status}" if entry.signature else status
    return sorted(merged.values(), key=lambda s: s.path)


def merge_reports(folders: list[Path], out_dir: Path) -> Built:
    if not folders:
        raise CudagateError("report merge: name at least one report folder")
    runs: list[Run] = []
    items: list[Item | SkippedItem] = []
    suites: list[Suite] = []
    requests: dict[str, dict] = {}
    target = display_path(out_dir)
    for folder in map(Path, folders):
        document = read_report(folder)
        folder = folder if folder.is_dir() else folder.parent
        offset = len(runs)
        runs += document.runs
        suites += document.suites
        for item in document.items:
            names = []
            for relative in item.request_files:
                request = _load_request(folder, relative)
                name = Path(relative).name
                if name in requests and requests[name] != request:
                    name = f"run{offset + 1}-{name}"
                requests[name] = request
                names.append(f"{REQUESTS_DIR}/{name}")
            items.append(replace(item, run=item.run + offset, request_files=names,
                                 reproduce=reproduce(item.nodeid, runs[item.run + offset].options, target, names)))
    return Built(assemble(runs, items, _merge_suites(suites)), requests)
