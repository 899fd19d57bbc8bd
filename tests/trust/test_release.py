"""The release reference (pytest_cudagate.trust.release) on temporary git repositories built with the git CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.suite.model import Case
from pytest_cudagate.trust.release import (
    FETCH_TAGS_FIX,
    AbsentAtRef,
    BuildRecord,
    NoReleaseYet,
    ReleaseError,
    build_drift,
    read_at,
    released_approvals,
    resolve_release_ref,
)

SUITE = "kernels/scale"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout.strip()


def approve(repo: Path, kernel: str, source: str, *, blob_text: str | None = None, build: dict | None = None) -> str:
    """Pin ``source`` for ``kernel`` in the suite's ledger (``blob_text`` replaces the pinned copy's content)."""
    suite = repo / SUITE
    (suite / "approved").mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(source.encode()).hexdigest()
    blob = f"approved/{digest}.cu"
    (suite / blob).write_text(blob_text if blob_text is not None else source)
    ledger_path = suite / "cudagate.approvals.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else {"format": 1, "suite": "scale", "approvals": {}}
    ledger["approvals"][kernel] = {
        "kernel": kernel, "source_sha256": digest, "source_blob": blob, "entry": kernel, "options": ["-DK=1"],
        "headers": {}, "launch": {"grid": ["cdiv(n, 256)"], "block": [256], "shared_bytes": "0"},
        "launch_overrides": {"big": {"grid": ["cdiv(n, 512)"], "block": [512]}}, "arch_suffix": "",
        "baselines": {}, **({"build": build} if build else {}),
    }
    ledger_path.write_text(json.dumps(ledger))
    return blob


def commit(repo: Path, message: str, *tags: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    for tag in tags:
        git(repo, "tag", "-a", tag, "-m", tag)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path) -> Path:
    """v1.0.0 (scale_v1), v1.1.0 (scale_v2), a `nightly` tag after it, and HEAD tagged v1.2.0 (scale_v3)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    approve(root, "scale", "// v1\n")
    commit(root, "first release", "v1.0.0")
    approve(root, "scale", "// v2\n")
    commit(root, "second release", "v1.1.0", "release-2")
    (root / "README").write_text("docs\n")
    commit(root, "docs", "nightly")
    approve(root, "scale", "// v3\n")
    commit(root, "third release", "v1.2.0")
    return root


def accept(raw: dict, label: str) -> None:
    assert raw["approvals"], label


# --------------------------------------------------------------------------- resolving


def test_newest_matching_tag_before_heads_own(repo):
    ref = resolve_release_ref(repo, None)
    assert (ref.label, ref.explicit) == ("v1.1.0", False)
    assert ref.commit == git(repo, "rev-parse", "v1.1.0^{commit}")


def test_found_from_a_subfolder_with_another_pattern(repo):
    ref = resolve_release_ref(repo / SUITE, None, tag_pattern="release-*")
    assert ref.label == "release-2"


def test_untagged_head_takes_its_own_newest_tag_back(repo):
    (repo / "README").write_text("more\n")
    commit(repo, "after the release")
    assert resolve_release_ref(repo, None).label == "v1.2.0"


@pytest.mark.parametrize("name", ["v1.0.0", "main"])
def test_explicit_tag_or_branch(repo, name):
    ref = resolve_release_ref(repo, name)
    assert (ref.label, ref.explicit) == (name, True)
    assert ref.commit == git(repo, "rev-parse", f"{name}^{{commit}}")


def test_explicit_sha_is_labelled_by_its_short_sha(repo):
    sha = git(repo, "rev-parse", "v1.0.0^{commit}")
    ref = resolve_release_ref(repo, sha[:10])
    assert (ref.commit, ref.label) == (sha, sha[:12])


def test_missing_ref(repo):
    with pytest.raises(ReleaseError, match=r"^release ref 'v9.9': not a commit of the repository at .*repo \(.*\); "
                                           r"name an existing tag, branch or commit$"):
        resolve_release_ref(repo, "v9.9")


def test_no_matching_tag_counts_the_tags(repo):
    with pytest.raises(ReleaseError, match=r"no tag matching 'x\*' is reachable from HEAD other than HEAD's own "
                                           r"\(the repository has 5 tag\(s\), 0 matching\); tag the previous release"):
        resolve_release_ref(repo, None, tag_pattern="x*")


def test_shallow_clone_says_to_fetch_tags(repo, tmp_path):
    clone = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(clone))
    with pytest.raises(ReleaseError) as caught:
        resolve_release_ref(clone, None)
    message = str(caught.value)
    assert "(only on HEAD itself: v1.2.0); this is a shallow clone" in message
    assert message.endswith(FETCH_TAGS_FIX)
    with pytest.raises(ReleaseError, match=r"'v1.0.0': not a commit .*; this is a shallow clone; fetch tags: `actions/checkout`"):
        resolve_release_ref(clone, "v1.0.0")


def test_clone_without_tags_says_to_fetch_tags(repo, tmp_path):
    clone = tmp_path / "notags"
    git(tmp_path, "clone", "-q", "--no-tags", f"file://{repo}", str(clone))
    with pytest.raises(ReleaseError, match=r"the repository has 0 tag\(s\), 0 matching\); fetch tags: `actions"):
        resolve_release_ref(clone, None)


def test_not_a_repository(tmp_path):
    with pytest.raises(ReleaseError, match="is not inside a git repository"):
        resolve_release_ref(tmp_path, None)


# --------------------------------------------------------------------------- reading


def test_read_at_reads_git_objects_not_the_working_tree(repo):
    ref = resolve_release_ref(repo, "v1.0.0")
    (repo / SUITE / "cudagate.approvals.json").write_text("{}")
    raw = json.loads(read_at(ref, f"{SUITE}/cudagate.approvals.json"))
    assert raw["approvals"]["scale"]["source_blob"].startswith("approved/")


def test_read_at_refuses_large_blobs_and_missing_files(repo):
    ref = resolve_release_ref(repo, "v1.0.0")
    with pytest.raises(ReleaseError, match=r"cudagate.approvals.json at v1.0.0 is \d+ bytes, over the 16-byte cap"):
        read_at(ref, f"{SUITE}/cudagate.approvals.json", max_bytes=16)
    with pytest.raises(ReleaseError, match=r"^README does not exist at v1.0.0$"):
        read_at(ref, "README")
    with pytest.raises(ReleaseError, match="only paths inside the repository"):
        read_at(ref, "../etc/passwd")


def test_released_approvals_read_the_pinned_version(repo):
    ref = resolve_release_ref(repo, None)
    seen = []
    released = released_approvals(ref, SUITE, lambda raw, label: seen.append((sorted(raw["approvals"]), label)))
    assert seen == [(["scale"], "v1.1.0")]
    scale = released["scale"]
    assert (scale.source, scale.label, scale.options, scale.build) == ("// v2\n", "v1.1.0", ("-DK=1",), None)
    spec = scale.version.kernel(Case("small", "performance", {"n": 4}))
    assert spec["source"] == "// v2\n" and spec["source_name"] == "scale.cu"  # every build by its kernel's name
    assert scale.version.launch_for(Case("big", "performance", {"n": 4})).block == ("512",)
    assert scale.version.launch_for(Case("small", "performance", {"n": 4})).grid == ("cdiv(n, 256)",)


def test_a_released_version_with_variants_builds_each_class_as_it_was_approved(repo):
    path = repo / SUITE / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    variant = {"options": ["-DWIDE=1"], "launch": {"grid": ["n"], "block": [64]}}
    raw["approvals"]["scale"]["classes"] = {"large": variant}
    path.write_text(json.dumps(raw))
    commit(repo, "variants", "v2.0.0")
    scale = released_approvals(resolve_release_ref(repo, "v2.0.0"), SUITE, accept)["scale"]
    large, small = Case("l", "performance", {"n": 4}, shape_class="large"), Case("s", "performance", {"n": 4})
    assert scale.version.kernel(large)["options"] == ["-DK=1", "-DWIDE=1"]
    assert scale.version.kernel(small)["options"] == ["-DK=1"]
    assert scale.version.launch_for(large).block == ("64",) and scale.version.launch_for(small).block == ("256",)
    assert scale.version.launch_for(Case("big", "performance", {"n": 4}, shape_class="large")).block == ("512",)  # override wins
    assert scale.identity()["classes"] == {"large": variant}
    assert "classes" not in released_approvals(resolve_release_ref(repo, "v1.1.0"), SUITE, accept)["scale"].identity()


def test_recorded_build_is_carried(repo):
    approve(repo, "scale", "// v4\n", build={"nvrtc_version": "13.0", "options": ["-DK=1"],
                                            "cubin_sha256": {"sm_90": "ab" * 32}})
    commit(repo, "fourth", "v1.3.0")
    released = released_approvals(resolve_release_ref(repo, "v1.3.0"), SUITE, accept)
    assert released["scale"].build == BuildRecord("13.0", ("-DK=1",), {"sm_90": "ab" * 32})


def test_a_rejected_signature_stops_everything(repo):
    def untrusted(raw, label):
        raise CudagateError(f"{SUITE}/cudagate.approvals.json at {label}: approval of 'scale' is not signed")

    with pytest.raises(CudagateError, match="at v1.1.0: approval of 'scale' is not signed"):
        released_approvals(resolve_release_ref(repo, None), SUITE, untrusted)


def test_tampered_pinned_copy_at_the_ref(repo):
    blob = approve(repo, "scale", "// v4\n", blob_text="// v4, edited after approval\n")
    commit(repo, "tampered", "v1.3.0")
    with pytest.raises(ReleaseError, match=rf"^{SUITE}/{blob} at v1.3.0: content does not match its hash"):
        released_approvals(resolve_release_ref(repo, "v1.3.0"), SUITE, accept)


def test_pinned_copy_missing_at_the_ref(repo):
    blob = approve(repo, "scale", "// v4\n")
    (repo / SUITE / blob).unlink()
    commit(repo, "lost the pinned copy", "v1.3.0")
    (repo / SUITE / blob).write_text("// v4\n")  # present in the working tree: must not be used
    with pytest.raises(ReleaseError, match=rf"^{SUITE}/{blob} does not exist at v1.3.0, but .*approval of 'scale' pins it"):
        released_approvals(resolve_release_ref(repo, "v1.3.0"), SUITE, accept)


def test_kernel_added_after_the_ref_is_absent(repo):
    approve(repo, "scale_fast", "// fast\n")
    commit(repo, "a second kernel")
    released = released_approvals(resolve_release_ref(repo, "v1.0.0"), SUITE, accept, kernels=["scale", "scale_fast"])
    absent = released["scale_fast"]
    assert isinstance(absent, AbsentAtRef)
    assert absent.describe() == (f"kernel 'scale_fast' did not exist at v1.0.0 (no approval in "
                                 f"{SUITE}/cudagate.approvals.json there)")
    assert released["scale"].source == "// v1\n"


def test_suite_added_after_the_ref_is_absent_and_verify_is_not_called(repo):
    def never(raw, label):
        raise AssertionError("nothing to verify")

    released = released_approvals(resolve_release_ref(repo, "v1.0.0"), "kernels/new", never, kernels=["k"])
    assert released["k"].describe() == "kernel 'k' did not exist at v1.0.0 (kernels/new did not exist there)"


@pytest.mark.parametrize("change, message", [
    ({"source_blob": "../../etc/passwd"}, r"pinned copy '\.\./\.\./etc/passwd' is not approved/<sha256>\.<ext>"),
    ({"entry": None}, r"field 'entry' is missing or not a str"),
    ({"build": {"options": []}}, r"field 'build' needs nvrtc_version, options and cubin_sha256"),
    ({"launch_overrides": {"big": {"grid": [1]}}}, r"launch_overrides.big needs 'grid' and 'block' lists"),
    ({"classes": {"large": {"options": "-DW=1"}}}, r"classes.large needs an 'options' list of strings"),
    ({"classes": {"large": {"options": [], "launch": {"block": [1]}}}}, r"classes.large.launch needs 'grid' and 'block' lists"),
])
def test_malformed_entry_names_the_field(repo, change, message):
    path = repo / SUITE / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw["approvals"]["scale"].update(change)
    path.write_text(json.dumps(raw))
    commit(repo, "broken ledger", "v1.3.0")
    with pytest.raises(ReleaseError, match=rf"cudagate.approvals.json at v1.3.0: approval of 'scale': {message}"):
        released_approvals(resolve_release_ref(repo, "v1.3.0"), SUITE, accept)


def test_unreadable_ledger(repo):
    (repo / SUITE / "cudagate.approvals.json").write_text("[" * 100_000)
    commit(repo, "garbage", "v1.3.0")
    with pytest.raises(ReleaseError, match="at v1.3.0: not a readable approvals ledger"):
        released_approvals(resolve_release_ref(repo, "v1.3.0"), SUITE, accept)


# --------------------------------------------------------------------------- verdict text


def test_build_drift_says_what_changed_and_what_was_measured():
    then = BuildRecord("12.8", ("-O3",), {"sm_90": "aa"})
    assert build_drift(then, then).describe("v1") == "same toolchain as v1"
    nvrtc = build_drift(then, BuildRecord("13.0", ("-O3",), {"sm_90": "bb"}))
    assert nvrtc.describe("v1") == ("toolchain: NVRTC 12.8 -> 13.0 since v1: NOT measured (the release's cubin was not "
                                    "kept and today's NVRTC cannot rebuild it; both versions were built with today's NVRTC)")
    options = build_drift(then, BuildRecord("12.8", ("-O3", "-G"), {}))
    assert options.describe("v1") == ("toolchain: options ['-O3'] -> ['-O3', '-G'] since v1: measured (the release's "
                                      "options are built and timed against today's)")
    assert "v1 did not record its build" in build_drift(None, then).describe("v1")
    cubin = build_drift(then, BuildRecord("12.8", ("-O3",), {"sm_90": "cc"}))
    assert cubin.cubin_only and "NOT measured" in cubin.describe("v1")


def test_a_first_release_is_told_apart_from_a_missing_one(tmp_path):
    root = tmp_path / "first"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    approve(root, "scale", "// v1\n")
    commit(root, "first release", "v1.0.0")
    with pytest.raises(NoReleaseYet, match=r"\(only on HEAD itself: v1.0.0\)\); tag the previous release"):
        resolve_release_ref(root, None)
    (root / "README").write_text("x\n")
    commit(root, "no tag", "other")
    with pytest.raises(ReleaseError) as caught:
        resolve_release_ref(root, None, tag_pattern="release-*")
    assert not isinstance(caught.value, NoReleaseYet)
