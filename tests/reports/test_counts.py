"""What a report counts and what it says each kernel compiled to, through ``pytest --cuda-gate``: on
CPU (compile items run, cases are skipped) and on the simulated GPU, the report's counts are pytest's
own summary line, in report.json, report.html and the pull-request comment alike; each build and
entry (every entry of a kernel of steps) shows its registers, spills, static shared memory,
compiler and compile time (cold, then "cached")."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest

from fake_worker import fake_gpu_project
from helpers import BROKEN_CU, EXAMPLES, SUITE_YAML, write_suite
from cudagate_harness.compiler import nvrtc_version
from pytest_cudagate.cli import main

pytest_plugins = ["pytester"]

OUTCOMES = ("failed", "passed", "skipped", "errors")
_COUNT = re.compile(r"(\d+) (failed|passed|skipped|errors?)\b")


def counted(text: str) -> dict[str, int]:
    """The outcomes a summary line names, by pytest's words ("1 error" is errors)."""
    found = {name: 0 for name in OUTCOMES}
    for number, word in _COUNT.findall(text):
        found["errors" if word.startswith("error") else word] = int(number)
    return found


def run_gate(pytester: pytest.Pytester, capsys) -> tuple[dict, dict, str, str]:
    """pytest's counts, report.json, report.html and the comment of one ``pytest --cuda-gate`` run."""
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-report", "out",
                                           "-p", "no:cacheprovider", timeout=300)
    out = result.stdout.str()
    summary = [line for line in out.splitlines() if re.match(r"^=* ?\d+ \w+.* in [\d.]+s", line)]
    assert summary, out
    document = json.loads((pytester.path / "out" / "report.json").read_text())
    page = (pytester.path / "out" / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", "comment", str(pytester.path / "out")]) == 0
    return counted(summary[-1]), document, page, capsys.readouterr().out


def heading_counts(page: str, body: str) -> tuple[dict, dict]:
    """The counts line of the HTML report's header and of the comment's heading."""
    in_html = html.unescape(re.search(r'<p class="counts">(.*?)</p>', page).group(1))
    in_comment = next(line for line in body.splitlines() if line.startswith("### "))
    return counted(in_html), counted(in_comment)


@pytest.fixture
def project(pytester, monkeypatch):
    """Three suites: scale, a kernel that does not compile, and the split reduction (a kernel of two
    entries); a compile cache of its own, so the first run compiles cold."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale")
    write_suite(pytester.path / "broken", yaml_text=SUITE_YAML.replace("suite: scale", "suite: broken"),
                kernel_source=BROKEN_CU)
    shutil.copytree(EXAMPLES / "split_reduce", pytester.path / "split_reduce")
    return pytester


@pytest.mark.slow
def test_a_cpu_runs_report_counts_what_pytest_counts_and_shows_every_build(project, capsys):
    tested, document, page, body = run_gate(project, capsys)
    # 3 compile items (broken's fails), 9 cases skipped for want of a GPU
    assert tested == {"failed": 1, "passed": 2, "skipped": 9, "errors": 0}, tested
    assert {name: document["counts"][name] for name in OUTCOMES} == tested
    assert document["counts"]["total"] == 12 and document["runs"][0]["pytest_counts"] == tested
    assert document["verdict"] == "fail"  # the compile item's failure, though no case failed
    assert heading_counts(page, body) == (tested, tested)

    compiles = {(c["kernel"], c["entry"]): c for c in document["runs"][0]["compiles"]}
    assert set(compiles) == {("scale2", "scale2"), ("scale2", "scale2"), ("row_sums_split", "row_partials"),
                             ("row_sums_split", "row_finish")}
    assert len(document["runs"][0]["compiles"]) == 4  # scale2 of scale and of broken
    partials, finish = compiles[("row_sums_split", "row_partials")], compiles[("row_sums_split", "row_finish")]
    # each entry its own: only the first pass declares shared memory
    assert partials["shared_static_bytes"] == 32 and finish["shared_static_bytes"] == 0
    for facts in (partials, finish):
        assert facts["ok"] and facts["compiler"] == f"NVRTC {nvrtc_version()}" and facts["arch"] == "sm_90"
        assert facts["registers"] > 0 and facts["spill_store_bytes"] == facts["spill_load_bytes"] == 0
        assert facts["compile_s"] > 0  # compiled cold by this run
    broken = next(c for c in document["runs"][0]["compiles"] if c["suite"] == "broken")
    assert not broken["ok"] and broken["registers"] is None
    assert re.search(r"<td>row_sums_split</td><td class=\"mono\">row_finish</td><td>sm_90</td>"
                     r"<td class=\"num\">\d+</td><td class=\"num\">0 B</td><td class=\"num\">0 B</td>"
                     r"<td class=\"num\">0 B</td><td>NVRTC [\d.]+</td><td class=\"num\">[\d.]+ s</td>", page), page
    assert re.search(r"^\| split_reduce · row_sums_split · row_partials \| sm_90 \| \d+ \| 0 / 0 B \| 32 B \| "
                     r"NVRTC [\d.]+ \| [\d.]+ s \|$", body, re.M), body
    assert re.search(r"^\| broken · scale2 \| sm_90 \| – \| – \| – \| NVRTC [\d.]+ \| \*\*failed\*\* \|$", body, re.M), body

    _, again, page, body = run_gate(project, capsys)  # the same builds, from the compile cache
    assert [c["compile_s"] for c in again["runs"][0]["compiles"] if c["ok"]] == [None] * 3
    assert "<td class=\"num\">cached</td>" in page
    assert re.search(r"^\| split_reduce · row_sums_split · row_finish \| sm_90 \| \d+ \| 0 / 0 B \| 0 B \| "
                     r"NVRTC [\d.]+ \| cached \|$", body, re.M), body


def test_a_simulated_gpu_runs_report_counts_what_pytest_counts(pytester, monkeypatch, capsys):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale")
    fake_gpu_project(pytester.path)
    tested, document, page, body = run_gate(pytester, capsys)
    assert tested == {"failed": 0, "passed": 3, "skipped": 0, "errors": 0}, tested  # the compile item and 2 cases
    assert {name: document["counts"][name] for name in OUTCOMES} == tested
    assert heading_counts(page, body) == (tested, tested)
    assert [(c["kernel"], c["registers"] > 0) for c in document["runs"][0]["compiles"]] == [("scale2", True)]
