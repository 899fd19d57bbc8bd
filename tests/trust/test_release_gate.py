"""`--cuda-gate-release` on a machine without a GPU, through pytester, in temporary git repositories.

Everything up to the worker is exercised: the ref resolved once, the ledger at the ref verified
against today's keys, each kernel's `release` item saying which release is its reference, or why
there is none, in one line naming the ref and the file, and nothing else in the run lost. The
timing itself is in tests/judge/test_latency.py (the verdict policy) and tests/gpu (the comparison).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import write_suite
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import generate_key_pair
from pytest_cudagate.trust.gate_command import split_args

pytest_plugins = ["pytester"]

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
LEDGER = "cudagate.approvals.json"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, message: str, tag: str | None = None) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    if tag:
        git(repo, "tag", "-a", tag, "-m", tag)


class Project:
    """A repository with signed, approved suites under kernels/ and a trusted key."""

    def __init__(self, root: Path, keys: Path):
        self.root, self.key = root, keys / "alice.key"
        root.mkdir(parents=True, exist_ok=True)
        (root / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.cudagate]\n')
        generate_key_pair("alice", private_path=self.key, public_path=root / ".cudagate/trusted_keys/alice.pub")
        git(root, "init", "-q", "-b", "main")

    @classmethod
    def existing(cls, root: Path, keys: Path) -> Project:
        """The project already at ``root`` (a copy of one), signed with ``keys``' alice."""
        project = cls.__new__(cls)
        project.root, project.key = root, keys / "alice.key"
        return project

    def suite(self, name: str, kernel_source: str | None = None) -> Path:
        folder = self.root / "kernels" / name
        write_suite(folder, **({"kernel_source": kernel_source} if kernel_source else {}))
        self.approve(name)
        return folder

    def approve(self, name: str) -> None:
        """Approve the suite's kernel as it stands, then sign the suite and its ledger."""
        suite = load_suite(self.root / "kernels" / name / "cudagate.yaml")
        ledger = Ledger.for_suite(suite)
        ledger.approvals["scale2"] = approval_for(ledger, suite.kernels[0], approved_by="alice",
                                                  approved_at="2026-12-01T00:00:00+00:00",
                                                  git={"commit": None, "dirty": None}, tool_version="test")
        ledger.save()
        assert main(["sign", str(suite.path), "--key", str(self.key)]) == 0

    def ledger(self, name: str) -> Path:
        return self.root / "kernels" / name / LEDGER

    def edit_ledger(self, name: str, change) -> None:
        raw = json.loads(self.ledger(name).read_text())
        change(raw)
        self.ledger(name).write_text(json.dumps(raw))


@pytest.fixture
def project(pytester, tmp_path_factory) -> Project:
    return Project(pytester.path, tmp_path_factory.mktemp("keys"))


def run(pytester, *args: str):
    result = pytester.runpytest_subprocess("--cuda-gate", "-v", "-rfEw", "-p", "no:cacheprovider", *args)
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str()
    return result


def released(project: Project, *names: str) -> None:
    """Tag v1.0.0 with ``names`` approved, then one more commit so that HEAD is not the release."""
    for name in names:
        project.suite(name)
    commit(project.root, "release", "v1.0.0")
    (project.root / "CHANGES").write_text("after the release\n")
    commit(project.root, "work after the release")


def test_each_kernel_names_its_release_reference(pytester, project):
    released(project, "scale")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*kernels/scale/cudagate.yaml::scale2::compile PASSED*",
                                 "*kernels/scale/cudagate.yaml::scale2::release PASSED*",
                                 "*kernels/scale/cudagate.yaml::scale2::perf SKIPPED*"])
    sha = git(project.root, "rev-parse", "v1.0.0^{commit}")
    result.stdout.fnmatch_lines([f"release reference v1.0.0 (commit {sha[:12]}, the newest tag matching 'v[*]' before HEAD)"])
    assert result.ret == pytest.ExitCode.OK


def test_release_items_exist_only_in_release_mode(pytester, project):
    released(project, "scale")
    result = pytester.runpytest("--cuda-gate", "--collect-only", "-q", "kernels")
    assert not any(line.endswith("::release") for line in result.stdout.lines)


@pytest.mark.slow
def test_the_tag_pattern_comes_from_the_settings(pytester, project):
    project.suite("scale")
    commit(project.root, "release", "release-7")
    commit(project.root, "next", "v9.0.0")  # matches the default pattern, not the project's
    with open(project.root / "pyproject.toml", "a") as handle:
        handle.write('release_tags = "release-*"\n')
    commit(project.root, "pattern")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["release reference release-7 (commit *, the newest tag matching 'release-[*]' before HEAD)"])


@pytest.mark.slow
def test_a_release_tags_setting_that_is_not_a_pattern_is_refused(pytester, project):
    (project.root / "pyproject.toml").write_text('[tool.cudagate]\nrelease_tags = ["v*"]\n')
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-release")
    result.stderr.fnmatch_lines(["*pyproject.toml:", "*tool.cudagate.release_tags: \"[[]'v[*]'[]]\" is not a "
                                 "tag pattern; give one string such as \"v[*]\"*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_ref_that_does_not_exist_fails_each_kernel_once_and_nothing_else(pytester, project):
    released(project, "scale", "other")
    result = run(pytester, "kernels", "--cuda-gate-release=v9.9")
    result.stdout.fnmatch_lines([f"*release gate: release ref 'v9.9': not a commit of the repository at {project.root} "
                                 "(*); name an existing tag, branch or commit"])
    assert result.parseoutcomes()["failed"] == 2  # one release item per kernel
    result.stdout.fnmatch_lines(["*kernels/other/cudagate.yaml::scale2::compile PASSED*"])
    result.stdout.fnmatch_lines(["release reference: NONE: release ref 'v9.9': not a commit*"])


def test_an_unsigned_ledger_at_the_ref_is_named(pytester, project):
    project.suite("scale")
    project.suite("other")
    signed = project.ledger("scale").read_text()
    project.edit_ledger("scale", lambda raw: raw.update(signature=None))
    commit(project.root, "release with an unsigned ledger", "v1.0.0")
    project.ledger("scale").write_text(signed)  # signed again today: only the release's copy is unsigned
    commit(project.root, "signed since")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*release gate: kernels/scale/cudagate.approvals.json at v1.0.0: not signed; the "
                                 "release cannot be used as a reference"])
    result.stdout.fnmatch_lines(["*kernels/other/cudagate.yaml::scale2::release PASSED*"])
    assert result.parseoutcomes()["failed"] == 1


def test_a_ledger_tampered_at_the_ref_is_named(pytester, project):
    project.suite("scale")
    project.edit_ledger("scale", lambda raw: raw["approvals"]["scale2"].update(approved_by="mallory"))
    commit(project.root, "tampered release", "v1.0.0")
    project.approve("scale")
    commit(project.root, "signed since")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*release gate: kernels/scale/cudagate.approvals.json at v1.0.0: *signature*; the "
                                 "release cannot be used as a reference"])


def test_a_key_revoked_since_the_release_no_longer_vouches_for_it(pytester, project, tmp_path):
    released(project, "scale")
    (project.root / ".cudagate/trusted_keys/alice.pub").unlink()
    generate_key_pair("bob", private_path=tmp_path / "bob.key", public_path=project.root / ".cudagate/trusted_keys/bob.pub")
    project.key = tmp_path / "bob.key"
    project.approve("scale")
    commit(project.root, "alice's key revoked, re-signed by bob")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*release gate: kernels/scale/cudagate.approvals.json at v1.0.0: signed by key * "
                                 "(signer alice), which is not trusted*"])


@pytest.mark.slow
def test_a_pinned_source_missing_at_the_ref_is_named(pytester, project):
    project.suite("scale")
    project.suite("other")
    blob = json.loads(project.ledger("scale").read_text())["approvals"]["scale2"]["source_blob"]
    pinned = project.root / "kernels" / "scale" / blob
    text = pinned.read_text()
    pinned.unlink()
    commit(project.root, "release without its pinned copy", "v1.0.0")
    pinned.write_text(text)  # back in the working tree: the release's tree still lacks it
    commit(project.root, "restored")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines([f"*release gate: kernels/scale/{blob} does not exist at v1.0.0, but "
                                 "kernels/scale/cudagate.approvals.json at v1.0.0: approval of 'scale2' pins it*"])
    result.stdout.fnmatch_lines(["*kernels/other/cudagate.yaml::scale2::release PASSED*"])


@pytest.mark.slow
def test_a_shallow_clone_says_to_fetch_tags(pytester, tmp_path, monkeypatch):
    origin = Project(tmp_path / "origin", tmp_path)
    released(origin, "scale")
    clone = pytester.path / "clone"
    git(pytester.path, "clone", "-q", "--depth", "1", f"file://{origin.root}", str(clone))
    monkeypatch.chdir(clone)
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*release gate: *: no tag matching 'v[*]' is reachable from HEAD other than HEAD's own "
                                 "(the repository has 0 tag(s), 0 matching; this is a shallow clone); fetch tags: "
                                 "`actions/checkout` with `fetch-depth: 0`"])


@pytest.mark.slow
def test_a_kernel_new_since_the_release_and_a_first_release_warn(pytester, project):
    project.suite("scale")
    commit(project.root, "first release", "v1.0.0")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*scale2::release PASSED*", "*(only on HEAD itself: v1.0.0)*a first release has "
                                 "nothing to be compared with*"])
    project.suite("added")
    commit(project.root, "a new suite")
    result = run(pytester, "kernels", "--cuda-gate-release")
    result.stdout.fnmatch_lines(["*kernel 'scale2' did not exist at v1.0.0 (kernels/added did not exist there); its "
                                 "cases are judged by the PR gate only*"])
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.slow
def test_cudagate_gate_passes_the_bare_flag_without_swallowing_a_path(pytester, project):
    released(project, "scale")
    assert split_args(["--cuda-gate-release", "kernels/scale"]) == (["--cuda-gate-release="], ["kernels/scale"])
    assert split_args(["--cuda-gate-release=v1.0.0", "kernels"]) == (["--cuda-gate-release=v1.0.0"], ["kernels"])
    head = git(project.root, "rev-parse", "HEAD")
    done = subprocess.run([sys.executable, "-m", "pytest_cudagate.cli", "gate", "--trusted-ref", head, "--repo",
                           str(project.root), "--", "-v", "--cuda-gate-release", "kernels/scale"],
                          cwd=project.root, capture_output=True, text=True, timeout=300)
    assert "refused" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "kernels/scale/cudagate.yaml::scale2::release PASSED" in done.stdout, done.stdout + done.stderr
    assert "release reference v1.0.0" in done.stdout


def test_the_example_release_job_runs_the_release_gate_on_a_full_clone():
    root = Path(__file__).resolve().parents[2]
    job = yaml.safe_load((root / "examples/workflows/gpu-gate.yml").read_text())["jobs"]["release-gate"]
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0
    gate = next(s for s in job["steps"] if s.get("uses") == "./")
    assert gate["with"]["release"] == "true"
    run = next(s for s in yaml.safe_load((root / "action.yml").read_text())["runs"]["steps"] if s.get("id") == "gate")["run"]
    assert 'args+=(--cuda-gate-release)' in run and 'pytest_cudagate.cli gate --trusted-ref' in run
