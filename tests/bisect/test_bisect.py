"""`cudagate bisect` on CPU: a git repository of signed approvals across commits, each version timed
by the fake worker, whose kernel reads its latency from the source it was built from."""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

import cudagate_schemas
from fake_worker import FakeKernel, SCALE_PARAMS, honest, install
from helpers import KERNEL_CU
from pytest_cudagate.cli import main
from pytest_cudagate.trust import generate_key_pair
from test_release_gate import Project, commit, git

BASE_MS = 0.01  # the fake device's time per launch
MARK = re.compile(r"// slower by ([0-9.]+) %")
LABEL = re.compile(r"^// version (.*)$", re.M)


def fake_kernel(spec: dict) -> FakeKernel:
    """The `scale` kernel, slower by the percent its source says (none: as fast as GOOD's)."""
    mark = MARK.search(spec["source"])
    extra = BASE_MS * float(mark.group(1)) / 100 if mark else 0.0
    wrong = "// wrong" in spec["source"]

    def body(launch) -> None:
        honest(launch)
        if wrong:
            launch.array("y", "float32", 1)[0] += 1
        launch.device.clock += extra

    return FakeKernel(body, SCALE_PARAMS)


class History:
    """GOOD, then one commit per entry: a kernel version re-approved, or a commit that leaves it alone."""

    _good: tempfile.TemporaryDirectory | None = None  # GOOD, built once per process and copied for each test

    def __init__(self, tmp_path: Path):
        if History._good is None or not Path(History._good.name, "repo").is_dir():
            good = tempfile.TemporaryDirectory(prefix="bisect-good-", dir=tmp_path.parent)  # pytest's basetemp
            built = Project(Path(good.name) / "repo", Path(good.name) / "keys")
            built.suite("scale")
            commit(built.root, "GOOD: scale approved")
            History._good = good
        shutil.copytree(Path(History._good.name), tmp_path, symlinks=True, dirs_exist_ok=True)
        self.project = Project.existing(tmp_path / "repo", tmp_path / "keys")
        self.good = self.head()
        self.kernel_commits: list[str] = []
        self.by_label: dict[str, str] = {}
        self.other_commits: list[str] = []

    @property
    def suite(self) -> Path:
        return self.project.root / "kernels" / "scale" / "cudagate.yaml"

    def head(self) -> str:
        return git(self.project.root, "rev-parse", "HEAD")

    def version(self, label: str, slower_pct: float = 0.0, extra: str = "") -> str:
        """A re-approved kernel: a new comment (another source, the same speed) and the slowdown given."""
        mark = f"// slower by {slower_pct} %\n" if slower_pct else ""
        (self.suite.parent / "scale.cu").write_text(f"{KERNEL_CU}// version {label}\n{mark}{extra}")
        self.project.approve("scale")
        commit(self.project.root, label)
        self.kernel_commits.append(self.head())
        self.by_label[label] = self.head()
        return self.head()

    def other(self, label: str, resign: bool = False) -> str:
        """A commit that leaves the kernel's approved version alone: docs, or the ledger signed again."""
        if resign:
            self.project.approve("scale")
        else:
            (self.project.root / "NOTES").write_text(label + "\n")
        commit(self.project.root, label)
        self.other_commits.append(self.head())
        return self.head()


@pytest.fixture
def history(tmp_path) -> History:
    return History(tmp_path)


@pytest.fixture
def workers(monkeypatch, tmp_path):
    return install(monkeypatch, tmp_path, fake_kernel)


def bisect(history: History, *extra: str, good: str | None = None, bad: str = "HEAD") -> int:
    return main(["bisect", good or history.good, bad, str(history.suite), "--case", "perf", *extra])


def compared(workers, history: History) -> list[str]:
    """The commit (12 hex digits) of the current version of every comparison the worker ran, known by
    the label :meth:`History.version` leaves in its source (every build has one source name)."""
    return [history.by_label[LABEL.search(r["kernels"]["current"]["source"])[1]][:12]
            for w in workers for r in w.requests if r["op"] == "compare"]


def valid_json(path: Path) -> dict:
    document = json.loads(path.read_text())
    jsonschema.validate(document, cudagate_schemas.load("bisect"))
    return document


# The regressing commit first, last, and in the middle (`slow`: tens of seconds each; the fast run bisects under a
# trusted ref below).
@pytest.mark.parametrize("slow_at", [pytest.param(n, marks=pytest.mark.slow) for n in (1, 4, 5, 8)])
def test_finds_the_commit_that_regressed_in_log2_comparisons_skipping_commits_that_leave_the_kernel(
        history, workers, capsys, tmp_path, slow_at):
    for number in range(1, 9):
        history.version(f"kernel edit {number}", slower_pct=5.0 if number >= slow_at else 0.0)
        if number % 3 == 0:
            history.other(f"docs {number}")
            history.other(f"re-signed {number}", resign=True)
    culprit = history.kernel_commits[slow_at - 1]
    assert bisect(history, "--json", str(tmp_path / "bisect.json")) == 0
    out = capsys.readouterr().out
    assert f"first regressing commit: {culprit[:12]} 'kernel edit {slow_at}'" in out
    assert "5.0% slower than GOOD" in out
    assert "12 commit(s), 8 change the kernel's approved version (4 skipped without GPU time)" in out
    seen = compared(workers, history)
    assert len(seen) <= math.ceil(math.log2(8)) + 1
    assert not {c[:12] for c in history.other_commits} & set(seen)  # no GPU time for commits that keep the kernel
    assert len(workers) == 1  # one worker for the whole search
    document = valid_json(tmp_path / "bisect.json")
    assert document["verdict"] == "commit" and document["first_bad"]["commit"] == culprit
    assert len(document["comparisons"]) == len(seen)


@pytest.mark.slow
def test_a_bad_that_is_not_slower_is_one_comparison_and_no_regression(history, workers, capsys):
    for number in range(1, 6):
        history.version(f"refactor {number}", slower_pct=1.0 if number == 5 else 0.0)
    assert bisect(history) == 0
    out = capsys.readouterr().out
    assert re.search(r"no commit regresses: BAD [0-9a-f]{12} is 1\.0% slower than GOOD [0-9a-f]{12} "
                     r"\(ratio 1\.010, 99% CI \[1\.010, 1\.010\]\): pass at ±2%", out), out
    assert compared(workers, history) == [history.kernel_commits[-1][:12]]


@pytest.mark.slow
def test_the_threshold_option_is_in_percent(history, workers, capsys):
    for number in range(1, 6):
        history.version(f"refactor {number}", slower_pct=1.0 if number >= 3 else 0.0)
    assert bisect(history, "--threshold", "0.5") == 0
    assert f"first regressing commit: {history.kernel_commits[2][:12]} 'refactor 3'" in capsys.readouterr().out


@pytest.mark.slow
def test_creep_names_the_commits_that_add_up(history, workers, capsys, tmp_path):
    history.version("step 1", slower_pct=1.2)
    history.version("harmless", slower_pct=1.2)
    history.version("step 2", slower_pct=2.4)
    history.version("step 3", slower_pct=3.6)
    assert bisect(history, "--json", str(tmp_path / "creep.json")) == 0
    out = capsys.readouterr().out
    first = history.kernel_commits[2]
    assert (f"spread over several commits (creep): no single step exceeds ±2%, but from {first[:12]} 'step 2' on "
            "the kernel is 2.4% slower than GOOD") in out
    marks = {m.group(2): m.group(1) == "*" for m in re.finditer(r"^  ([* ]) ([0-9a-f]{12}) '", out, re.MULTILINE)}
    assert marks == {history.kernel_commits[0][:12]: True, history.kernel_commits[1][:12]: False, first[:12]: True}
    document = valid_json(tmp_path / "creep.json")
    assert document["verdict"] == "creep" and [s["contributes"] for s in document["steps"]] == [True, False, True]


@pytest.mark.slow
def test_a_step_under_the_threshold_after_nothing_measurable_is_still_one_commit(history, workers, capsys):
    history.version("within the resolution", slower_pct=0.4)  # 0.4 % <= a quarter of 2 %
    history.version("the jump", slower_pct=2.3)  # its own step: 1.023 / 1.004 = +1.9 %
    assert bisect(history) == 0
    out = capsys.readouterr().out
    assert f"first regressing commit: {history.kernel_commits[1][:12]} 'the jump'" in out
    assert "its own step: 1.9% slower than the version before it" in out


@pytest.mark.slow
def test_a_version_that_fails_the_case_stops_the_search_and_keeps_what_was_measured(history, workers, capsys,
                                                                                    tmp_path):
    history.version("fast")
    history.version("slow and wrong", slower_pct=5.0, extra="// wrong\n")
    assert bisect(history, "--json", str(tmp_path / "stopped.json")) == 1
    out = capsys.readouterr().out
    assert "stopped: comparison" in out and "fails this case now, so its latency means nothing" in out
    document = valid_json(tmp_path / "stopped.json")
    assert document["verdict"] == "stopped" and len(document["comparisons"]) == 1


def test_a_ledger_unsigned_at_one_commit_is_named_before_any_gpu_time(history, workers, capsys):
    history.version("fast")
    history.project.edit_ledger("scale", lambda raw: raw.update(signature=None))
    commit(history.project.root, "unsigned")
    unsigned = history.head()
    history.version("slow", slower_pct=5.0)
    assert bisect(history) == 2
    err = capsys.readouterr().err
    assert f"at {unsigned[:12]}: not signed; bisect trusts nothing it cannot verify" in err
    assert err.strip().endswith(f"pass a GOOD after {unsigned[:12]}")
    assert workers == []


def shallow_clone(history: History, tmp_path: Path) -> list[str]:
    history.version("slow", slower_pct=5.0)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{history.project.root}", str(clone))
    return [history.good, "HEAD", str(clone / "kernels" / "scale" / "cudagate.yaml")]


BAD_INPUT = {
    "unknown ref": (lambda h, t: [h.good, "no-such-branch", str(h.suite)],
                    "BAD 'no-such-branch': not a commit of the repository at"),
    "unknown trusted ref": (lambda h, t: [h.good, "HEAD", str(h.suite), "--trusted-ref", "no-such-branch"],
                            "--trusted-ref 'no-such-branch': not a commit of the repository at"),
    "shallow clone": (shallow_clone, "is a shallow clone: bisect reads every commit from GOOD to BAD; fetch the "
                                     "history: `git fetch --unshallow`"),
    "GOOD after BAD": (lambda h, t: ["HEAD", h.good, str(h.suite)], "is not an ancestor of BAD"),
    "same commit": (lambda h, t: [h.good, h.good, str(h.suite)], "are the same commit"),
    "kernel never changes": (lambda h, t: [h.kernel_commits[-1], "HEAD", str(h.suite)],
                             "kernel 'scale2' has the same approved version"),
    "unknown suite": (lambda h, t: [h.good, "HEAD", str(t / "nowhere")], "nowhere: no suite there"),
    "unknown kernel": (lambda h, t: [h.good, "HEAD", str(h.suite), "scale3"], "has no kernel 'scale3'"),
    "unknown case": (lambda h, t: [h.good, "HEAD", str(h.suite), "--case", "huge"],
                     "--case 'huge': suite 'scale' has no case of that name; its performance cases: perf"),
    "correctness case": (lambda h, t: [h.good, "HEAD", str(h.suite), "--case", "small"], "a correctness case"),
    "not a repository": (lambda h, t: [h.good, "HEAD", str(h.suite), "--repo", str(t)],
                         "is not inside a git repository"),
    "a case the kernel requires away": (lambda h, t: [h.good, "HEAD", str(requiring(h.suite, "cols > 1000")),
                                                      "--case", "perf"],
                                        "--case 'perf': kernel scale2 requires cols > 1000 (cols=256): case perf is "
                                        "not one of its cases; its performance cases: wide"),
}


def requiring(suite: Path, condition: str) -> Path:
    """``suite`` with its kernel's ``requires:`` set to ``condition`` and a wider performance case that
    meets it (in the working tree only)."""
    text = suite.read_text().replace("    launch: {grid: [rows], block: [128]}",
                                     f"    requires: [\"{condition}\"]\n    launch: {{grid: [rows], block: [128]}}", 1)
    suite.write_text(text.rstrip("\n") + "\n  - {name: wide, kind: performance, scalars: {rows: 4, cols: 2048}}\n")
    return suite


@pytest.mark.parametrize("name", BAD_INPUT)
def test_bad_input_is_one_line_and_costs_no_gpu_time(history, workers, capsys, tmp_path, name):
    history.version("slow", slower_pct=5.0)
    history.other("docs")
    arguments, message = BAD_INPUT[name]
    outside = tmp_path / "outside"
    outside.mkdir()
    assert main(["bisect", *arguments(history, outside if name == "not a repository" else tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert workers == []


# -------------------------------------------------------------------------------- --trusted-ref (issue 41)


def mallory(history: History) -> Path:
    """A key of someone no maintainer trusts, added to the working tree's trusted keys; its private half."""
    private = history.project.root.parent / "keys" / "mallory.key"
    generate_key_pair("mallory", private_path=private,
                      public_path=history.project.root / ".cudagate" / "trusted_keys" / "mallory.pub")
    return private


def test_under_a_trusted_ref_the_working_trees_key_and_reference_are_not_trusted(history, workers, capsys,
                                                                                 tmp_path):
    """The working tree adds its own key and re-signs the suite with a Python reference of its own, which
    bisect runs to draw a generated case: bisect alone trusts the working tree's keys and runs it; with
    --trusted-ref it is refused before any GPU time, and the reference never runs."""
    history.version("slow", slower_pct=5.0)
    trusted = history.head()
    ran = tmp_path / "reference-ran"
    reference = history.suite.parent / "reference.py"
    # `cudagate sign` runs it in a child confined to the suite's folder, where it cannot write the marker
    reference.write_text(f"try:\n    open({str(ran)!r}, 'w').close()\nexcept OSError:\n    pass\n"
                         + reference.read_text())
    raw = yaml.safe_load(history.suite.read_text())
    raw["cases"][1]["generated"] = True
    history.suite.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["cases", "generate", str(history.suite)]) == 0
    assert main(["sign", str(history.suite), "--key", str(mallory(history))]) == 0  # sign rechecks: it runs it too (confined)
    ran.unlink()
    capsys.readouterr()

    assert bisect(history, "--trusted-ref", trusted) == 2
    err = capsys.readouterr().err
    assert "its cases cannot be trusted to judge anything" in err and "mallory" in err and err.count("\n") == 1, err
    assert workers == [] and not ran.exists()

    assert bisect(history) == 0  # today's behaviour without it: the working tree's keys are trusted
    assert ran.exists()


def test_under_a_trusted_ref_a_ledger_signed_by_a_key_added_in_the_range_is_refused(history, workers, capsys):
    """A commit in the range adds a key and re-approves the kernel with it; later commits sign with the
    maintainer's key again. The working tree trusts the added key; the trusted ref does not."""
    history.version("fast")
    key = mallory(history)
    (history.suite.parent / "scale.cu").write_text(f"{KERNEL_CU}// version forged\n")
    history.project.approve("scale")
    assert main(["sign", str(history.suite), "--key", str(key)]) == 0
    commit(history.project.root, "re-approved with a key of its own")
    forged = history.head()
    history.version("slow", slower_pct=5.0)
    capsys.readouterr()

    assert bisect(history, "--trusted-ref", history.good) == 2
    err = capsys.readouterr().err
    assert f"at {forged[:12]}" in err and f"pass a GOOD after {forged[:12]}" in err and err.count("\n") == 1, err
    assert workers == []
    assert bisect(history) == 0  # without it, the working tree's keys vouch for the forged ledger


def test_under_a_trusted_ref_an_honest_history_is_bisected(history, workers, capsys):
    for number in range(1, 5):
        history.version(f"kernel edit {number}", slower_pct=5.0 if number >= 3 else 0.0)
    assert bisect(history, "--trusted-ref", "HEAD") == 0
    assert f"first regressing commit: {history.kernel_commits[2][:12]} 'kernel edit 3'" in capsys.readouterr().out
