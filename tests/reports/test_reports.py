"""report.json + report.html from recorded outcomes: schema, content, requests, hashes, merge."""

from __future__ import annotations

import copy
import json
import re
import sys

import pytest

from report_fixtures import build_scenario, built_report, h100
from pytest_cudagate.reports import cli as report_cli
from pytest_cudagate.reports.hashes import file_sha256
from pytest_cudagate.reports.merge import merge_reports
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.reports.writer import read_document, write_report
from pytest_cudagate.boundary.schema import problems
import argparse
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.judge.outcome import CaseOutcome, Failure
from pytest_cudagate.judge.latency import AdaptiveSampler
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.reports.document import build_report

# What would make a browser fetch something: scripts, stylesheets, images, frames, CSS url()/@import.
EXTERNAL_LOAD = re.compile(
    r"<script\b|<link\b[^>]*href|<(img|iframe|embed|object|source|video|audio)\b[^>]*\b(src|data)\s*=\s*[\"']?(https?:)?//"
    r"|url\(\s*[\"']?(https?:)?//|@import|<image\b[^>]*href\s*=\s*[\"'](https?:)?//", re.IGNORECASE)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    scenario = build_scenario(base / "scale")
    report_dir = base / "out"
    write_report(report_dir, built_report(scenario, report_dir))
    return scenario, report_dir, json.loads((report_dir / "report.json").read_text())


def item(document: dict, case: str) -> dict:
    return next(i for i in document["items"] if i["case"] == case)


def test_report_json_validates_and_broken_ones_do_not(written):
    _, report_dir, document = written
    assert problems(document, "report") == []
    assert read_document(report_dir)["verdict"] == "fail"
    broken = []
    for mutate in (lambda d: d.pop("verdict"), lambda d: d["items"][0].update(status="sort of"),
                   lambda d: d["items"][0]["correctness"].update(passed="yes"),
                   lambda d: d["runs"][0]["fingerprint"].update(key="not hex"),
                   lambda d: d["items"][0]["inputs"].update({"x.npy": "md5:abc"}),
                   lambda d: d["items"][0].update(extra=1)):
        doc = copy.deepcopy(document)
        mutate(doc)
        broken.append(problems(doc, "report"))
    assert all(broken), broken


def test_verdict_counts_and_order(written):
    _, _, document = written
    assert document["verdict"] == "fail"
    assert document["counts"] == {"failed": 2, "errors": 0, "warning": 2, "passed": 3, "skipped": 1, "regressed": 1, "total": 6}
    statuses = [i["status"] for i in document["items"]]
    assert statuses == ["failed", "failed", "warning", "warning", "passed", "skipped"]
    assert document["items"][0]["case"] == "perf"  # the latency regression leads the failures


def test_items_carry_the_evidence(written):
    scenario, _, document = written
    wrong = item(document, "edge")
    assert wrong["category"] == "correctness" and wrong["nodeid"] == "scale/cudagate.yaml::scale2::edge"
    comparison = wrong["correctness"]["comparisons"][0]
    assert comparison["mismatches"] == 3 and comparison["worst_actual"] == "nan" and comparison["rel_norm"] == "inf"
    assert comparison["worst_index"] == [0, 2]
    regressed = item(document, "perf")
    assert regressed["latency"]["verdict"] == "regressed" and regressed["category"] == "latency regressed"
    assert regressed["latency"]["estimate"]["low"] > 1.02
    assert len(regressed["samples_ms"]["approved"]) == len(regressed["samples_ms"]["current"]) == 800
    assert regressed["latency"]["telemetry"][0]["sm_clock_mhz"] == 1980 and regressed["worker_s"] == 2.41
    assert regressed["source"] == "scale/scale.cu" and regressed["suite_path"] == "scale/cudagate.yaml"
    assert document["runs"][0]["fingerprint"]["key"] == scenario.fingerprint.key()
    assert document["suites"] == [{"name": "scale", "path": "scale/cudagate.yaml",
                                   "signature": scenario.trust[str(scenario.suite.path)]}]
    assert item(document, "perf_odd")["status"] == "skipped"


def test_input_hashes_are_the_case_files(written):
    scenario, _, document = written
    inputs = item(document, "perf")["inputs"]
    case_dir = scenario.suite.case_dir(scenario.suite.case("perf"))
    assert inputs == {"cases/perf/x.npy": file_sha256(case_dir / "x.npy"),
                      "cases/perf/expected/y.npy": file_sha256(case_dir / "expected" / "y.npy")}


def test_run_requests_are_saved_replayable_and_named_in_the_commands(written):
    _, report_dir, document = written
    saved = sorted((report_dir / "requests").glob("*.json"))
    # one `run` per replayed case, and a `compare` conversation becomes one per version (current, approved)
    assert {p.name.removeprefix("scale-scale2-") for p in saved} == {
        f"{case}-{document['runs'][0]['fingerprint']['key'][:8]}{role}.json"
        for case, role in (("edge", ""), ("perf", ""), ("perf", "-approved"), ("perf_tall", ""),
                           ("perf_wide", ""), ("perf_wide", "-approved"), ("small", ""))}
    for path in saved:
        request = json.loads(path.read_text())
        assert problems(request, "harness-request") == [], path
        assert request["op"] == "run" and request["cases"][0]["expected"] and request["cases"][0]["tolerance"]
    for entry in document["items"]:
        assert entry["reproduce"][0] == f"pytest --cuda-gate '{entry['nodeid']}'"
        for name, command in zip(entry["requests"], entry["reproduce"][1:], strict=True):
            assert (report_dir / name).is_file()
            assert command == f"cudagate run {report_dir}/{name}"


def test_html_is_self_contained_and_leads_with_the_verdict(written):
    _, report_dir, document = written
    page = (report_dir / "report.html").read_text()
    assert page.index(">FAIL<") < page.index("Regressions and failures") < page.index("All results")
    assert "2 failed · 3 passed (2 with a warning) · 1 skipped of 6" in page
    problems_table = page[page.index("Regressions and failures"):page.index("All results")]
    regressed = item(document, "perf")["latency"]["estimate"]
    assert "scale2 × perf" in problems_table and f"[{regressed['low']:.3f}, {regressed['high']:.3f}]" in problems_table
    assert "scale2 × small" not in problems_table
    assert document["runs"][0]["fingerprint"]["key"] in page
    assert page.count("<svg") == 3 and "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert not EXTERNAL_LOAD.search(page), EXTERNAL_LOAD.search(page)
    assert "cudagate run " in page and "expected -0.1" in page  # reproduction and the worst element


def test_html_plots_need_no_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any import of it now fails
    scenario = build_scenario(tmp_path / "scale")
    write_report(tmp_path / "out", built_report(scenario))
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="plot"') == 3 and "matplotlib" not in page


def test_a_report_without_a_gpu(tmp_path):
    scenario = build_scenario(tmp_path / "scale")
    scenario.outcomes, scenario.fingerprint = [], None
    scenario.skipped = [(scenario.suite.name, "scale2", c.name, c.kind) for c in scenario.suite.cases]
    write_report(tmp_path / "out", built_report(scenario, exitstatus=0))
    document = read_document(tmp_path / "out")
    assert document["verdict"] == "warn" and document["runs"][0]["fingerprint"] is None
    assert "no GPU" in (tmp_path / "out" / "report.html").read_text()


def test_merge_two_fingerprints(tmp_path):
    first, second = build_scenario(tmp_path / "a" / "scale"), build_scenario(tmp_path / "b" / "scale", fingerprint=h100())
    write_report(tmp_path / "h200", built_report(first, tmp_path / "h200"))
    write_report(tmp_path / "h100", built_report(second, tmp_path / "h100"))
    out = tmp_path / "merged"
    write_report(out, merge_reports([tmp_path / "h200", tmp_path / "h100"], out))
    merged = read_document(out)
    keys = [r["fingerprint"]["key"] for r in merged["runs"]]
    assert keys == [first.fingerprint.key(), second.fingerprint.key()] and keys[0] != keys[1]
    assert merged["counts"]["total"] == 12 and merged["counts"]["failed"] == 4 and merged["verdict"] == "fail"
    assert {(i["case"], i["run"]) for i in merged["items"]} == {(c.name, r) for c in first.suite.cases for r in (0, 1)}
    assert len(list((out / "requests").glob("*.json"))) == 14
    for entry in merged["items"]:
        for command in entry["reproduce"][1:]:
            assert command.startswith(f"cudagate run {out}/requests/")
            assert (out / command.split(f"{out}/", 1)[1]).is_file()
    page = (out / "report.html").read_text()
    assert all(key in page for key in keys) and "NVIDIA H100 80GB HBM3" in page and "NVIDIA H200" in page


def test_cudagate_report_merge_command(tmp_path, capsys):
    scenario = build_scenario(tmp_path / "scale")
    write_report(tmp_path / "one", built_report(scenario, tmp_path / "one"))
    parser = argparse.ArgumentParser(prog="cudagate")
    report_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", "merge", str(tmp_path / "all"), str(tmp_path / "one"), "--check"])
    assert args.func(args) == 1  # --check: the merged verdict is FAIL
    assert (tmp_path / "all" / "report.html").is_file() and "FAIL" in capsys.readouterr().out
    args = parser.parse_args(["report", "merge", str(tmp_path / "again"), str(tmp_path / "one" / "report.json")])
    assert args.func(args) == 0


def test_merge_refuses_a_report_that_is_not_one(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "report.json").write_text(json.dumps({"format": "cudagate-report"}))
    with pytest.raises(CudagateError, match="report.json"):
        merge_reports([tmp_path / "bad"], tmp_path / "out")
    with pytest.raises(CudagateError, match="cannot read"):
        merge_reports([tmp_path / "missing"], tmp_path / "out")


def test_saved_requests_are_accepted_by_cudagate_run(written):
    _, report_dir, document = written
    request = report_dir / item(document, "edge")["requests"][0]
    assert main(["run", str(request)]) != EXIT_INPUT  # replays on a GPU; here it gets as far as "no CUDA device"


def test_faults_compile_errors_and_unstable_timings_render(tmp_path):
    scenario = build_scenario(tmp_path / "scale")
    fault = CaseOutcome("scale", "scale2", "small", "correctness", failed=True)
    fault.correctness = judge_case("scale2", "small", {"status": "error", "error": {
        "kind": "fault", "message": "CUDA_ERROR_ILLEGAL_ADDRESS at launch 1"}}, {}, {})
    fault.message = fault.correctness.describe()
    broken = CaseOutcome("scale", "scale2", "edge", "correctness", failed=True, failure=Failure.COMPILE,
                         message="scale.cu does not compile:\n"
                                 "scale.cu(3): error: identifier \"undefined_value_here\" is undefined")
    sampler = AdaptiveSampler(0.02)
    for _ in range(5):
        sampler.decide({"approved": [0.01] * 100, "current": [0.01] * 100, "wall_s": 0.05,
                        "disturbances": ["clock event sw_thermal_slowdown (after)"], "state": {"nvml": "unavailable: no NVML"}})
    unstable = CaseOutcome("scale", "scale2", "perf", "performance", latency=sampler.result(),
                           correctness=scenario.outcomes[0].correctness, warning="latency unstable: the GPU was disturbed")
    scenario.outcomes, scenario.skipped = [fault, broken, unstable], []
    write_report(tmp_path / "out", built_report(scenario))
    document = read_document(tmp_path / "out")
    assert [(i["case"], i["status"], i["category"]) for i in document["items"]] == [
        ("edge", "failed", "compile"), ("small", "failed", "fault"), ("perf", "warning", "latency unstable")]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in page and "sw_thermal_slowdown" in page and "undefined_value_here" in page


def test_the_failures_category_is_the_failure_named_where_it_was_found_never_the_message_text(tmp_path):
    """A hang whose message quotes a kernel's log saying "does not compile" is an error, not a compile
    failure; a case-data failure is one whatever its words."""
    scenario = build_scenario(tmp_path / "scale")
    hang = CaseOutcome("scale", "scale2", "edge", "correctness", failed=True,
                       message="not run: scale2 did not finish case small; its log: helper.cu does not compile")
    data = CaseOutcome("scale", "scale2", "small", "correctness", failed=True, failure=Failure.CASE_DATA,
                       message="case data does not match the signature:\n  - x: 3 values, the signature wants 4")
    scenario.outcomes, scenario.skipped = [hang, data], []
    write_report(tmp_path / "out", built_report(scenario))
    assert [(i["case"], i["category"]) for i in read_document(tmp_path / "out")["items"]] == [
        ("edge", "error"), ("small", "case data")]


def test_an_empty_gate_is_not_a_pass(tmp_path):
    scenario = build_scenario(tmp_path / "scale")
    scenario.outcomes, scenario.skipped = [], []
    write_report(tmp_path / "out", built_report(scenario, exitstatus=5))
    assert read_document(tmp_path / "out")["verdict"] == "warn"
    assert "No case was collected" in (tmp_path / "out" / "report.html").read_text()


def test_all_passing_is_a_pass(tmp_path):
    scenario = build_scenario(tmp_path / "scale")
    scenario.outcomes, scenario.skipped = scenario.outcomes[:1], []
    write_report(tmp_path / "out", built_report(scenario, exitstatus=0))
    page = (tmp_path / "out" / "report.html").read_text()
    assert read_document(tmp_path / "out")["verdict"] == "pass" and ">PASS<" in page
    assert "None: every replayed case passed." in page


def test_without_collected_items_the_requests_locate_each_case(tmp_path):
    scenario = build_scenario(tmp_path / "scale")
    document = to_json(build_report(scenario.outcomes, [], index={}, fingerprint=scenario.fingerprint, root=tmp_path).document)
    edge = item(document, "edge")
    assert edge["nodeid"] == "scale/cudagate.yaml::scale2::edge" and edge["source"] == "scale/scale.cu"
    assert set(edge["inputs"]) == {"cases/edge/x.npy", "cases/edge/expected/y.npy"}
    assert item(document, "perf")["nodeid"] == "scale/cudagate.yaml::scale2::perf"  # from its `compare` request


def test_a_report_where_nothing_was_replayed_does_not_claim_a_pass(tmp_path):
    scenario = build_scenario(tmp_path / "scale")
    scenario.outcomes = []
    write_report(tmp_path / "out", built_report(scenario, exitstatus=0))
    page = (tmp_path / "out" / "report.html").read_text()
    assert "every replayed case passed" not in page and "no case was replayed" in page
