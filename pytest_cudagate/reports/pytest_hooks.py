"""What ``pytest --cuda-gate`` does with the outcomes at the end of a session: the report folder,
the pytest-benchmark JSON file, and in GitHub Actions the job summary and annotations."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudagate import extensions, phases
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.reports import github
from pytest_cudagate.reports.locate import from_items

# The report's modules (its document, HTML page, plots and pytest-benchmark JSON) are imported in
# session_finish, and only when a session writes something: a gate run without --cuda-gate-report,
# --cuda-gate-benchmark-json or GitHub Actions never loads them.
if TYPE_CHECKING:
    from pytest_cudagate.reports.document import Built
    from pytest_cudagate.reports.model import Report
    from pytest_cudagate.host.scrub import Scrubber

_DONE = pytest.StashKey[bool]()
# An xdist controller's stand-in for its uncollected items, for the report's locations: (suite, kernel,
# case) -> ItemInfo of each item a worker ran (filled by xdist_hooks).
GATHERED = pytest.StashKey[dict]()


def build(config: pytest.Config, runtime: Any, exitstatus: int | None, report_dir: str | None) -> Built:
    from pytest_cudagate.reports.document import build_report

    session = config.pluginmanager.get_plugin("session")
    return build_report(
        list(runtime.outcomes), list(runtime.skipped),
        index={**config.stash.get(GATHERED, {}), **from_items(getattr(session, "items", None) or [])},
        fingerprint=getattr(runtime, "fingerprint", None), options=getattr(runtime, "options", None),
        selection=getattr(runtime, "selection", None),
        trusted_ref=getattr(getattr(runtime, "trust_root", None), "ref", None),
        pull_request=getattr(getattr(runtime, "trust_root", None), "pull_request", None),
        trust=getattr(runtime, "trust", None) or {}, root=Path(config.rootpath),
        tested=runtime.tested, compiles=runtime.compiles,
        exitstatus=None if exitstatus is None else int(exitstatus),
        report_dir=display_path(report_dir) if report_dir else None)


def _say(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, file=sys.stdout, flush=True)


def _publish_to_github(config: pytest.Config, document: Report, scrubber: Scrubber) -> None:
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as handle:
            handle.write(scrubber.text(github.summary_markdown(document)))
    lines = github.workflow_annotations(document, Path(config.rootpath), os.environ.get("GITHUB_WORKSPACE"))
    github.publish([scrubber.text(line) for line in lines], lambda line: _say(config, line))


def session_finish(config: pytest.Config, runtime: Any, exitstatus: int) -> None:
    """Write what was asked for; once per session, and only where outcomes are known. A plugin's
    fields and writers (:mod:`pytest_cudagate.hookspecs`) that fail are each one line, and the report
    is written without them."""
    if runtime is None or config.stash.get(_DONE, False) or hasattr(config, "workerinput"):
        return  # an xdist worker's outcomes reach the controller's runtime, which reports them
    config.stash[_DONE] = True
    report_dir = config.getoption("cuda_gate_report", None)
    benchmark_file = config.getoption("cuda_gate_benchmark_json", None)
    if not (report_dir or benchmark_file or github.in_actions()):
        return
    problems: list[str] = []
    with phases.run_phase("report_build"):
        from pytest_cudagate.host.scrub import Scrubber
        from pytest_cudagate.boundary.wire import to_json
        from pytest_cudagate.reports.writer import (REPORT_HTML, REPORT_JSON, check, dumps, read_document, typed,
                                                    write_report, write_text)

        scrubber = Scrubber()
        built = build(config, runtime, exitstatus, report_dir)
        data = to_json(built.document)
        if report_dir:
            changed, problems = extensions.update_report(config, data, check)
            if changed is not data:  # a plugin's fields
                built.document = typed(changed, Path(report_dir) / REPORT_JSON)
        document = typed(scrubber.data(to_json(built.document)), Path(report_dir or ".") / REPORT_JSON)
    clock = phases.RUN.get()
    try:
        if report_dir:
            path = write_report(Path(report_dir), built, scrubber, clock)
            _say(config, f"cudagate report: {display_path(Path(report_dir) / REPORT_HTML)}")
            writers, refused = extensions.report_writers(config)
            problems += refused
            if writers:  # given the report as written, its run's phases included
                problems += extensions.run_writers(writers, read_document(path), Path(report_dir))
        if benchmark_file:
            with phases.run_phase("benchmark_json"):
                from pytest_cudagate.reports.benchmark_json import benchmark_document

                write_text(Path(benchmark_file), dumps(benchmark_document(document, Path(config.rootpath))),
                           scrubber, "pytest-benchmark file")
            _say(config, f"cudagate timings (pytest-benchmark JSON): {display_path(benchmark_file)}")
    except (CudagateError, OSError) as exc:
        problems.append(f"could not write the report: {exc}")
    if problems:
        # An output that was asked for and is missing must not pass unseen: say why and fail the session.
        for line in problems:
            _say(config, f"cudagate: {line}")
        session = config.pluginmanager.get_plugin("session")
        if session is not None:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    if github.in_actions():
        with phases.run_phase("github"):
            _publish_to_github(config, document, scrubber)
