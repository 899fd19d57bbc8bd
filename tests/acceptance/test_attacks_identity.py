"""The trust root binds suites by identity, and every ref and base file read before verification is
bounded (issue 28, route 4 and the fuzz findings on refs, the ledger and the settings).

Each attack runs through ``cudagate gate --trusted-ref`` on :class:`test_attacks.Repo` (one signed
suite ``softmax``, kernels softmax_rows and softmax_alt; some tests sign a second suite, ``fir``, at
the base): a suite swapped for another signed suite, renamed, moved, hidden from pytest's
collection or missing a kernel, refs that do not resolve, a deep base ledger and a non-table
``[tool.cudagate]``. Each must exit non-zero with one clear line and no traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import load_private_key, sign_suite
from test_attacks import EXAMPLE, SECRET, Repo, repo  # noqa: F401 - the fixture

FIR = EXAMPLE.parent / "fir"
CRASHES = ("Traceback", "RecursionError", "IndexError", "BadName", "INTERNALERROR")


def clean(code: int, out: str, *needles: str) -> str:
    assert code != 0, out
    for needle in needles:
        assert needle in out, out
    for crash in CRASHES:
        assert crash not in out, out
    assert SECRET not in out, out
    return out


def add_signed_suite(repo: Repo, name: str, source: Path, signings: int) -> Path:
    """A second suite, approved and signed by alice ``signings`` times (its ledger's sequence), at a new base."""
    folder = repo.path / name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved", "*.sig.json",
                                                                  "__pycache__"))
    suite = load_suite(folder / "cudagate.yaml")
    ledger = Ledger.for_suite(suite)
    for program in suite.kernels:
        ledger.approvals[program.name] = approval_for(ledger, program, approved_by="alice", approved_at="2026-11-29",
                                                      git={"commit": None, "dirty": None}, tool_version="test")
    ledger.save()
    for _ in range(signings):
        sign_suite(load_suite(folder / "cudagate.yaml"), load_private_key(repo.keys / "alice.key"), "alice")
    return folder


@pytest.fixture
def two(repo) -> Repo:
    """The base gates two signed suites: softmax (ledger sequence 2) and fir (sequence 3)."""
    add_signed_suite(repo, "fir", FIR, signings=3)
    (repo.path / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.cudagate]\nsuites = ["softmax", "fir"]\n')
    repo.base = repo.commit("base: a second signed suite")
    return repo


# -------------------------------------------------------------------------------- suite identity


def test_a_suite_swapped_for_a_copy_of_another_signed_suite_is_refused_naming_both(two):
    code, out = two.gate()
    assert code == 0 and "3 passed" in out, out  # as it is: softmax_rows, softmax_alt and fir_valid compile
    shutil.rmtree(two.suite_dir)
    shutil.copytree(two.path / "fir", two.suite_dir)  # fir's signature and its ledger (sequence 3 >= 2) come along
    (two.suite_dir / "softmax.cu").write_text("")
    code, out = two.gate()
    clean(code, out, f"softmax/cudagate.yaml: its suite name is 'fir' (the signed suite of fir/cudagate.yaml); the "
                     f"trusted ref {two.base[:12]} gates suite 'softmax' here (a maintainer moves or renames a suite "
                     "on the base branch)")


def test_a_renamed_suite_is_refused_even_signed_by_a_maintainer(repo):
    repo.edit_yaml(lambda raw: raw.update(suite="softmax_v2"))
    ledger = json.loads((repo.suite_dir / "cudagate.approvals.json").read_text())
    (repo.suite_dir / "cudagate.approvals.json").write_text(json.dumps({**ledger, "suite": "softmax_v2"}, indent=1))
    repo.sign("alice")  # a trusted signature in the pull request: renames still happen on the base branch
    clean(*repo.gate(), f"softmax/cudagate.yaml: its suite name is 'softmax_v2'; the trusted ref {repo.base[:12]} "
                        "gates suite 'softmax' here")


def test_a_moved_suite_is_refused_naming_both_paths(repo):
    shutil.move(repo.suite_dir, repo.path / "softmax_v2")
    clean(*repo.gate("."), "softmax/cudagate.yaml: moved to softmax_v2/cudagate.yaml by this change; the trusted ref "
                           f"{repo.base[:12]} gates suite 'softmax' at softmax/cudagate.yaml")


def test_a_kernel_removed_from_a_base_suite_is_refused_naming_it(repo):
    repo.edit_yaml(lambda raw: raw.update(kernels=[k for k in raw["kernels"] if k["name"] != "softmax_alt"]))
    raw = json.loads((repo.suite_dir / "cudagate.approvals.json").read_text())
    del raw["approvals"]["softmax_alt"]
    (repo.suite_dir / "cudagate.approvals.json").write_text(json.dumps(raw, indent=1))
    repo.sign("alice")  # even signed by a maintainer: its items would vanish from the gate
    clean(*repo.gate(), "softmax/cudagate.yaml: kernel 'softmax_alt' removed by this change; the trusted ref "
                        f"{repo.base[:12]} gates it in suite 'softmax'")


def test_a_suite_hidden_from_pytest_collection_is_refused(two):
    """pytest skips a folder holding a pyvenv.cfg (a virtualenv to it) when it walks the one above."""
    (two.path / "pyproject.toml").write_text('[project]\nname = "demo"\n')  # the base gates every suite below the root
    two.base = two.commit("base: no suites setting")
    (two.suite_dir / "pyvenv.cfg").write_text("home = /usr/bin\n")
    clean(*two.gate(), f"softmax/cudagate.yaml: the trusted ref {two.base[:12]} gates suite 'softmax' here, but the "
                       "run collected none of its items")


# -------------------------------------------------------------------------------- refs


@pytest.mark.parametrize("ref", ["", "deadbeef", "v9.9.9", "HEAD~50", "x" * 10_000, "HEAD@{1}"],
                         ids=["empty", "deadbeef", "tag", "too-far-back", "10k-chars", "reflog"])
def test_a_trusted_ref_that_is_no_commit_is_one_clear_refusal(repo, ref):
    # a fresh CI clone's reflog holds one entry (here: the pull request's commit): HEAD@{1} is past its end
    (repo.path / ".git" / "logs" / "HEAD").write_text("")
    code, out = repo.gate(ref=ref)
    # an empty value is refused with the other empty options, as the command line is read
    clean(code, out, *(["cudagate gate: --trusted-ref: '' is empty: give the base commit"] if not ref else
                       ["--trusted-ref ", ": not a commit of the repository at "]))
    assert "trust root from" not in out and "test session starts" not in out, out  # nothing ran untrusted
    assert len(out) < 1000, out  # a 10k-character ref is not echoed back


def test_a_release_ref_that_is_no_commit_fails_the_release_items_in_one_line(repo):
    (repo.path / ".git" / "logs" / "HEAD").write_text("")  # HEAD@{5}: past a fresh clone's reflog
    code, out = repo.gate("--cuda-gate-release=HEAD@{5}")
    clean(code, out, "release gate: release ref 'HEAD@{5}': not a commit of the repository at ")


# -------------------------------------------------------------------------------- base files


def test_a_deeply_nested_base_ledger_is_refused_without_recursing(repo):
    (repo.suite_dir / "cudagate.approvals.json").write_text("[" * 100_000 + "]" * 100_000)
    repo.base = repo.commit("base: a ledger nested 100k deep")
    clean(*repo.gate(), f"softmax/cudagate.approvals.json at {repo.base[:12]}:", "nests 100000 levels deep")


def test_a_tool_cudagate_that_is_no_table_is_refused_by_the_gate_and_by_verify(repo):
    (repo.path / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool]\ncudagate = "x"\n')
    repo.base = repo.commit("base: [tool.cudagate] is a string")
    clean(*repo.gate(), f"pyproject.toml at {repo.base[:12]}:", "tool.cudagate: expected a table, not a str")
    done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           "verify", "softmax"], cwd=repo.path, capture_output=True, text=True, timeout=120)
    clean(done.returncode, done.stdout + done.stderr, "pyproject.toml:", "tool.cudagate: expected a table, not a str")


def test_a_suite_folder_swapped_for_a_link_to_an_older_signed_copy_is_refused(repo):
    """The older copy's ledger sequence is below the base's, refused when the copy sits at the gated path;
    behind a link the gated path is a link to a folder, refused before anything is collected."""
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1.0, rtol=1.0))
    repo.sign("alice")
    loose = repo.commit("loose tolerance, sequence 3")
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1e-6, rtol=1e-5))
    repo.sign("alice")
    repo.base = repo.commit("tight tolerance, sequence 4")
    repo.git.git.checkout(loose, "--", "softmax")
    shutil.move(str(repo.suite_dir), str(repo.path / "old"))
    (repo.path / "softmax").symlink_to("old")
    code, out = repo.gate()
    clean(code, out, "softmax: a link to a folder (it leads to old); cudagate follows no link to a folder in the "
                     "paths it gates")
