"""The release reference: each kernel's approval as it stood at the previous release, read from git.

The release gate times today's kernel interleaved against the version pinned at a release ref (a
tag by default), so many small approvals that add up are caught with the power of one PR. Only git
objects are read (never the working tree), everything read before the signature check is
size-capped, and the ledger's signatures are checked by a callable the caller injects, bound to
today's trusted keys.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.worker.requests import KernelVersion, pinned_version

if TYPE_CHECKING:
    import git  # gitpython (~35 ms): imported where a release ref is resolved, only in release mode

LEDGER_NAME = "cudagate.approvals.json"  # the ledger's file name, as trust.approvals.LEDGER_NAME
# Largest git blob read at a ref: ledgers with per-launch samples run to a few MiB; anything far
# larger is not ours to parse before its signature is checked.
MAX_BLOB_BYTES = 32 * 2**20
FETCH_TAGS_FIX = "fetch tags: `actions/checkout` with `fetch-depth: 0`"
# A pinned copy is named by its content hash; nothing else may be read through a ledger entry.
_PINNED = re.compile(r"approved/([0-9a-f]{64})\.[A-Za-z0-9]+")

# verify(raw_ledger, ref_label) raises a CudagateError unless every entry is signed by a trusted key.
Verify = Callable[[dict, str], None]


class ReleaseError(CudagateError):
    """The release reference cannot be resolved or read; the message names the ref and the file."""


class MissingAtRef(ReleaseError):
    """A path that does not exist at the ref."""


class NoReleaseYet(ReleaseError):
    """The only release tag is HEAD's own, in a full clone: the first release, with nothing before it."""


@dataclass(frozen=True)
class ReleaseRef:
    """A resolved release: the commit and how it is named in verdicts ("v1.3.0", or a short sha)."""

    repo: git.Repo
    commit: str  # full hex sha
    label: str
    explicit: bool  # named by the user rather than found by the tag pattern


@dataclass(frozen=True)
class BuildRecord:
    """What an approval was built with; absent from ledgers written before it was recorded."""

    nvrtc_version: str
    options: tuple[str, ...]
    cubin_sha256: dict[str, str]  # arch ("sm_90", "sm_90a") -> SHA-256 of the cubin
    compiler: str = ""  # "nvcc 13.0.88"; empty in records made before it was recorded (NVRTC's)

    @classmethod
    def from_json(cls, raw: dict) -> BuildRecord:
        """From an approval's ``build``; raises TypeError, KeyError or AttributeError when malformed."""
        return cls(str(raw["nvrtc_version"]), tuple(str(o) for o in raw["options"]),
                   {str(k): str(v) for k, v in raw.get("cubin_sha256", {}).items()}, str(raw.get("compiler", "")))

    @property
    def built_by(self) -> str:
        """The compiler and its exact version: a record without one was NVRTC's."""
        return self.compiler or f"NVRTC {self.nvrtc_version}"


@dataclass(frozen=True)
class ReleasedApproval:
    """One kernel as approved at the release ref: enough to build and launch that version."""

    kernel: str
    label: str
    commit: str
    source: str
    source_sha256: str
    headers: dict[str, str]  # include name -> text
    entry: str
    options: tuple[str, ...]
    arch_suffix: str
    launch: dict | list  # a kernel of steps: one record per step
    launch_overrides: dict[str, dict]
    build: BuildRecord | None
    classes: dict[str, dict] = field(default_factory=dict)  # the approval's class variants, as recorded
    compiler: str | None = None  # the kernel's `compiler:` as approved; None: auto

    @functools.cached_property
    def version(self) -> KernelVersion:
        """The released version, as the worker builds and launches it (its class variants' options after
        the kernel's, as for the approved version)."""
        return pinned_version(self.kernel, self.source, self.headers, {
            "entry": self.entry, "options": list(self.options), "arch_suffix": self.arch_suffix, "launch": self.launch,
            "launch_overrides": self.launch_overrides, "classes": self.classes,
            **({"compiler": self.compiler} if self.compiler else {})})

    def identity(self) -> dict:
        """The build it pins, in the shape of ``Approval.identity``: equal for the same kernel."""
        return {
            "source_sha256": self.source_sha256,
            "headers": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in self.headers.items()},
            "entry": self.entry, "options": list(self.options), "launch": self.launch,
            "launch_overrides": self.launch_overrides, "arch_suffix": self.arch_suffix,
            **({"classes": self.classes} if self.classes else {}),
            **({"compiler": self.compiler} if self.compiler else {}),
        }


@dataclass(frozen=True)
class AbsentAtRef:
    """A kernel with no approval at the release ref: judged ``incomparable``, saying which."""

    kernel: str
    label: str
    reason: str  # e.g. "no approval in examples/x/cudagate.approvals.json there"

    def describe(self) -> str:
        return f"kernel {self.kernel!r} did not exist at {self.label} ({self.reason})"


@dataclass(frozen=True)
class BuildDrift:
    """How the toolchain changed between the release's build and today's, and what was measured.

    The release's options are measured: the released version is built with its own options and
    timed against today's build. An NVRTC change is not: its old cubin is not kept, and today's
    NVRTC cannot produce the old binary, so the verdict says so instead of pretending.
    """

    options: str | None  # e.g. "options [] -> ['-Xptxas', '-O1']"
    nvrtc: str | None  # the compiler, e.g. "NVRTC 12.8 -> 13.0" or "NVRTC 13.5 -> nvcc 13.0.88"
    unrecorded: bool = False  # the release's ledger predates build records
    cubin_only: bool = False  # same NVRTC and options, another cubin (default flags or headers of the toolkit)

    @property
    def changed(self) -> bool:
        return bool(self.options or self.nvrtc or self.unrecorded or self.cubin_only)

    def describe(self, label: str) -> str:
        if not self.changed:
            return f"same toolchain as {label}"
        parts = []
        if self.options:
            parts.append(f"{self.options} since {label}: measured (the release's options are built and timed "
                         f"against today's)")
        if self.nvrtc:
            which = "compiler" if "nvcc" in self.nvrtc else "NVRTC"
            parts.append(f"{self.nvrtc} since {label}: NOT measured (the release's cubin was not kept and today's "
                         f"{which} cannot rebuild it; both versions were built with today's {which})")
        if self.cubin_only:
            parts.append(f"the cubin differs from {label}'s with the same NVRTC and options (toolkit headers or "
                         f"default flags): NOT measured")
        if self.unrecorded:
            parts.append(f"{label} did not record its build (approved before builds were recorded): an NVRTC "
                         f"change since then would NOT be measured")
        return "toolchain: " + "; ".join(parts)


# --------------------------------------------------------------------------- resolving the ref


def resolve_release_ref(repo_root: Path | str, ref: str | None, tag_pattern: str = "v*") -> ReleaseRef:
    """``ref`` (a tag, branch or commit), or the newest tag matching ``tag_pattern`` reachable from
    HEAD, other than one on HEAD itself (the release being made)."""
    import git

    try:
        repo = git.Repo(repo_root, search_parent_directories=True, expand_vars=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ReleaseError(f"{repo_root} is not inside a git repository; the release gate reads the previous "
                           f"release from git history") from None
    try:
        head = repo.head.commit.hexsha
    except ValueError:
        raise ReleaseError(f"{repo.working_dir}: the repository has no commits yet") from None
    shallow = is_shallow(repo)
    if ref is not None:
        return _explicit(repo, ref, shallow)
    tags = list(repo.tags)
    matching = {}
    for tag in tags:
        if not fnmatch.fnmatchcase(tag.name, tag_pattern):
            continue
        try:
            matching.setdefault(tag.commit.hexsha, []).append(tag.name)
        except ValueError:  # a tag on a tree or blob names no release
            continue
    # Topological order lists descendants first: the first tagged commit met is the newest release.
    for sha in repo.git.rev_list("--topo-order", head).split():
        if sha != head and sha in matching:
            names = sorted(matching[sha], key=_version_key, reverse=True)
            return ReleaseRef(repo, sha, names[0], explicit=False)
    on_head = matching.get(head, [])
    what = (f"the repository has {len(tags)} tag(s), {sum(len(v) for v in matching.values())} matching"
            + (f" (only on HEAD itself: {', '.join(on_head)})" if on_head else ""))
    fix = FETCH_TAGS_FIX if shallow or not tags else "tag the previous release or pass --cuda-gate-release=REF"
    shallow_note = "; this is a shallow clone" if shallow else ""
    first = on_head and not shallow and len(matching) == 1
    raise (NoReleaseYet if first else ReleaseError)(f"{repo.working_dir}: no tag matching {tag_pattern!r} is reachable from HEAD other than "
                       f"HEAD's own ({what}{shallow_note}); {fix}")


def _explicit(repo: git.Repo, ref: str, shallow: bool) -> ReleaseRef:
    from pytest_cudagate.trust.base_ref import resolve_commit

    fix = ("this is a shallow clone; " + FETCH_TAGS_FIX) if shallow else "name an existing tag, branch or commit"
    commit = resolve_commit(repo, ref, "release ref", fix, ReleaseError)
    label = ref if not re.fullmatch(r"[0-9a-fA-F]{7,40}", ref) else commit.hexsha[:12]
    return ReleaseRef(repo, commit.hexsha, label, explicit=True)


def is_shallow(repo: git.Repo) -> bool:
    return repo.git.rev_parse("--is-shallow-repository").strip() == "true"


def _version_key(name: str) -> tuple:
    """Sort tags on one commit by their version numbers (v1.10.0 after v1.9.0)."""
    return tuple(int(part) if part.isdigit() else -1 for part in re.split(r"[^0-9]+", name) if part)


# --------------------------------------------------------------------------- reading at the ref


def read_at(ref: ReleaseRef, path: str, max_bytes: int = MAX_BLOB_BYTES) -> bytes:
    """The content of ``path`` (relative to the repository root) at ``ref``, from git objects.

    A blob larger than ``max_bytes`` is refused before it is read.
    """
    posix = PurePosixPath(path)
    if posix.is_absolute() or ".." in posix.parts:
        raise ReleaseError(f"{path}: only paths inside the repository can be read at {ref.label}")
    try:
        item = ref.repo.commit(ref.commit).tree / str(posix)
    except KeyError:
        raise MissingAtRef(f"{path} does not exist at {ref.label}") from None
    if item.type != "blob":
        raise ReleaseError(f"{path} at {ref.label} is a {item.type}, not a file")
    if item.size > max_bytes:
        raise ReleaseError(f"{path} at {ref.label} is {item.size} bytes, over the {max_bytes}-byte cap for "
                           f"files read from a release; it is not a file cudagate wrote")
    return item.data_stream.read()


def released_approvals(ref: ReleaseRef, suite_dir: str, verify: Verify,
                       kernels: list[str] | None = None) -> dict[str, ReleasedApproval | AbsentAtRef]:
    """Every kernel approved in the suite folder ``suite_dir`` (relative to the repository root) at
    ``ref``, with its pinned source and headers read and hash-checked at that commit.

    ``verify(raw_ledger, ref.label)`` checks the ledger's signatures against today's trusted keys
    before anything in it is used. Each name in ``kernels`` that had no approval at the ref maps
    to an :class:`AbsentAtRef`.
    """
    suite_dir = str(PurePosixPath(suite_dir))
    ledger_path = str(PurePosixPath(suite_dir) / LEDGER_NAME)
    raw = _ledger_at(ref, ledger_path)
    if raw is None:
        found: dict[str, ReleasedApproval | AbsentAtRef] = {}
        reason = _absent_reason(ref, suite_dir, ledger_path)
    else:
        verify(raw, ref.label)
        found = {name: _released(ref, suite_dir, ledger_path, name, entry) for name, entry in raw["approvals"].items()}
        reason = f"no approval in {ledger_path} there"
    for name in kernels or ():
        found.setdefault(name, AbsentAtRef(name, ref.label, reason))
    return found


def _ledger_at(ref: ReleaseRef, ledger_path: str) -> dict | None:
    try:
        data = read_at(ref, ledger_path)
    except MissingAtRef:
        return None
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ReleaseError(f"{ledger_path} at {ref.label}: not a readable approvals ledger ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("approvals"), dict):
        raise ReleaseError(f"{ledger_path} at {ref.label}: no 'approvals' object; not an approvals ledger")
    return raw


def _absent_reason(ref: ReleaseRef, suite_dir: str, ledger_path: str) -> str:
    if suite_dir != ".":
        try:
            ref.repo.commit(ref.commit).tree / suite_dir
        except KeyError:
            return f"{suite_dir} did not exist there"
    return f"no {ledger_path} there"


def _released(ref: ReleaseRef, suite_dir: str, ledger_path: str, name: str, entry) -> ReleasedApproval:
    where = f"{ledger_path} at {ref.label}: approval of {name!r}"

    def field(key, kind):
        value = entry.get(key) if isinstance(entry, dict) else None
        if not isinstance(value, kind):
            raise ReleaseError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
        return value

    def launch(raw, key):
        if not (isinstance(raw, dict) and isinstance(raw.get("grid"), list) and isinstance(raw.get("block"), list)):
            raise ReleaseError(f"{where}: {key} needs 'grid' and 'block' lists")
        return raw

    def steps(raw, key):
        """A kernel's launch, or its steps: each a launch with an entry and a list of argument names."""
        if not isinstance(raw, list):
            return launch(raw, key)
        if not raw or len(raw) > 16:
            raise ReleaseError(f"{where}: {key} holds {len(raw)} steps (1 to 16)")
        for number, step in enumerate(raw, 1):
            if isinstance(step, dict) and any(kind in step for kind in ("memset", "copy", "library")):
                continue  # a memset, copy or library call (suite/steps.py from_record reads it)
            launch(step, f"{key} step {number}")
            if not (isinstance(step.get("entry"), str) and isinstance(step.get("args"), list)
                    and all(isinstance(a, str) for a in step["args"])):
                raise ReleaseError(f"{where}: {key} step {number} needs an 'entry' and a list of 'args'")
        return raw

    source_sha = field("source_sha256", str)
    source = _pinned_text(ref, suite_dir, field("source_blob", str), source_sha, where)
    headers = {include: _pinned_text(ref, suite_dir, blob, None, where)
               for include, blob in field("headers", dict).items()}
    return ReleasedApproval(
        kernel=name, label=ref.label, commit=ref.commit, source=source, source_sha256=source_sha,
        headers=headers, entry=field("entry", str), options=tuple(field("options", list)),
        arch_suffix=field("arch_suffix", str), launch=steps(entry.get("launch") if isinstance(entry, dict) else None, "launch"),
        launch_overrides={case: launch(raw, f"launch_overrides.{case}")
                          for case, raw in field("launch_overrides", dict).items()},
        build=_build(entry.get("build"), where),
        classes=_variants(entry.get("classes", {}), where, launch),
        compiler=_compiler(entry.get("compiler"), where),
    )


def _variants(raw: object, where: str, launch) -> dict[str, dict]:
    """An approval's ``classes`` at the ref: per class, a list of options and an optional launch."""
    if not isinstance(raw, dict):
        raise ReleaseError(f"{where}: field 'classes' is not a dict")
    for shape_class, variant in raw.items():
        if not (isinstance(variant, dict) and isinstance(variant.get("options"), list)
                and all(isinstance(o, str) for o in variant["options"])):
            raise ReleaseError(f"{where}: classes.{shape_class} needs an 'options' list of strings")
        if "launch" in variant:
            launch(variant["launch"], f"classes.{shape_class}.launch")
    return raw


def _pinned_text(ref: ReleaseRef, suite_dir: str, blob: object, expected_sha: str | None, where: str) -> str:
    """A pinned copy at the ref, whose SHA-256 must match its name (and the ledger's record)."""
    match = _PINNED.fullmatch(blob) if isinstance(blob, str) else None
    if match is None:
        raise ReleaseError(f"{where}: pinned copy {blob!r} is not approved/<sha256>.<ext>")
    path = str(PurePosixPath(suite_dir) / blob)
    try:
        data = read_at(ref, path)
    except MissingAtRef:
        raise MissingAtRef(f"{path} does not exist at {ref.label}, but {where} pins it; the release cannot "
                           f"be used as a reference") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != match.group(1) or (expected_sha is not None and digest != expected_sha):
        raise ReleaseError(f"{path} at {ref.label}: content does not match its hash ({digest[:12]}…): the pinned "
                           f"copy was altered; the release cannot be used as a reference")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReleaseError(f"{path} at {ref.label}: not UTF-8 text") from None


def _compiler(raw: object, where: str) -> str | None:
    if raw is None or raw in ("nvcc", "nvrtc"):
        return raw
    raise ReleaseError(f"{where}: field 'compiler' is {str(raw)[:40]!r}, not nvcc or nvrtc")


def _build(raw: object, where: str) -> BuildRecord | None:
    if raw is None:
        return None
    try:
        return BuildRecord.from_json(raw)
    except (TypeError, KeyError, AttributeError):
        raise ReleaseError(f"{where}: field 'build' needs nvrtc_version, options and cubin_sha256") from None


# --------------------------------------------------------------------------- one gate run's reference


class ReleaseSource:
    """The release reference of one gate run: the ref resolved once, each suite's approvals at it
    read and verified once. A problem (no such ref, a shallow clone, an unsigned ledger at the ref,
    a pinned copy missing there) is kept and raised again for every kernel it concerns, so each of
    them reports it and nothing else in the run is lost."""

    def __init__(self, root: Path | str, ref: str | None, tag_pattern: str, verifier: Callable[[Suite], Verify]):
        self.root = Path(root)
        self.requested = ref
        self.tag_pattern = tag_pattern
        self.verifier = verifier
        self._ref: ReleaseRef | ReleaseError | None = None
        self._suites: dict[Path, dict[str, ReleasedApproval | AbsentAtRef] | CudagateError] = {}

    def ref(self) -> ReleaseRef:
        if self._ref is None:
            try:
                self._ref = resolve_release_ref(self.root, self.requested, self.tag_pattern)
            except ReleaseError as exc:
                self._ref = exc
        if isinstance(self._ref, ReleaseError):
            raise self._ref
        return self._ref

    def describe(self) -> str:
        """One line for the session's summary: which release is the reference, or why there is none."""
        try:
            ref = self.ref()
        except ReleaseError as exc:
            return f"release reference: NONE: {exc}"
        how = "as asked" if ref.explicit else f"the newest tag matching {self.tag_pattern!r} before HEAD"
        return f"release reference {ref.label} (commit {ref.commit[:12]}, {how})"

    def lookup(self, suite: Suite, kernel: str) -> ReleasedApproval | AbsentAtRef:
        """``kernel`` of ``suite`` as approved at the ref; raises a :class:`CudagateError` naming the ref
        and the file when the release cannot be read or trusted."""
        key = Path(suite.path)
        if key not in self._suites:
            try:
                self._suites[key] = self._read(suite)
            except CudagateError as exc:
                self._suites[key] = exc
        found = self._suites[key]
        if isinstance(found, CudagateError):
            raise found
        return found.get(kernel) or AbsentAtRef(kernel, self.ref().label, "not a kernel of the suite")

    def kernel_status(self, suite: Suite, kernel: str, current: BuildRecord | None) -> tuple[str, bool]:
        """One line on ``kernel`` at the ref, and whether it is a warning (a first release, a kernel
        new since the release). Raises a :class:`CudagateError` naming the ref and the file when the
        release cannot be used as a reference. ``current``: today's build (None: it does not compile)."""
        try:
            released = self.lookup(suite, kernel)
        except NoReleaseYet as exc:
            return f"{exc}; a first release has nothing to be compared with", True
        if isinstance(released, AbsentAtRef):
            return f"{released.describe()}; its cases are judged by the PR gate only", True
        drift = (build_drift(released.build, current).describe(released.label) if current is not None
                 else "today's build does not compile")
        return (f"{kernel} as approved at {released.label} (source {released.source_sha256[:12]}) "
                f"is the reference of its performance cases; {drift}"), False

    def _read(self, suite: Suite) -> dict[str, ReleasedApproval | AbsentAtRef]:
        ref = self.ref()
        top = Path(ref.repo.working_dir).resolve()
        try:
            folder = Path(suite.root).resolve().relative_to(top).as_posix()
        except ValueError:
            raise ReleaseError(f"{suite.path} is outside the repository {top}; the release gate reads suites from "
                               f"its git history") from None
        return released_approvals(ref, folder, self.verifier(suite), kernels=[k.name for k in suite.kernels])


# --------------------------------------------------------------------------- verdicts


def build_drift(released: BuildRecord | None, current: BuildRecord) -> BuildDrift:
    """What changed in the toolchain between the release's build and today's.

    A release recorded before builds were recorded says so: nothing says it was built the same way.
    """
    if released is None:
        return BuildDrift(None, None, unrecorded=True)
    options = (f"options {list(released.options)} -> {list(current.options)}"
               if released.options != current.options else None)
    nvrtc = None
    if released.built_by != current.built_by:
        both_nvrtc = not released.compiler.startswith("nvcc") and not current.compiler.startswith("nvcc")
        nvrtc = (f"NVRTC {released.nvrtc_version} -> {current.nvrtc_version}" if both_nvrtc
                 else f"{released.built_by} -> {current.built_by}")
    same_arch = set(released.cubin_sha256) & set(current.cubin_sha256)
    cubin_only = (not options and not nvrtc
                  and any(released.cubin_sha256[a] != current.cubin_sha256[a] for a in same_arch))
    return BuildDrift(options, nvrtc, cubin_only=cubin_only)
