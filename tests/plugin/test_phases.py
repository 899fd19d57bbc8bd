"""The run's phases, on the simulated GPU of fake_worker: `--cuda-gate-durations` names where a gate
run's wall time went, report.json carries the phases measured before it, and neither adds up to
more than the wall time measured from outside the process."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from helpers import SUITE_YAML, write_suite
from pytest_cudagate.phases import RUN_PHASES, RunClock
from pytest_cudagate.boundary.schema import problems

pytest_plugins = ["pytester"]

# Every worker the gate process starts is the in-process fake; GPU locks stay in the project.
CONFTEST = """
import os
import sys

sys.path.insert(0, {tests!r})
from fake_worker import FakeWorker, scale_kernels  # noqa: E402

from fake_worker import use_client  # noqa: E402

use_client(lambda **options: FakeWorker(scale_kernels(), **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), "locks")
"""
TITLE = "cudagate run phases: seconds of this process's wall time until this summary"
ROW = re.compile(r"^\s*(\d+\.\d{3})  (\w+)\s")


def _gate(pytester, *extra: str):
    write_suite(pytester.path / "scale")
    (pytester.path / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).parents[1])))
    started = time.perf_counter()
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "--cuda-gate-fresh-seed", "7", *extra, timeout=300)
    return result, time.perf_counter() - started


def _run_table(lines: list[str]) -> tuple[dict[str, float], float]:
    start = lines.index(TITLE)
    rows = {}
    for line in lines[start + 1:]:
        found = ROW.match(line)
        assert found, f"not a row of the run phases: {line!r}"
        if found.group(2) == "total":
            return rows, float(found.group(1))
        rows[found.group(2)] = float(found.group(1))
    raise AssertionError("the run phases have no total")


@pytest.mark.slow
def test_durations_and_report_json_name_the_run_phases_within_the_wall_time(pytester):
    result, wall = _gate(pytester, "--cuda-gate-durations", "0", "--cuda-gate-report", "out")
    assert result.ret == 0, result.stdout.str()
    lines = result.outlines
    assert lines.index("cudagate durations: all cases, seconds by phase") < lines.index(TITLE)
    rows, total = _run_table(lines)
    assert list(rows) == [p for p in RUN_PHASES if p in rows]
    assert {"startup", "configure", "collection", "suites", "compile", "cases", "pytest", "report_build",
            "report_html", "report_json", "worker_shutdown"} <= set(rows)
    assert rows["startup"] > 0 and rows["configure"] > 0 and rows["cases"] > 0
    assert abs(sum(rows.values()) - total) <= 0.0005 * len(rows) + 1e-9
    assert total <= wall

    document = json.loads((pytester.path / "out" / "report.json").read_text())
    assert problems(document, "report") == []
    run = document["runs"][0]["phases"]
    assert list(run) == [p for p in RUN_PHASES if p in run]
    assert {"startup", "configure", "suites", "cases", "report_build", "report_html"} <= set(run)
    assert "worker_shutdown" not in run and sum(run.values()) <= total
    # Each case's own split is inside the run's case items (the trust checks one of them made aside).
    per_case = sum(sum(item["phases"].values()) for item in document["items"])
    assert 0 < per_case <= run["cases"] + run.get("trust", 0.0) + 1e-3
    assert_busy(document, run)
    document["runs"][0]["phases"]["coffee"] = 1.0
    assert any("coffee" in p for p in problems(document, "report"))


def assert_busy(document: dict, run: dict) -> None:
    """The worker's busy share of the cases' span: its own time on them (no more than the items say it
    spent, waits for the host included there), of which the warm-up and timed launches are a part."""
    busy = document["runs"][0]["cases_busy"]
    worker_total = sum(item["worker_s"] or 0.0 for item in document["items"])
    assert busy["cases_s"] == run["cases"] <= busy["span_s"]
    assert 0 < busy["launches_s"] <= busy["worker_s"] <= min(worker_total + 1e-6, busy["span_s"])
    assert busy["worker_fraction"] == round(busy["worker_s"] / busy["span_s"], 4)
    assert busy["launches_fraction"] == round(busy["launches_s"] / busy["span_s"], 4)


def test_with_runs_sent_ahead_each_case_accounts_for_its_head_start(pytester):
    """Three cases, no compute-sanitizer, a host of many cores: the second and third runs are sent
    while the case before is judged. Each case's phases cover its span (its head start too), no
    case's time is counted twice beyond its head start, and the worker's share stays within the span."""
    write_suite(pytester.path / "scale", yaml_text=SUITE_YAML + (
        "  - {name: perf2, kind: performance, scalars: {rows: 32, cols: 512}}\n" "checks: {sanitizer: off}\n"))
    (pytester.path / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).parents[1]))
                                               + "import pytest_cudagate.gate.lookahead as lookahead\nlookahead.cores = lambda: 16\n")
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "--cuda-gate-report", "out", timeout=300)
    assert result.ret == 0, result.stdout.str()
    document = json.loads((pytester.path / "out" / "report.json").read_text())
    items = {item["case"]: item for item in document["items"]}
    assert items["small"]["head_start_s"] == 0 and items["perf"]["head_start_s"] > 0 and items["perf2"]["head_start_s"] > 0
    run = document["runs"][0]["phases"]
    per_case = sum(sum(item["phases"].values()) for item in document["items"])
    head_starts = sum(item["head_start_s"] for item in document["items"])
    assert per_case <= run["cases"] + run.get("trust", 0.0) + run.get("pytest", 0.0) + head_starts + 1e-3
    assert_busy(document, run)


def test_without_durations_no_run_phases_are_printed(pytester):
    result, _ = _gate(pytester)
    assert result.ret == 0, result.stdout.str()
    assert TITLE not in result.outlines


def test_a_nested_phase_pauses_the_one_it_interrupts():
    clock = RunClock()
    with clock.phase("cases"):
        time.sleep(0.02)
        with clock.phase("trust"):
            time.sleep(0.03)
    seconds = clock.snapshot()
    assert 0.02 <= seconds["cases"] < 0.03 + 0.02 and seconds["trust"] >= 0.03
    assert list(seconds) == [p for p in RUN_PHASES if p in seconds]
