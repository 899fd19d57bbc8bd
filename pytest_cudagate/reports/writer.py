"""Write a report folder: report.json (schema-checked first), report.html and requests/.

Everything passes through the scrubber twice: as data before rendering, and as finished text. Every
file goes through :mod:`pytest_cudagate.host.output`: the folder may sit in a pull request's checkout,
where a committed link named ``report.html`` would otherwise send the page into another file.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagate.boundary import load_json
from pytest_cudagate.boundary.wire import ReadError, from_json, to_json
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host import output
from pytest_cudagate.phases import RunClock, run_phase
from pytest_cudagate.boundary.schema import validate
from pytest_cudagate.host.scrub import Scrubber

if TYPE_CHECKING:
    from pytest_cudagate.reports.document import Built
    from pytest_cudagate.reports.model import Report

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
REQUESTS_DIR = "requests"
MAX_REPORT_BYTES = 256 * 1024 * 1024  # thousands of items with their timing samples fit many times over


def _line(value) -> str:
    # allow_nan=False: a NaN sneaking past outcome.plain must fail here, not in a reader's parser
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def dumps(value) -> str:
    """JSON as cudagate writes its files: each key of the top-level object on a line of its own, and
    each element of a list there (a run, a suite, an item) on one line. json indents only in its
    pure-Python encoder: a report of 12,000 items took 12 s indented, 4 s this way."""
    if not isinstance(value, dict):
        return _line(value) + "\n"
    lines = []
    for key, member in value.items():
        name = _line(key)
        if isinstance(member, list) and member:
            lines.append(f" {name}: [\n  " + ",\n  ".join(map(_line, member)) + "\n ]")
        else:
            lines.append(f" {name}: {_line(member)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_text(path: Path, text: str, scrubber: Scrubber, what: str = "report") -> None:
    output.write_text(path, scrubber.text(text), what)


def write_report(out_dir: Path, built: Built, scrubber: Scrubber | None = None,
                 clock: RunClock | None = None) -> Path:
    """Validate, scrub and write; returns the path of report.json. Nothing is written unless every
    file is valid. ``clock``: the live run's, whose phases so far (and the worker's busy share of the
    cases) are read just before report.json is checked, so that it carries the time spent on
    everything before it (the HTML included)."""
    scrubber = scrubber or Scrubber()
    out_dir = Path(out_dir)
    document = scrubber.data(to_json(built.document))
    requests_dir = out_dir / REQUESTS_DIR
    # Before anything is written: a link, device or file where a folder goes writes nothing.
    output.check_folder(out_dir, "report")
    if built.requests:
        output.check_folder(requests_dir, "report", inside=True)
    for path in [out_dir / REPORT_HTML, out_dir / REPORT_JSON, *(requests_dir / name for name in built.requests)]:
        output.check_file(path, "report")
    with run_phase("report_requests"):
        requests = {name: scrubber.data(request) for name, request in built.requests.items()}
        for name, request in requests.items():
            validate(request, "harness-request", out_dir / REQUESTS_DIR / name)
    with run_phase("report_html"):
        from pytest_cudagate.reports.html_page import render  # the page and its plots: only where one is written

        from pytest_cudagate.reports.model import Report

        try:
            report = from_json(Report, document)
        except ReadError as exc:
            check(document, out_dir / REPORT_JSON)  # what the schema says of it comes first
            raise FileError(out_dir / REPORT_JSON, [str(exc)]) from None
        html = render(report)
    with run_phase("report_json"):
        if clock is not None:
            busy = clock.cases_busy()
            run = {**document["runs"][-1], "phases": clock.snapshot()}
            if busy is not None:
                run["cases_busy"] = busy
            document = {**document, "runs": [*document["runs"][:-1], run]}  # the caller's document stays as it was
        check(document, out_dir / REPORT_JSON)
    with run_phase("report_requests"):
        output.folder(out_dir, "report")  # a folder that cannot be made is named, not its requests/ inside
        if requests:
            output.folder(requests_dir, "report", inside=True)
        for name, request in requests.items():
            write_text(requests_dir / name, dumps(request), scrubber)
    with run_phase("report_html"):
        write_text(out_dir / REPORT_HTML, html, scrubber)
    with run_phase("report_json"):
        write_text(out_dir / REPORT_JSON, dumps(document), scrubber)
    return out_dir / REPORT_JSON


def _beyond_schema(document: dict) -> list[str]:
    """What report.schema.json cannot say: each item's run is one of the runs, no interval's low lies
    above its high, no output has more mismatched or unwritten elements than elements, and every
    date exists."""
    found = []
    runs = len(document["runs"])
    stray = [(i, item["run"]) for i, item in enumerate(document["items"]) if item["run"] >= runs]
    if stray:
        (index, run), more = stray[0], len(stray) - 1
        found.append(f"items[{index}].run: {run} names no run (the report has {runs} run{'s' if runs != 1 else ''})"
                     f"{f', nor do {more} more items' if more else ''}")
    dates = [("created", document["created"]), *((f"runs[{n}].created", r["created"]) for n, r in enumerate(document["runs"]))]
    for where, text in dates:
        try:
            datetime.fromisoformat(text)
        except ValueError:
            found.append(f"{where}: {text[:40]!r} is not a date that exists")
    for n, item in enumerate(document["items"]):
        latency = item.get("latency") or {}
        intervals = [("latency.estimate", latency.get("estimate")), ("latency.run_spread", latency.get("run_spread")),
                     ("latency.release.estimate", (latency.get("release") or {}).get("estimate")),
                     ("latency.release.run_spread", (latency.get("release") or {}).get("run_spread")),
                     ("library.estimate", (item.get("library") or {}).get("estimate"))]
        for where, interval in intervals:
            if interval and interval["low"] is not None and interval["high"] is not None \
                    and interval["low"] > interval["high"]:
                found.append(f"items[{n}].{where}: low {interval['low']:g} is above high {interval['high']:g}")
        for k, comparison in enumerate((item.get("correctness") or {}).get("comparisons") or []):
            for part in ("mismatches", "unwritten"):
                if comparison.get(part, 0) > comparison["total"]:
                    found.append(f"items[{n}].correctness.comparisons[{k}].{part}: {comparison[part]} is more than "
                                 f"its total of {comparison['total']} elements")
    return found


def check(document: dict, path: Path) -> None:
    """Raise :class:`FileError` naming ``path`` and every problem if ``document`` is not a report that
    report.schema.json and :func:`_beyond_schema` allow; what the gate writes and what every reader
    takes (report merge, report comment, history record, diff --report) pass this one check."""
    validate(document, "report", path)
    found = _beyond_schema(document)
    if found:
        raise FileError(path, found)


def read_report(path: Path) -> Report:
    """A report.json (or the folder holding one) as :func:`read_document` reads it, as typed objects."""
    path = Path(path)
    return typed(read_document(path), path / REPORT_JSON if _is_dir(path) else path)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long, a loop of links: read_document has said so already
        return False


def typed(document: dict, path: Path) -> Report:
    """A :func:`check`-ed report document as its objects; what they cannot hold (what the schema does
    not say, e.g. an interval of ratio 0) is one line naming the file and the field."""
    from pytest_cudagate.reports.model import Report

    try:
        return from_json(Report, document)
    except ReadError as exc:
        raise CudagateError(f"{path}: {exc}; use the report.json a gate run or `cudagate report merge` wrote") from None


def read_document(path: Path) -> dict:
    """A report.json (or the folder holding one), read within the boundary's rules (another job's
    artifact: any size, depth or kind of file) and :func:`check`-ed, as JSON (a plugin's report writer
    is given this); a bad one is one line naming the file and the first field at fault."""
    path = Path(path)
    try:
        if path.is_dir():
            path = path / REPORT_JSON
    except OSError as exc:  # a name too long, a loop of links
        raise CudagateError(f"{output.shown(path)}: cannot read the report: {exc.strerror}") from None
    try:
        document = load_json(path, MAX_REPORT_BYTES, "report")
    except FileNotFoundError:
        raise CudagateError(f"{path}: cannot read the report: no such file; name a report folder or its "
                            f"{REPORT_JSON}") from None
    except FileError as exc:  # the boundary's refusal says its own fix
        raise one_line(exc) from None
    try:
        check(document, path)
    except FileError as exc:
        raise one_line(exc, "use the report.json a gate run or `cudagate report merge` wrote") from None
    return document


def one_line(error: FileError, fix: str = "") -> CudagateError:
    """``error`` as one line: the file, its first problem, how many more, and ``fix``."""
    more = len(error.problems) - 1
    others = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return CudagateError(f"{error.path}: {error.problems[0]}{others}" + (f"; {fix}" if fix else ""))
