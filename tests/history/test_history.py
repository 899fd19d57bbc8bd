"""`cudagate history record` and `show`: reports written by the real writer, commits in a real git
repository, the SQLite file checked directly, the page in Chromium."""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from report_fixtures import build_scenario, built_report, h100, scenario_for
from test_release import approve, commit, git
from test_browser import CHROMIUM, FLAGS, artifacts, assert_screenshot
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.reports.writer import write_report
from pytest_cudagate.boundary.schema import problems

TIMED = ("perf", "perf_tall", "perf_wide")  # the scenario's cases with a latency verdict and a current latency


class Project:
    """A git repository holding the report scenario's suite, and reports of it written at its commits."""

    def __init__(self, root: Path):
        self.root = root / "repo"
        self.root.mkdir()
        git(self.root, "init", "-q", "-b", "main")
        self.scenario = build_scenario(self.root / "kernels" / "scale")
        self.reports = root / "reports"
        self.db = root / "history.sqlite"
        self.count = 0

    def report(self, factor: float = 1.0, *, fingerprint=None, github: dict | None = None) -> Path:
        """A report of the scenario with the current kernel's latencies × ``factor``."""
        scenario = scenario_for(self.scenario.suite, fingerprint=fingerprint) if fingerprint else self.scenario
        built = built_report(scenario, root=self.root)
        for item in built.document["items"]:
            latency = item.get("latency") or {}
            if latency.get("current"):
                latency["current"]["median"] *= factor
            if item.get("correctness") and item["correctness"].get("median_ms"):
                item["correctness"]["median_ms"] *= factor
        if github:
            built.document["runs"][0]["github"] = github
        self.count += 1
        folder = self.reports / f"r{self.count}"
        write_report(folder, built)
        return folder

    def record(self, report: Path, *extra: str) -> int:
        return main(["history", "record", str(report), "--db", str(self.db), "--repo", str(self.root), *extra])

    def show(self, out: Path, *extra: str) -> int:
        return main(["history", "show", "--db", str(self.db), "--out", str(out), *extra])

    def rows(self, query: str) -> list[tuple]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(query).fetchall()


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_record_stores_each_timed_case_once_with_its_commit(project, capsys):
    approve(project.root, "scale2", "// v1\n")
    first = commit(project.root, "first release", "v1.0.0")
    report = project.report()
    assert project.record(report) == 0
    assert "recorded 3 timed case(s) of 1 run(s)" in capsys.readouterr().out
    assert project.record(report) == 0
    assert "already recorded" in capsys.readouterr().out
    assert project.rows("SELECT count(*) FROM results") == [(3,)]
    assert project.rows('SELECT "case" FROM results ORDER BY "case"') == [(c,) for c in TIMED]
    sha, branch, committed, subject = project.rows("SELECT sha, branch, committed, subject FROM commits")[0]
    assert (sha, branch, subject) == (first, "main", "first release") and committed.endswith("+00:00")
    assert project.rows("SELECT sha, tag FROM tags") == [(first, "v1.0.0")]
    assert project.rows("PRAGMA journal_mode") == [("wal",)]
    approved = project.rows("SELECT DISTINCT approved_sha256 FROM results")
    assert len(approved) == 1 and len(approved[0][0]) == 64  # from the ledger at the commit


def test_a_release_tag_made_later_is_stored_on_the_next_record(project):
    approve(project.root, "scale2", "// v1\n")
    first = commit(project.root, "one")
    assert project.record(project.report()) == 0
    git(project.root, "tag", "v1.1.0", first)
    (project.root / "notes.txt").write_text("later\n")
    commit(project.root, "two")
    assert project.record(project.report(1.1)) == 0
    assert project.rows("SELECT sha, tag FROM tags") == [(first, "v1.1.0")]


def test_show_writes_a_page_and_exports_that_match_the_database(project, tmp_path, capsys):
    approve(project.root, "scale2", "// v1\n")
    shas = [commit(project.root, "first release", "v1.0.0")]
    assert project.record(project.report()) == 0
    for factor, message in ((1.1, "slower"), (1.3, "much slower")):
        (project.root / "notes.txt").write_text(message)
        if message == "much slower":
            approve(project.root, "scale2", "// v2\n")  # approved along with it
        shas.append(commit(project.root, message))
        assert project.record(project.report(factor)) == 0
    capsys.readouterr()
    out = tmp_path / "page"
    assert project.show(out) == 0
    assert "3 chart(s) over 3 commit(s)" in capsys.readouterr().out
    document = json.loads((out / "history.json").read_text())
    assert problems(document, "history-export") == []
    assert [c["sha"] for c in document["commits"]] == shas
    assert document["commits"][0]["tags"] == ["v1.0.0"]
    stored = sorted(project.rows('SELECT r.sha, x."case", x.current_us, x.verdict FROM results x JOIN runs r ON x.run = r.id'))
    exported = sorted((r["commit"], r["case"], r["current_us"], r["verdict"]) for r in document["results"])
    assert exported == stored and len(stored) == 9
    with open(out / "history.csv", newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert sorted((r["commit"], r["case"], float(r["current_us"]), r["verdict"]) for r in table) == stored
    assert {r["tags"] for r in table if r["commit"] == shas[0]} == {"v1.0.0"}

    page = (out / "history.html").read_text()
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="plot trend"') == 3
    assert page.count('class="release"') == 3 and ">v1.0.0</text>" in page
    assert page.count('<line class="approval"') == 3  # the v2 approval, on each case's chart
    assert "Largest moves since v1.0.0" in page
    perf = next(r for r in document["results"] if r["commit"] == shas[0] and r["case"] == "perf")
    assert perf["ratio"] > 1.02 and perf["low"] < perf["ratio"] < perf["high"] and perf["level_us"] > 0
    assert "+30.0%" in page  # perf at the last commit against v1.0.0


def test_show_filters_by_kernel_and_last_commits(project, tmp_path):
    commit(project.root, "one")
    assert project.record(project.report()) == 0
    (project.root / "notes.txt").write_text("2")
    last = commit(project.root, "two")
    assert project.record(project.report(1.2)) == 0
    assert project.show(tmp_path / "last", "--last", "1", "--kernel", "scale2", "--suite", "scale") == 0
    document = json.loads((tmp_path / "last" / "history.json").read_text())
    assert [c["sha"] for c in document["commits"]] == [last] and len(document["results"]) == 3
    assert document["filters"] == {"suite": "scale", "kernel": "scale2", "last": 1}
    assert project.show(tmp_path / "none", "--kernel", "other") == EXIT_INPUT
    assert not (tmp_path / "none").exists()


WRITER = """
import sys
from pytest_cudagate.cli import main
db, repo, *reports = sys.argv[1:]
sys.exit(max(main(["history", "record", r, "--db", db, "--repo", repo]) for r in reports))
"""


def test_two_writers_in_two_processes_lose_nothing(project):
    commit(project.root, "one")
    batches = [[str(project.report(1 + (10 * n + k) / 100)) for k in range(6)] for n in range(2)]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(project.db), str(project.root), *batch],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for batch in batches]
    results = [w.communicate(timeout=300) + (w.returncode,) for w in writers]
    assert [rc for *_, rc in results] == [0, 0], results
    assert project.rows("SELECT count(*) FROM runs") == [(12,)]
    assert project.rows("SELECT count(*) FROM results") == [(36,)]


def test_a_database_of_a_newer_cudagate_is_refused_and_left_as_it_is(project, tmp_path, capsys):
    commit(project.root, "one")
    assert project.record(project.report()) == 0
    with sqlite3.connect(project.db) as conn:
        conn.execute("PRAGMA user_version = 7")
    before = project.db.read_bytes()
    capsys.readouterr()
    assert project.record(project.report(1.1)) == EXIT_INPUT
    assert "written by a newer cudagate (history schema 7; this one reads up to 1)" in one_line(capsys.readouterr().err)
    assert project.show(tmp_path / "page") == EXIT_INPUT
    assert "newer cudagate" in one_line(capsys.readouterr().err)
    assert project.db.read_bytes() == before and not (tmp_path / "page").exists()


@pytest.mark.parametrize("content", [b"not a database at all\n" * 40, None], ids=["text", "other-sqlite"])
def test_a_file_that_is_not_a_history_is_refused_and_left_as_it_is(project, tmp_path, capsys, content):
    commit(project.root, "one")
    if content is None:
        with sqlite3.connect(project.db) as conn:
            conn.execute("CREATE TABLE notes (text TEXT)")
    else:
        project.db.write_bytes(content)
    before = project.db.read_bytes()
    assert project.record(project.report()) == EXIT_INPUT
    line = one_line(capsys.readouterr().err)
    assert str(project.db) in line and ("not a SQLite database" in line or "tables: notes" in line)
    assert project.show(tmp_path / "page") == EXIT_INPUT
    one_line(capsys.readouterr().err)
    assert project.db.read_bytes() == before


def test_a_database_locked_past_the_timeout_is_one_line_and_loses_nothing(project, capsys):
    commit(project.root, "one")
    assert project.record(project.report()) == 0
    blocker = sqlite3.connect(project.db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer mid-transaction
    try:
        waiting = project.report(1.1)
        capsys.readouterr()
        assert project.record(waiting, "--lock-timeout", "0.2") == EXIT_INPUT
        assert "locked by another writer for more than 0.2 s" in one_line(capsys.readouterr().err)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert project.rows("SELECT count(*) FROM results") == [(3,)]
    assert project.record(waiting) == 0
    assert project.rows("SELECT count(*) FROM results") == [(6,)]


def test_a_report_that_fails_its_schema_is_one_line_naming_the_file_and_field(project, capsys):
    commit(project.root, "one")
    report = project.report()
    path = report / "report.json"
    document = json.loads(path.read_text())
    document["items"][0]["status"] = "sort of"
    path.write_text(json.dumps(document))
    assert project.record(report) == EXIT_INPUT
    line = one_line(capsys.readouterr().err)
    assert str(path) in line and "items[0].status" in line
    assert not project.db.exists()


@pytest.mark.parametrize("db", [":memory:", "file:x?mode=memory"])
def test_an_in_memory_database_is_refused_at_once(project, tmp_path, db):
    """SQLite keeps nothing of these, and answers the switch to WAL with "memory" for ever."""
    commit(project.root, "one")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest_cudagate.cli", "history", "record", str(project.report()),
                           "--db", db, "--repo", str(project.root)], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == EXIT_INPUT
    assert (f"cudagate: {db}: SQLite reads this name as an in-memory database or a URI, not a file, and a history "
            "must outlive the command; pass --db with the history file's path") == one_line(done.stderr)
    assert list(cwd.iterdir()) == []


def _set(where: str, value):
    def edit(document):
        *path, key = where.split(".")
        node = document["items"][0]
        for part in path:
            node = node[part]
        node[key] = value
    return edit


@pytest.mark.parametrize("where, value, message", [
    ("latency.current.median", 1e308, "items[0].latency.current.median: 1e+308 is greater than the maximum of 86400000"),
    ("latency.current.median", 1e-12, "items[0].latency.current.median: 1e-12 is less than the minimum of 1e-06"),
    ("latency.approved.median", 1e300, "items[0].latency.approved.median: 1e+300 is greater than the maximum of "),
    ("latency.estimate.ratio", 1e300, "items[0].latency.estimate.ratio: 1e+300 is greater than the maximum of "
                                      "1000000000"),
    ("latency.estimate.high", 1e-300, "items[0].latency.estimate.high: 1e-300 is less than the minimum of 1e-09"),
    ("latency.threshold", 50, "items[0].latency.threshold: 50 is greater than the maximum of 1"),
    ("samples_ms.current", [1e308] * 9, "items[0].samples_ms.current[0]: 1e+308 is greater than the maximum of "),
], ids=["current 1e308", "current 1e-12", "approved 1e300", "ratio 1e300", "high 1e-300",
        "threshold 50", "samples 1e308"])
def test_a_report_with_an_absurd_number_is_refused_and_records_nothing(project, capsys, where, value, message):
    """Such a value, once stored, broke every later `history show` (json refuses inf, the chart overflows).
    The gate writes no such report (report.schema.json bounds every number), so it is edited in after."""
    commit(project.root, "one")
    report = project.report()
    document = json.loads((report / "report.json").read_text())
    _set(where, value)(document)
    (report / "report.json").write_text(json.dumps(document))
    assert project.record(report) == EXIT_INPUT
    line = one_line(capsys.readouterr().err)
    assert f"cudagate: {report / 'report.json'}: {message}" in line, line
    assert line.endswith("; use the report.json a gate run or `cudagate report merge` wrote")
    assert not project.db.exists()


DAMAGE = {  # SQL that damages one row of a recorded history, the warning it gets, results left of the 3
    "text latency": ("UPDATE results SET current_us = 'fast' WHERE rowid = 1",
                     "table results, row 1, column current_us: 'fast' is not a latency in µs from 0.001 to 8.64e+10",
                     2),
    "negative latency": ("UPDATE results SET current_us = -1 WHERE rowid = 1", "column current_us: -1.0 is not", 2),
    "1e308 latency": ("UPDATE results SET approved_us = 1e308 WHERE rowid = 2", "column approved_us: 1e+308 is not", 2),
    "infinite ratio": ("UPDATE results SET ratio = 9e999 WHERE rowid = 3", "column ratio: inf is not a ratio", 2),
    "verdict": ("UPDATE results SET verdict = 'great' WHERE rowid = 1", "column verdict: 'great' is not one of pass,", 2),
    "advisory": ("UPDATE results SET advisory = 'yes' WHERE rowid = 1", "column advisory: 'yes' is not 0 or 1", 2),
    "blob case": ("UPDATE results SET \"case\" = x'00ff' WHERE rowid = 1", "column case: b'\\x00\\xff' is not text", 2),
    "orphan result": ("UPDATE results SET run = 'gone' WHERE rowid = 1",
                      "table results, row 1, column run: 'gone' is not a run of table runs", 2),
    "run release": ("UPDATE runs SET release = 2", "table runs, row 1, column release: 2 is not 0 or 1; skipped with "
                                                   "its results", 0),
    "orphan run": ("UPDATE runs SET sha = '" + "ab" * 20 + "'", "table runs, row 1, column sha: 'abababab", 0),
    "commit subject": ("UPDATE commits SET subject = x'00'", "table commits, row 1, column subject: b'\\x00' is not "
                                                             "text or NULL; skipped with the runs recorded at it", 0),
    "blob tag": ("UPDATE tags SET tag = x'7631'", "table tags, row 1, column tag: b'v1' is not text", 3),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_a_damaged_row_of_a_history_is_skipped_with_one_warning_naming_it(project, tmp_path, capsys, name):
    """The history is read as untrusted: each value read back is checked; a bad row is skipped, named
    (file, table, row, column) with how to delete it, and the rest is shown."""
    query, warning, left = DAMAGE[name]
    approve(project.root, "scale2", "// v1\n")
    commit(project.root, "one", "v1.0.0")
    assert project.record(project.report()) == 0
    with sqlite3.connect(project.db) as conn:
        conn.execute(query)
    capsys.readouterr()
    code = project.show(tmp_path / "page")
    err = capsys.readouterr().err
    assert code == (0 if left else EXIT_INPUT), err
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"warning: {project.db}: ") and warning in lines[0], err
    table, row = lines[0].split("table ")[1].split(", column")[0].split(", row ")
    assert lines[0].endswith(f"; delete the row: sqlite3 {project.db} 'DELETE FROM {table} WHERE rowid = {row}'")
    assert len(lines) == (1 if left else 2), err  # with nothing left: the one line that says so
    if left:
        document = json.loads((tmp_path / "page" / "history.json").read_text())
        assert problems(document, "history-export") == [] and len(document["results"]) == left
        assert "Traceback" not in err


def test_a_damaged_ledger_cache_is_read_again_from_git_and_replaced(project, capsys):
    approve(project.root, "scale2", "// v1\n")
    commit(project.root, "one")
    assert project.record(project.report()) == 0
    with sqlite3.connect(project.db) as conn:
        conn.execute("UPDATE ledgers SET approvals = '{broken'")
    (project.root / "notes.txt").write_text("2")
    commit(project.root, "two")  # the same ledger blob: the cache is asked first
    capsys.readouterr()
    assert project.record(project.report(1.1)) == 0
    out = capsys.readouterr().out
    assert f"note: {project.db}: table ledgers, blob " in out and "read again from git, and the row replaced" in out
    (approvals,), = project.rows("SELECT approvals FROM ledgers")
    assert list(json.loads(approvals)) == ["scale2"]
    assert len(project.rows("SELECT DISTINCT approved_sha256 FROM results WHERE approved_sha256 IS NOT NULL")) == 1


def test_many_reports_are_recorded_in_one_command_each_at_its_own_commit(project, capsys):
    approve(project.root, "scale2", "// v1\n")
    first = commit(project.root, "one", "v1.0.0")
    early = project.report(github={"sha": first, "ref": "refs/heads/main"})
    (project.root / "notes.txt").write_text("later\n")
    second = commit(project.root, "two")
    late = project.report(1.2, github={"sha": second, "ref": "refs/heads/main"})
    assert main(["history", "record", str(early), str(late), "--db", str(project.db), "--repo", str(project.root)]) == 0
    out = capsys.readouterr().out
    assert out.count("recorded 3 timed case(s)") == 2 and first[:12] in out and second[:12] in out
    assert project.rows("SELECT sha, count(*) FROM results JOIN runs ON results.run = runs.id GROUP BY sha "
                        "ORDER BY sha") == sorted([(first, 3), (second, 3)])
    assert project.rows("SELECT sha, tag FROM tags") == [(first, "v1.0.0")]


def test_one_bad_report_among_many_records_none(project, capsys):
    commit(project.root, "one")
    good, bad = project.report(), project.report()
    document = json.loads((bad / "report.json").read_text())
    document["items"][0]["status"] = "sort of"
    (bad / "report.json").write_text(json.dumps(document))
    assert main(["history", "record", str(good), str(bad), "--db", str(project.db), "--repo", str(project.root)]) \
        == EXIT_INPUT
    assert str(bad / "report.json") in one_line(capsys.readouterr().err)
    assert not project.db.exists()


def test_a_report_commit_that_is_not_a_sha_is_refused(project, capsys):
    commit(project.root, "one")
    report = project.report(github={"sha": "--output=/tmp/x", "ref": "refs/heads/main"})
    assert project.record(report) == EXIT_INPUT
    assert "runs[0].github.sha" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("where", ["not a repository", "a repository without the commit"])
def test_the_reports_own_commit_is_used_where_git_does_not_know_it(project, tmp_path, capsys, where):
    sha = "ab" * 20
    report = project.report(github={"sha": sha, "ref": "refs/heads/release-2", "repository": "o/r", "run_id": "1",
                                    "job": "gate", "server_url": "https://github.com", "runner": "gpu-1"})
    repo = tmp_path / "not-a-repo"
    repo.mkdir()
    if where != "not a repository":
        commit(project.root, "one")
        repo = project.root
    assert main(["history", "record", str(report), "--db", str(project.db), "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert ("not in a git repository" if where == "not a repository" else f"commit {sha[:12]} is not in the repository") in out
    assert "recorded with the report's own commit and branch, without the commit's time" in out
    assert project.rows("SELECT sha, branch, committed FROM commits") == [(sha, "release-2", None)]
    assert project.rows("SELECT count(*) FROM results") == [(3,)]


def test_a_report_without_timed_cases_records_nothing(project, tmp_path, capsys):
    commit(project.root, "one")
    built = built_report(project.scenario, root=project.root)
    built.document["items"] = [i for i in built.document["items"] if not i.get("latency")]
    write_report(tmp_path / "untimed", built)
    assert project.record(tmp_path / "untimed") == 0
    assert "no timed case in the report" in capsys.readouterr().out
    assert not project.db.exists()


def test_names_from_suites_and_git_are_escaped_on_the_page(project, tmp_path):
    commit(project.root, "<script>alert(1)</script> & friends")
    report = project.report()
    path = report / "report.json"
    document = json.loads(path.read_text())
    for item in document["items"]:
        item["case"] = f'<img src=x onerror="alert(1)">{item["case"]}'
    path.write_text(json.dumps(document))
    assert project.record(report) == 0
    assert project.show(tmp_path / "page") == 0
    page = (tmp_path / "page" / "history.html").read_text()
    assert "<img" not in page and "<script>alert" not in page and "&lt;img src=x" in page


# -- in Chromium (skips without a browser, as the report's checks do) -------------------------------


@pytest.fixture
def two_gpu_page(project, tmp_path) -> tuple[Path, str]:
    """A page with an H200 and an H100 fingerprint over four commits, a release tag and an approval."""
    approve(project.root, "scale2", "// v1\n")
    for n in range(4):
        (project.root / "notes.txt").write_text(str(n))
        if n == 2:
            approve(project.root, "scale2", "// v2\n")
        commit(project.root, f"change {n}", *(["v1.0.0"] if n == 1 else []))
        assert project.record(project.report(1 + n / 20)) == 0
        assert project.record(project.report(1.5 + n / 20, fingerprint=h100())) == 0
    assert project.show(tmp_path / "page") == 0
    h100_key = h100().key()
    return tmp_path / "page" / "history.html", h100_key


@pytest.mark.slow  # a browser (tests/README.md); the page itself is checked without one above
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install -y chromium)")
def test_chromium_renders_the_history_page(two_gpu_page, tmp_path):
    page, _ = two_gpu_page
    assert_screenshot(page, artifacts(tmp_path) / "history-chromium.png", 2400, tmp_path / "profile")


@pytest.mark.slow  # a browser (tests/README.md); the page itself is checked without one above
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install -y chromium)")
def test_the_fingerprint_filter_runs_in_chromium_and_fetches_nothing(two_gpu_page, tmp_path):
    page, key = two_gpu_page
    result = subprocess.run([CHROMIUM, "--headless", *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                             f"{page.as_uri()}#fingerprint={key}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert '<select id="fingerprint" aria-label' in dom  # the script ran (allowed by the page's policy): shown
    articles = [line for line in dom.split("<article")[1:]]
    assert len(articles) == 6
    shown = [a for a in articles if 'hidden=""' not in a.split(">", 1)[0]]
    assert len(shown) == 3 and all(f'data-fingerprint="{key}"' in a for a in shown)
    assert "Content-Security-Policy" in dom and "default-src 'none'" in dom  # no fetch is allowed at all
