"""Issue 41, item 7: every reader of report.json (report merge, report comment, history record, diff
--report) refuses what the schema and the checks beyond it do not allow, through the one check the gate
writes with, in one line naming the file and the field."""

from __future__ import annotations

import json

import pytest

from report_fixtures import build_scenario, built_report
from test_bounded_reads import cli, refused
from test_history import Project
from test_release import commit
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.errors import FileError
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.reports.writer import REPORT_JSON, dumps, read_report, write_report

WRONG = "items[0].latency.estimate: low 1.3 is above high 1.1"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    """A git repository of the report scenario's suite (its kernel approved), and a report of it whose
    regressed case's interval is upside down."""
    project = Project(tmp_path_factory.mktemp("readers"))
    suite = project.scenario.suite
    ledger = Ledger.for_suite(suite)
    ledger.approvals[suite.kernels[0].name] = approval_for(ledger, suite.kernels[0], approved_by="alice",
                                                           approved_at="2026-11-29T00:00:00Z", git={}, tool_version="t")
    ledger.save()
    commit(project.root, "approved")
    report = project.report()
    document = json.loads((report / REPORT_JSON).read_text())
    document["items"][0]["latency"]["estimate"].update(low=1.3, high=1.1)
    (report / REPORT_JSON).write_text(json.dumps(document))
    project.bad = report
    return project


READERS = {
    "report merge": lambda p, tmp: ["report", "merge", tmp / "merged", p.bad],
    "report comment": lambda p, tmp: ["report", "comment", p.bad],
    "history record": lambda p, tmp: ["history", "record", p.bad, "--db", tmp / "h.sqlite", "--repo", p.root],
    "diff --report": lambda p, tmp: ["diff", p.scenario.suite.path, p.scenario.suite.kernels[0].name,
                                     "--report", p.bad / REPORT_JSON],
}


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_an_interval_upside_down_in_one_line(project, reader, tmp_path, capsys):
    out = refused(cli(capsys, *READERS[reader](project, tmp_path)), f"{project.bad / REPORT_JSON}: {WRONG}")
    assert len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "merged").exists() and not (tmp_path / "h.sqlite").exists()


def test_the_gate_writes_no_report_its_readers_would_refuse(tmp_path):
    built = built_report(build_scenario(tmp_path / "scale"))
    timed = next(i for i in built.document["items"] if (i["latency"] or {}).get("estimate"))
    timed["latency"]["estimate"].update(low=1.3, high=1.1)
    with pytest.raises(FileError, match="latency.estimate: low 1.3 is above high 1.1"):
        write_report(tmp_path / "report", built)
    assert not (tmp_path / "report").exists()


def test_a_report_read_back_and_written_again_is_the_same_file(tmp_path, capsys):
    """Issue 45: the renderers take report.json as its objects (wire.from_json), and to_json of what was
    read is the document read, key order included: `report merge` of one report writes the same items."""
    scenario = build_scenario(tmp_path / "scale")
    written = write_report(tmp_path / "report", built_report(scenario, tmp_path / "report"))
    report = read_report(tmp_path / "report")
    assert [(i.nodeid, i.status) for i in report.items] == [(i["nodeid"], i["status"])
                                                           for i in json.loads(written.read_text())["items"]]
    assert dumps(to_json(report)) == written.read_text(encoding="utf-8")
    assert cli(capsys, "report", "merge", tmp_path / "merged", tmp_path / "report")[0] == 0
    merged, alone = (json.loads(p.read_text(encoding="utf-8")) for p in (tmp_path / "merged" / REPORT_JSON, written))
    for item in merged["items"] + alone["items"]:
        item["reproduce"] = [line.replace(str(tmp_path / "merged"), "OUT") for line in item["reproduce"]]
        item["reproduce"] = [line.replace(str(tmp_path / "report"), "OUT") for line in item["reproduce"]]
    assert [json.dumps(i) for i in merged["items"]] == [json.dumps(i) for i in alone["items"]]


def test_what_the_report_objects_cannot_hold_is_one_line_naming_the_file_and_field(tmp_path, capsys):
    """A summary the schema allows (n and median) but the objects cannot hold (a SampleSummary has
    every statistic): one line, the file and the field, never a traceback; nothing is written."""
    built = built_report(build_scenario(tmp_path / "scale"))
    write_report(tmp_path / "report", built)
    document = json.loads((tmp_path / "report" / REPORT_JSON).read_text())
    timed = next(n for n, i in enumerate(document["items"]) if (i["latency"] or {}).get("approved"))
    del document["items"][timed]["latency"]["approved"]["mean"]
    (tmp_path / "report" / REPORT_JSON).write_text(json.dumps(document))
    for command in (["report", "comment", tmp_path / "report"], ["report", "merge", tmp_path / "merged", tmp_path / "report"]):
        out = refused(cli(capsys, *command), f"{tmp_path / 'report' / REPORT_JSON}: items[{timed}].latency.approved.mean: "
                                            "is missing; use the report.json a gate run or `cudagate report merge` wrote")
        assert len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "merged").exists()
