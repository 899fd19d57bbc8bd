"""The facts of the commit a report measured, from git: its time, subject and branch, the release tags
of the repository, and each suite's approvals ledger at that commit (for the approvals on the chart).

Only git objects are read (never the working tree), through gitpython, as the release gate reads them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path, PurePosixPath

from pytest_cudagate import boundary
from pytest_cudagate.config import load_settings, project_root
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.history.model import Commit
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.trust.release import LEDGER_NAME, MAX_BLOB_BYTES, ReleaseError, ReleaseRef, read_at

MAX_SUBJECT_CHARS = 200

Approvals = dict[str, tuple[str, str | None]]  # kernel -> (approved source sha256, approved at)


@dataclass(frozen=True)
class Facts:
    commit: Commit
    release_tags: dict[str, tuple[str, ...]] = field(default_factory=dict)  # commit -> release tags naming it
    approvals: dict[str, Approvals] = field(default_factory=dict)  # suite path -> its ledger's approvals
    ledgers: dict[str, Approvals] = field(default_factory=dict)  # ledger blobs read now (for the cache)
    note: str | None = None  # what git could not tell, for the user


def branch_of(ref: str | None) -> str | None:
    """A branch name from a GitHub ref (``refs/heads/main``); other refs (a pull request's) as they are."""
    return ref.removeprefix("refs/heads/") if ref else None


def from_report(sha: str, ref: str | None, why: str) -> Facts:
    """Facts the report itself gives: its commit and branch, no time, tags or approvals."""
    return Facts(Commit(sha, branch_of(ref), None, None),
                 note=f"{why}: recorded with the report's own commit and branch, without the commit's time, "
                      "release tags and approvals")


class GitFacts:
    """The repository holding ``repo_dir``, opened once for the reports recorded in one command: the
    release tags are listed once, each report's commit is read on its own."""

    def __init__(self, repo_dir: Path):
        import git  # gitpython (~35 ms): only commands that read git history import it

        self.repo_dir = repo_dir
        try:
            self.repo = git.Repo(repo_dir, search_parent_directories=True, expand_vars=False)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            self.repo = None
        self._tags: dict[str, tuple[str, ...]] | None = None

    def __enter__(self) -> "GitFacts":
        return self

    def __exit__(self, *exc) -> None:
        if self.repo is not None:
            self.repo.close()

    def release_tags(self) -> dict[str, tuple[str, ...]]:
        """Commit -> the release tags naming it."""
        if self._tags is None:
            pattern = load_settings(project_root(self.repo_dir)).release_tags
            tags: dict[str, list[str]] = {}
            for tag in self.repo.tags:
                if fnmatch.fnmatchcase(tag.name, pattern):
                    try:
                        tags.setdefault(tag.commit.hexsha, []).append(tag.name)
                    except ValueError:  # a tag on a tree or blob names no release
                        continue
            self._tags = {k: tuple(sorted(v)) for k, v in tags.items()}
        return self._tags

    def of(self, sha: str | None, ref: str | None, suite_paths: Iterable[str],
           cached: Callable[[str], Approvals | None]) -> Facts:
        """The facts of ``sha`` (the report's commit; None: HEAD).

        ``cached(blob)`` gives the approvals of a ledger blob read before. Where git cannot tell (no
        repository, a commit it lacks) the report's own commit is used; with no commit at all, a
        :class:`CudagateError`.
        """
        import git

        repo = self.repo
        if repo is None:
            if sha is None:
                raise CudagateError(f"{display_path(self.repo_dir)} is not in a git repository and the report names "
                                    "no commit (it was written outside GitHub Actions); run this in the checkout the "
                                    "report measured, or pass --repo DIR")
            return from_report(sha, ref, f"{display_path(self.repo_dir)} is not in a git repository")
        try:
            commit = repo.commit(sha or "HEAD")
            commit.tree  # resolves the object now: a commit this clone lacks fails here
        except (git.exc.GitError, git.exc.ODBError, ValueError) as exc:
            if sha is None:
                raise CudagateError(f"{repo.working_dir}: no commit at HEAD ({' '.join(str(exc).split())[:120]}); "
                                    "commit first, or pass --repo DIR") from None
            return from_report(sha, ref, f"commit {sha[:12]} is not in the repository at {repo.working_dir} "
                                         "(a shallow clone, or another repository)")
        head = None if repo.head.is_detached else repo.head.reference
        branch = branch_of(ref) or (head.name if head is not None and head.commit == commit else None)
        tags = self.release_tags()
        approvals, ledgers = _approvals(ReleaseRef(repo, commit.hexsha, commit.hexsha[:12], explicit=True),
                                        suite_paths, cached)
        committed = commit.committed_datetime.astimezone(timezone.utc).isoformat(timespec="seconds")
        subject = commit.summary if isinstance(commit.summary, str) else commit.summary.decode("utf-8", "replace")
        found = Commit(commit.hexsha, branch, committed, subject[:MAX_SUBJECT_CHARS], tags.get(commit.hexsha, ()))
        return Facts(found, tags, approvals, ledgers)


def _approvals(at: ReleaseRef, suite_paths: Iterable[str], cached: Callable[[str], Approvals | None]
               ) -> tuple[dict[str, Approvals], dict[str, Approvals]]:
    """Each suite's approvals at the commit (none where its ledger is missing or unreadable there)."""
    import git

    found: dict[str, Approvals] = {}
    read: dict[str, Approvals] = {}
    tree = at.repo.commit(at.commit).tree
    for suite_path in sorted(set(suite_paths)):
        posix = PurePosixPath(suite_path)
        if posix.is_absolute() or ".." in posix.parts:  # a suite outside the repository has no ledger in it
            continue
        path = str(posix.parent / LEDGER_NAME)
        try:
            blob = (tree / path).hexsha
        except (KeyError, ValueError, git.exc.GitError):  # no ledger there, or a path outside the tree
            continue
        approvals = cached(blob) if blob not in read else read[blob]
        if approvals is None:
            try:
                document = boundary.parse_json(read_at(at, path, MAX_BLOB_BYTES).decode("utf-8"), path, "ledger")
            except (ReleaseError, CudagateError, UnicodeDecodeError, ValueError):
                continue  # the gate refuses such a ledger itself; the history just shows no approval
            approvals = read[blob] = _approved(document)
        found[suite_path] = approvals
    return found, read


def _approved(ledger) -> Approvals:
    entries = ledger.get("approvals") if isinstance(ledger, dict) else None
    return {str(kernel): (entry["source_sha256"], entry.get("approved_at"))
            for kernel, entry in (entries.items() if isinstance(entries, dict) else ())
            if isinstance(entry, dict) and isinstance(entry.get("source_sha256"), str)
            and isinstance(entry.get("approved_at"), (str, type(None)))}
