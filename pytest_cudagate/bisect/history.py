"""A kernel's approved versions along GOOD..BAD, read from git objects as the release gate reads a release.

The kernel at a commit is its approval in the suite's ledger there: the pinned source and headers,
entry, options and launch, read size-capped from git objects (never the working tree) and checked
against today's trusted keys before anything in them is used (``release.released_approvals``).
Walking the first-parent path from GOOD to BAD, a commit whose ledger blob is GOOD's predecessor's
costs one tree lookup; only a commit that changes the kernel's pinned identity becomes a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.trust.release import (LEDGER_NAME, AbsentAtRef, ReleasedApproval, ReleaseRef, is_shallow,
                                     released_approvals)
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust.base_ref import TrustRoot, resolve_commit
from pytest_cudagate.trust.ledger import release_verifier

SHALLOW_FIX = "fetch the history: `git fetch --unshallow` (in GitHub Actions, actions/checkout with fetch-depth: 0)"
MAX_SUBJECT_CHARS = 200  # a commit subject is shown, never parsed
# How the release gate's refusals of a ledger or pinned copy at a ref end (trust/ledger.py, release.py)
RELEASE_FIX = "; the release cannot be used as a reference"


class BisectError(CudagateError):
    """The range cannot be bisected; the message names the ref, the commit or the file."""


@dataclass(frozen=True)
class Version:
    """The kernel as approved at one commit."""

    commit: str  # full hex sha
    subject: str
    approval: ReleasedApproval

    @property
    def short(self) -> str:
        return self.commit[:12]

    def to_json(self) -> dict:
        return {"commit": self.commit, "subject": self.subject}


@dataclass(frozen=True)
class KernelHistory:
    """GOOD's version and, in order, each later commit on the path to BAD that changes the kernel."""

    good: Version
    candidates: tuple[Version, ...]
    commits: int  # commits on the first-parent path after GOOD, up to BAD
    bad: str  # BAD's full sha (its version is the last candidate's)

    @property
    def skipped(self) -> int:
        """Commits that leave the kernel's approved version as it was: no GPU time is spent on them."""
        return self.commits - len(self.candidates)


def kernel_history(repo_root: Path, good: str, bad: str, suite: Suite, kernel: str,
                   trust_root: TrustRoot | None = None) -> KernelHistory:
    """``kernel`` of ``suite`` as approved at GOOD and at each commit after it, on BAD's first-parent
    path, that changes its pinned identity; each ledger verified against the keys of ``trust_root``
    (``--trusted-ref``), else the working tree's. Raises :class:`BisectError` (one line) for a path
    outside a repository, a shallow clone, a ref that is not a commit, GOOD not an ancestor of BAD,
    a commit where the kernel has no approval, and a range in which the kernel never changes."""
    import git  # gitpython (~35 ms): only here, as in release mode

    try:
        repo = git.Repo(repo_root, search_parent_directories=True, expand_vars=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise BisectError(f"{repo_root} is not inside a git repository; bisect reads the kernel's approved versions "
                          "from git history: pass --repo DIR") from None
    if is_shallow(repo):
        raise BisectError(f"{repo.working_dir} is a shallow clone: bisect reads every commit from GOOD to BAD; "
                          f"{SHALLOW_FIX}")
    fix = "name an existing tag, branch or commit"
    good_commit = resolve_commit(repo, good, "GOOD", fix, BisectError)
    bad_commit = resolve_commit(repo, bad, "BAD", fix, BisectError)
    if good_commit == bad_commit:
        raise BisectError(f"GOOD {good!r} and BAD {bad!r} are the same commit ({good_commit.hexsha[:12]}): nothing "
                          "between them to bisect; pass an older GOOD")
    if not repo.is_ancestor(good_commit, bad_commit):
        raise BisectError(f"GOOD {good!r} ({good_commit.hexsha[:12]}) is not an ancestor of BAD {bad!r} "
                          f"({bad_commit.hexsha[:12]}): pass a GOOD from BAD's history (or swap them if BAD is "
                          "the older one)")
    folder = _suite_folder(repo, suite)
    ledger = str(PurePosixPath(folder) / LEDGER_NAME)
    verify = release_verifier(trust_root)(suite)
    path = repo.git.rev_list("--first-parent", "--reverse", f"{good_commit.hexsha}..{bad_commit.hexsha}").split()

    def version(sha: str) -> Version:
        commit = repo.commit(sha)
        try:
            released = released_approvals(ReleaseRef(repo, sha, sha[:12], explicit=True), folder, verify,
                                          kernels=[kernel])[kernel]
        except CudagateError as exc:  # the release gate's words, with bisect's fix in place of the release's
            said = str(exc).split(RELEASE_FIX)[0]
            raise BisectError(f"{said}; bisect trusts nothing it cannot verify at every commit from GOOD to BAD: "
                              f"pass a GOOD after {sha[:12]}") from None
        if isinstance(released, AbsentAtRef):
            raise BisectError(f"{released.describe()}: bisect needs the kernel's approved version at every commit "
                              f"from GOOD to BAD; pass a GOOD at or after the commit that approved it")
        return Version(sha, commit.summary[:MAX_SUBJECT_CHARS], released)

    first = version(good_commit.hexsha)
    blob, current, candidates = _blob(repo, good_commit.hexsha, ledger), first, []
    for sha in path:
        now = _blob(repo, sha, ledger)
        if now is not None and now == blob:
            continue  # the same ledger, byte for byte: the same approved version
        blob = now
        found = version(sha)
        if found.approval.identity() != current.approval.identity():
            candidates.append(found)
            current = found
    if not candidates:
        raise BisectError(f"kernel {kernel!r} has the same approved version ({first.approval.source_sha256[:12]}) in "
                          f"{ledger} at each of the {len(path)} commit(s) from GOOD {good!r} to BAD {bad!r}: "
                          "nothing to bisect; pass a range in which the kernel was re-approved")
    return KernelHistory(first, tuple(candidates), len(path), bad_commit.hexsha)


def _suite_folder(repo, suite: Suite) -> str:
    """The suite's folder relative to the repository's root, as the ledger is found at each commit."""
    top = Path(repo.working_dir).resolve()
    try:
        return Path(suite.root).resolve().relative_to(top).as_posix()
    except ValueError:
        raise BisectError(f"{suite.path} is outside the repository {top}; bisect reads the suite's ledger from that "
                          "repository's history: pass --repo DIR, the repository holding the suite") from None


def _blob(repo, sha: str, path: str) -> str | None:
    """The object id of ``path`` at ``sha`` (None where it is missing): equal ids, equal bytes."""
    try:
        return (repo.commit(sha).tree / path).hexsha
    except KeyError:
        return None
