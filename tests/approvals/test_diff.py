"""`cudagate diff`: source, options and launch changes against the approved version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from report_fixtures import build_scenario, built_report
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.cli import main
from pytest_cudagate.approvals.diff import kernel_diff
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.reports.writer import write_report
from pytest_cudagate.suite.loader import load_suite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "softmax"


@pytest.fixture()
def suite_dir(tmp_path):
    target = tmp_path / "softmax"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved"))
    return target


def approve(suite_dir: Path) -> None:
    suite = load_suite(suite_dir / "cudagate.yaml")
    ledger = Ledger.for_suite(suite)
    ledger.approvals["softmax_rows"] = approval_for(ledger, suite.kernels[0], approved_by="alice",
                                                    approved_at="2026-11-29T00:00:00Z", git={"commit": "abc1234def"},
                                                    tool_version="test")
    ledger.save()


def test_unapproved_kernel_says_how_to_approve(suite_dir):
    with pytest.raises(CudagateError, match="cudagate approve"):
        kernel_diff(load_suite(suite_dir / "cudagate.yaml"), "softmax_rows")


def test_unchanged_kernel(suite_dir):
    approve(suite_dir)
    lines = kernel_diff(load_suite(suite_dir / "cudagate.yaml"), "softmax_rows")
    assert "approved" in lines[0] and "alice" in lines[0] and "abc1234def" in lines[0]
    assert any("unchanged" in line for line in lines)


def test_source_options_and_launch_changes_are_listed(suite_dir, tmp_path):
    approve(suite_dir)
    source = suite_dir / "softmax.cu"
    source.write_text(source.read_text().replace("#define BLOCK 256", "#define BLOCK 128"))
    yaml_path = suite_dir / "cudagate.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("launch: {grid: [rows], block: [256]}",
                                                       "options: [-DFAST]\n    launch: {grid: [rows], block: [128]}"))
    built = built_report(build_scenario(tmp_path / "scale"))  # a report the gate wrote, its regressed item renamed
    item = next(i for i in built.document["items"] if (i["latency"] or {}).get("verdict") == "regressed")
    item.update(suite="softmax", kernel="softmax_rows", case="perf_256x1024")
    item["latency"]["estimate"].update(ratio=1.05, low=1.04, high=1.06)
    report = write_report(tmp_path / "report", built)
    lines = kernel_diff(load_suite(yaml_path), "softmax_rows", report)
    text = "\n".join(lines)
    assert "-#define BLOCK 256" in text and "+#define BLOCK 128" in text
    assert "options: [] -> ['-DFAST']" in text
    assert "launch for perf_256x1024: grid [256, 1, 1] block [256, 1, 1]" in text and "block [128, 1, 1]" in text
    assert "latency perf_256x1024: +5.0% [1.040, 1.060] regressed" in text


def test_cli_diff(suite_dir, capsys):
    approve(suite_dir)
    assert main(["diff", str(suite_dir / "cudagate.yaml"), "softmax_rows"]) == 0
    assert "unchanged" in capsys.readouterr().out
    assert main(["diff", str(suite_dir / "cudagate.yaml"), "nope"]) == 2
