"""Write a report folder: report.json (schema-checked first), report.html and requests/.

Everything passes through the scrubber twice: as data before rendering, and as finished text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagate.boundary import load_json
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.phases import RunClock, run_phase
from pytest_cudagate.boundary.schema import validate
from pytest_cudagate.reports.scrub import Scrubber

if TYPE_CHECKING:
    from pytest_cudagate.reports.document import Built

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
REQUESTS_DIR = "requests"
MAX_REPORT_BYTES = 256 * 1024 * 1024  # thousands of items with their timing samples fit many times over


def dumps(value) -> str:
    # allow_nan=False: a NaN sneaking past outcome.plain must fail here, not in a reader's parser
    return json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_text(path: Path, text: str, scrubber: Scrubber) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scrubber.text(text), encoding="utf-8")


def write_report(out_dir: Path, built: Built, scrubber: Scrubber | None = None,
                 clock: RunClock | None = None) -> Path:
    """Validate, scrub and write; returns the path of report.json. Nothing is written unless every
    file is valid. ``clock``: the live run's, whose phases so far (and the worker's busy share of the
    cases) are read just before report.json is checked, so that it carries the time spent on
    everything before it (the HTML included)."""
    scrubber = scrubber or Scrubber()
    out_dir = Path(out_dir)
    document = scrubber.data(built.document)
    with run_phase("report_requests"):
        requests = {name: scrubber.data(request) for name, request in built.requests.items()}
        for name, request in requests.items():
            validate(request, "harness-request", out_dir / REQUESTS_DIR / name)
    with run_phase("report_html"):
        from pytest_cudagate.reports.html_page import render  # the page and its plots: only where one is written

        html = render(document)
    with run_phase("report_json"):
        if clock is not None:
            document["runs"][-1]["phases"] = clock.snapshot()
            busy = clock.cases_busy()
            if busy is not None:
                document["runs"][-1]["cases_busy"] = busy
        validate(document, "report", out_dir / REPORT_JSON)
    with run_phase("report_requests"):
        for name, request in requests.items():
            write_text(out_dir / REQUESTS_DIR / name, dumps(request), scrubber)
    with run_phase("report_html"):
        write_text(out_dir / REPORT_HTML, html, scrubber)
    with run_phase("report_json"):
        write_text(out_dir / REPORT_JSON, dumps(document), scrubber)
    return out_dir / REPORT_JSON


def read_report(path: Path) -> dict:
    """A report.json (or the folder holding one), read within the boundary's rules (another job's
    artifact: any size, depth or kind of file) and checked against the schema; every item's run must
    be one of its runs."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_JSON
    try:
        document = load_json(path, MAX_REPORT_BYTES, "report")
    except FileNotFoundError:
        raise CudagateError(f"{path}: cannot read the report: no such file; name a report folder or its "
                            f"{REPORT_JSON}") from None
    validate(document, "report", path)
    runs = len(document["runs"])
    stray = [(i, item["run"]) for i, item in enumerate(document["items"]) if item["run"] >= runs]
    if stray:
        (index, run), more = stray[0], len(stray) - 1
        raise FileError(path, [f"items[{index}].run: {run} names no run (the report has {runs} run"
                               f"{'s' if runs != 1 else ''}){f', nor do {more} more items' if more else ''}; "
                               "use the report.json the gate wrote"])
    return document
