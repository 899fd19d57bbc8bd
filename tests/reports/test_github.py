"""GitHub Actions output: workflow-command escaping, annotations and the job summary."""

from __future__ import annotations

import pytest

from report_fixtures import as_report, build_scenario, built_report
from pytest_cudagate.reports import escape, github
from pytest_cudagate.host.scrub import Scrubber


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    scenario = build_scenario(tmp_path_factory.mktemp("gh") / "scale")
    scenario.outcomes[1].message += "\n100% of 3 samples: a,b"  # a percent sign and newlines to escape
    return Scrubber({}).data(built_report(scenario).document)


def test_escaping_follows_the_runner_rules():
    assert escape.annotation("50% off\r\nnext") == "50%25 off%0D%0Anext"
    assert escape.annotation_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    assert github.command("error", "two\nlines", file="k.cu", line=1, title="x: y, z") == \
        "::error file=k.cu,line=1,title=x%3A y%2C z::two%0Alines"
    assert github.command("warning", "plain") == "::warning::plain"


def test_annotations_point_at_the_kernel_source(document):
    lines = github.workflow_annotations(as_report(document))
    errors = [line for line in lines if line.startswith("::error ")]
    warnings = [line for line in lines if line.startswith("::warning ")]
    assert len(errors) == 2 and len(warnings) == 2 and len(lines) == 4
    assert all(line.startswith("::error file=scale/scale.cu,line=1,title=cudagate%3A scale2 × ") for line in errors)
    edge = next(line for line in errors if "× edge" in line)
    message = edge.split("::", 2)[2]
    assert "\n" not in edge and "%0A" in message and "100%25 of 3 samples: a,b" in message
    assert "reproduce: pytest --cuda-gate 'scale/cudagate.yaml::scale2::edge'" in message
    assert any("inconclusive" in line for line in warnings) and any("incomparable" in line for line in warnings)


def test_annotation_paths_are_relative_to_the_workspace(tmp_path):
    root = tmp_path / "repo"
    assert github.annotation_path("kernels/k.cu", root, str(tmp_path)) == "repo/kernels/k.cu"
    assert github.annotation_path("kernels/k.cu", root, None) == "kernels/k.cu"
    assert github.annotation_path(None, root, str(tmp_path)) is None


def test_job_summary_lists_failures_first(document):
    text = github.summary_markdown(as_report(document))
    assert text.startswith("## ❌ cudagate FAIL: 2 failed · 3 passed (2 with a warning) · 1 skipped of 6")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "kernel × case" not in line
            and not line.startswith("| ---")]
    assert [row.split(" | ")[1] for row in rows] == ["scale2 × perf", "scale2 × edge", "scale2 × perf_tall",
                                                       "scale2 × perf_wide", "scale2 × small", "scale2 × perf_odd"]
    assert rows[0].startswith("| **FAILED** |") and "[1.2" in rows[0] and "regressed" in rows[0]
    assert all(row.count(" | ") == 8 for row in rows)  # no cell broke the table
    assert document["runs"][0]["fingerprint"]["key"] in text
