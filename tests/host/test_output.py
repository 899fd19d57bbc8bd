"""Issue 41, finding 4: what `report comment --out`, `report merge OUT` and `history show --out` write
is the file asked for and nothing else (pytest_cudagate.host.output): a device, a link (planted in a
checkout, or where the temporary file would go) or a folder is refused before anything is written,
and what was there is left as it was."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bad_input_cases import device
from report_fixtures import build_scenario, built_report
from test_bounded_reads import cli, refused
from test_history import Project
from test_release import commit
from pytest_cudagate.reports.writer import REPORT_HTML, REPORT_JSON, write_report

VICTIM = "a file the pull request wants overwritten\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("output") / "report"
    write_report(folder, built_report(build_scenario(folder.parent / "scale"), folder))
    return folder


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM)
    return path


def test_comment_out_a_device_is_refused_and_left_a_device(report, tmp_path, capsys):
    node = device(tmp_path)
    kind = stat.S_IFMT(os.lstat(node).st_mode)
    refused(cli(capsys, "report", "comment", report, "--out", node), f"{node}: is not a regular file")
    assert stat.S_IFMT(os.lstat(node).st_mode) == kind  # not replaced by a text file
    assert os.listdir(tmp_path) == ["full"]  # and no temporary file left beside it


def test_comment_out_a_link_is_refused_and_its_target_untouched(report, tmp_path, victim, capsys):
    (tmp_path / "comment.md").symlink_to(victim)
    refused(cli(capsys, "report", "comment", report, "--out", tmp_path / "comment.md"), "is a symbolic link")
    assert victim.read_text() == VICTIM and (tmp_path / "comment.md").is_symlink()


def test_a_link_where_the_temporary_file_used_to_go_is_never_written_through(report, tmp_path, victim, capsys):
    (tmp_path / ".comment.md.tmp").symlink_to(victim)
    code, out = cli(capsys, "report", "comment", report, "--out", tmp_path / "comment.md")
    assert code == 0, out
    assert victim.read_text() == VICTIM and (tmp_path / ".comment.md.tmp").is_symlink()
    assert (tmp_path / "comment.md").read_text().startswith("<!-- cudagate-comment -->")


def test_merge_into_a_folder_with_a_planted_link_writes_nothing(report, tmp_path, victim, capsys):
    out = tmp_path / "merged"
    out.mkdir()
    (out / REPORT_HTML).symlink_to(victim)  # committed into the checkout where CI merges
    refused(cli(capsys, "report", "merge", out, report), f"{out / REPORT_HTML}: is a symbolic link")
    assert victim.read_text() == VICTIM and os.listdir(out) == [REPORT_HTML]
    (out / REPORT_HTML).unlink()
    for _ in range(2):  # the link gone: a merge, and another over it, replace their own files
        code, text = cli(capsys, "report", "merge", out, report)
        assert code == 0, text
    assert json.loads((out / REPORT_JSON).read_text())["counts"]["total"] == 6
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]


def test_a_requests_folder_that_is_a_link_writes_nothing(report, tmp_path, capsys):
    out, elsewhere = tmp_path / "merged", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "requests").symlink_to(elsewhere)
    refused(cli(capsys, "report", "merge", out, report), f"{out / 'requests'}: is a symbolic link")
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(out)) == ["requests"]


def test_history_show_never_writes_through_a_link_in_its_folder(tmp_path, victim, capsys):
    project = Project(tmp_path)
    commit(project.root, "a change")
    assert project.record(project.report()) == 0
    page = tmp_path / "page"
    page.mkdir()
    (page / "history.html").symlink_to(victim)
    refused(cli(capsys, "history", "show", "--db", project.db, "--out", page), f"{page / 'history.html'}: is a symbolic link")
    assert victim.read_text() == VICTIM and sorted(os.listdir(page)) == ["history.html"]  # nor the exports beside it
