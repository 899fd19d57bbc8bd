"""The approvals ledger: which version of each kernel is approved, and its baseline timings.

``cudagate.approvals.json`` sits beside the suite file. An approved kernel is pinned by content:
its source and headers are copied to ``approved/<sha256>.<ext>`` so the gate can always replay the
approved version next to the current one, whatever the branch has done to the source since.
Baselines are keyed by hardware fingerprint: timings are only ever compared on like hardware.

Format 2 is one document signed as a whole (see ``trust/ledger.py``): every kernel of the suite has
an approval or is listed in ``pending`` (explicitly not yet approved), each approval's ``kernel``
equals its key, the document names its suite, and ``sequence`` grows by one on every signing, so an
older signed ledger can be told from the current one. ``chain`` names the signed ledgers this one
replaced (trust/ledger.py), so a signature counts only against the base it was made over, and
``pull_request`` the pull request it was signed for, so it counts in that one only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.errors import FileError
from pytest_cudagate.host.paths import command
from pytest_cudagate.worker.requests import KernelVersion, current_version, kernel_spec, pinned_version
from pytest_cudagate.suite.model import Program, Suite

LEDGER_NAME = "cudagate.approvals.json"
BLOB_DIR = "approved"
FORMAT = 2


@dataclass
class Baseline:
    fingerprint: dict
    measured_at: str
    # case -> {"summary": {...}, "samples_ms": [...], "cache": "cold", "run_p10_ms": [...]}; the last,
    # optional, holds one median per independent run at approval (the release check's spread).
    cases: dict[str, dict]


@dataclass
class Approval:
    kernel: str
    source_sha256: str
    source_blob: str  # relative to the suite folder
    entry: str
    options: list[str]
    headers: dict[str, str]  # include name -> blob path
    launch: dict | list  # a kernel of steps: one record per step (suite/model.py Steps.to_json)
    launch_overrides: dict[str, dict]
    arch_suffix: str
    approved_at: str
    approved_by: str
    git: dict
    tool_version: str
    baselines: dict[str, Baseline] = field(default_factory=dict)
    # Optional: how the approved binary was built, {"nvrtc_version": "13.0", "options": [...],
    # "cubin_sha256": {"sm_90": "..."}}, so a release can tell a toolchain change from a kernel change.
    build: dict | None = None
    # The kernel's class variants, {class: {"options": [...], "launch": {...}}} (launch optional);
    # absent from ledgers of kernels without variants, whose entries and identities stay as they were.
    classes: dict[str, dict] = field(default_factory=dict)
    # The kernel's `compiler:` (nvcc or nvrtc); None, and absent from the ledger, for auto: approvals
    # of kernels without the field keep their entries and identities.
    compiler: str | None = None

    def identity(self) -> dict:
        """The build this approval pins; equal to the identity of an unchanged kernel's current version."""
        return {
            "source_sha256": self.source_sha256,
            "headers": {name: Path(blob).stem for name, blob in self.headers.items()},
            "entry": self.entry, "options": list(self.options), "launch": self.launch,
            "launch_overrides": self.launch_overrides, "arch_suffix": self.arch_suffix,
            **({"classes": self.classes} if self.classes else {}),
            **({"compiler": self.compiler} if self.compiler else {}),
        }

    def signed_payload(self) -> dict:
        """The entry as the signed ledger holds it: the pinned kernel, its build and every baseline."""
        data = asdict(self)
        if data["build"] is None:
            data.pop("build")
        if not data["classes"]:
            data.pop("classes")
        if data["compiler"] is None:
            data.pop("compiler")
        return data


@dataclass
class Ledger:
    path: Path
    suite: str
    approvals: dict[str, Approval] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    sequence: int = 0  # +1 on every signing; a signed ledger with a lower one is an older one
    pending: list[str] = field(default_factory=list)  # kernels explicitly not yet approved
    # SHA-256 of the suite's signed manifest (cudagate.sig.json) when the ledger was signed: binds the
    # oracle to the sequence-protected ledger, so an older signed oracle cannot come back alone.
    oracle_sha256: str | None = None
    # The state ids (trust/ledger.py state_id) of the signed ledgers this one replaced, oldest first:
    # under --trusted-ref a changed ledger must name the base's, so one signed over another base fails.
    chain: list[str] = field(default_factory=list)
    # The pull request this signing was made for (`cudagate sign --pull-request N`); None: signed for none.
    # Under `cudagate gate --pull-request N` a changed signed state must carry N, so one signed in another
    # pull request over the same base does not count here.
    pull_request: int | None = None
    signature: dict | None = None  # over the whole document (trust/ledger.py)
    format: int = FORMAT  # as read; 1 = entries signed one by one, no longer trusted
    exists: bool = True  # False: no file on disk
    kernels: tuple[str, ...] = ()  # the suite's kernels, which the signed ledger must all account for

    @property
    def root(self) -> Path:
        return self.path.parent

    @classmethod
    def for_suite(cls, suite: Suite) -> Ledger:
        path = suite.root / LEDGER_NAME
        kernels = tuple(k.name for k in suite.all_kernels)  # one ledger holds every instantiation's
        if not path.exists():
            return cls(path, suite.name, exists=False, kernels=kernels)
        try:
            raw = boundary.parse_json(boundary.read_text(path, boundary.MAX_LEDGER_BYTES, "approvals ledger"), path, "approvals ledger")
        except (OSError, ValueError) as exc:
            raise FileError(path, [f"cannot read the approvals ledger: {exc}; restore it from version control "
                                   f"or re-approve with `{command('cudagate', 'approve', suite.path)}`"]) from None
        schema.validate(raw, "approvals", path)
        return cls.from_json(path, raw, kernels)

    @classmethod
    def from_json(cls, path: Path, raw: dict, kernels: tuple[str, ...] = ()) -> Ledger:
        approvals = {}
        for name, entry in raw["approvals"].items():
            entry = dict(entry)
            entry.pop("signature", None)  # format 1 signed each entry; format 2 signs the document
            baselines = {key: Baseline(**b) for key, b in entry.pop("baselines", {}).items()}
            approvals[name] = Approval(**entry, baselines=baselines)
        return cls(path, raw["suite"], approvals, raw.get("history", []), raw.get("sequence", 0),
                   list(raw.get("pending", [])), raw.get("oracle_sha256"), list(raw.get("chain", [])),
                   raw.get("pull_request"), raw.get("signature"), raw["format"], True, kernels)

    def signed_payload(self) -> dict:
        """What the maintainer's signature covers: everything in the file but the signature. ``chain``
        only where it has a link and ``pull_request`` only where one was given, so ledgers signed before
        they existed keep their signatures."""
        return {"format": FORMAT, "suite": self.suite, "sequence": self.sequence, "pending": sorted(self.pending),
                "oracle_sha256": self.oracle_sha256, **({"chain": list(self.chain)} if self.chain else {}),
                **({"pull_request": self.pull_request} if self.pull_request is not None else {}),
                "approvals": {name: a.signed_payload() for name, a in sorted(self.approvals.items())},
                "history": self.history}

    def to_json(self) -> dict:
        return {**self.signed_payload(), "signature": self.signature}

    def save(self) -> None:
        text = json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"
        schema.validate(json.loads(text), "approvals", self.path)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=LEDGER_NAME, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)
        self.format, self.exists = FORMAT, True

    # -- approved programs ----------------------------------------------------------------------
    def store_blob(self, text: str, suffix: str) -> tuple[str, str]:
        digest = hashlib.sha256(text.encode()).hexdigest()
        relative = f"{BLOB_DIR}/{digest}{suffix}"
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_text(text, encoding="utf-8")
        return digest, relative

    def read_blob(self, relative: str, expected_sha: str | None = None) -> str:
        path = self.root / relative
        try:
            # newlines read as Path.read_text reads them (a CRLF checkout hashes as committed)
            text = boundary.read_text(path, boundary.MAX_SOURCE_BYTES, "approved source").replace("\r\n", "\n")
            text = text.replace("\r", "\n")
        except FileNotFoundError:
            raise FileError(self.path, [f"approved source {relative} is missing; restore it from version control"]) from None
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest != (expected_sha or Path(relative).stem):
            raise FileError(path, [f"content does not match its hash ({digest[:12]}…): the approved copy was altered"])
        return text

    def pinned_texts(self, approval: Approval) -> tuple[str, dict[str, str]]:
        """The approved source and headers, read from the pinned copies and checked against their hashes."""
        return (self.read_blob(approval.source_blob, approval.source_sha256),
                {name: self.read_blob(blob) for name, blob in approval.headers.items()})

    def approved_version(self, approval: Approval) -> KernelVersion:
        """The approved version, from the pinned copies (each checked against its hash)."""
        source, headers = self.pinned_texts(approval)
        return pinned_version(approval.kernel, source, headers, asdict(approval))


def approval_for(ledger: Ledger, program: Program, *, approved_by: str, approved_at: str, git: dict,
                 tool_version: str) -> Approval:
    """A new approval of ``program`` as it stands in the working tree, with pinned copies."""
    spec = kernel_spec(program.shared)
    digest, blob = ledger.store_blob(spec["source"], program.source.suffix or ".cu")
    headers = {name: ledger.store_blob(text, Path(name).suffix or ".h")[1] for name, text in spec["headers"].items()}
    return Approval(
        kernel=program.name, source_sha256=digest, source_blob=blob, entry=program.entry,
        options=list(program.options), headers=headers, launch=program.launch.to_json(),
        launch_overrides={k: v.to_json() for k, v in program.launch_overrides.items()},
        arch_suffix=program.arch_suffix, approved_at=approved_at, approved_by=approved_by, git=git,
        tool_version=tool_version, classes=variants_record(program),
        compiler=None if program.compiler == "auto" else program.compiler,
    )


def build_identity(program: Program) -> dict:
    """What makes the working-tree kernel the same build as an approval (see Approval.identity):
    every class variant included, so a changed variant is a changed kernel."""
    return current_version(program).identity


def variants_record(program: Program) -> dict[str, dict]:
    """A kernel's class variants as an approval pins them."""
    return {name: variant.to_json() for name, variant in sorted(program.classes.items())}


def git_state(path: Path) -> dict:
    """Commit and dirty state of the repository holding ``path`` (empty when not in one)."""
    try:
        import git

        # expand_vars off: a folder a pull request names `$HOME...` is that folder, not the variable's
        repo = git.Repo(path, search_parent_directories=True, expand_vars=False)
        return {"commit": repo.head.commit.hexsha, "dirty": repo.is_dirty(untracked_files=True)}
    except Exception:  # not a repository, no commits yet, or git missing: record what we know
        return {"commit": None, "dirty": None}
