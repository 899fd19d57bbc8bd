"""The trust root read from a trusted commit's git objects, never from the working tree.

Under ``cudagate gate --trusted-ref SHA`` the pull request's checkout is the working tree; what
decides whom to trust comes from the base commit instead: the public keys under
``.cudagate/trusted_keys/`` and in ``[tool.cudagate] trusted_keys``, the ``[tool.cudagate]`` policy,
each approvals ledger's sequence number and the suites that exist there. A pull request can then
neither add a key nor loosen a setting by editing files, nor roll a ledger back, nor drop a suite.

Everything is read from git objects with size and depth bounds (a hostile history must not make the
gate read gigabytes or recurse forever); symlinks and submodules in the trusted tree are not followed.
The result travels to the pytest plugin as a JSON document (``schemas/trust-root.schema.json``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives import serialization

from pytest_cudagate import schema
from pytest_cudagate.approvals import LEDGER_NAME
from pytest_cudagate.config import Settings, settings_from_table
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.suite.loader import SUITE_FILENAME
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust.keys import TRUSTED_KEYS_DIR, TrustedKeys, add_key, filter_by_allowed_ids, public_key_from_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FORMAT = 1
MAX_SMALL_BLOB = 1 << 20  # a key, pyproject.toml
MAX_LEDGER_BLOB = 64 << 20
MAX_DEPTH = 32
MAX_TREE_ENTRIES = 500_000
MAX_KEYS = 256
_BLOB_MODES = (0o100644, 0o100755)


@dataclass
class TrustRoot:
    ref: str  # the commit's full sha
    worktree: Path  # the checkout whose suites are judged
    keys: TrustedKeys
    policy: dict = field(default_factory=dict)  # [tool.cudagate] at the ref
    ledgers: dict[str, int] = field(default_factory=dict)  # suite folder (posix, from the root) -> sequence
    suites: tuple[str, ...] = ()  # suite files at the ref (posix, from the root)

    def ledger_sequence(self, suite: Suite) -> int | None:
        """The sequence of ``suite``'s ledger at the trusted ref; None when it had none there."""
        try:
            folder = suite.root.resolve().relative_to(self.worktree.resolve()).as_posix()
        except ValueError:
            return None
        return self.ledgers.get(folder)

    def settings(self) -> Settings:
        return settings_from_table(self.worktree, self.policy, f"pyproject.toml at {self.ref[:12]}")

    def to_json(self) -> dict:
        raw = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        return {"format": FORMAT, "ref": self.ref, "worktree": str(self.worktree), "policy": self.policy,
                "keys": {kid: {"pem": key.public_bytes(*raw).decode("ascii"), "sources": self.keys.sources.get(kid, [])}
                         for kid, key in sorted(self.keys.items())},
                "searched": self.keys.searched, "ledgers": dict(sorted(self.ledgers.items())),
                "suites": list(self.suites)}

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> TrustRoot:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FileError(path, [f"cannot read the trust root: {exc}"]) from None
        schema.validate(raw, "trust-root", path)
        keys = TrustedKeys()
        keys.searched = list(raw["searched"])
        for kid, entry in raw["keys"].items():
            for source in entry["sources"] or [f"trust root {kid}"]:
                add_key(keys, public_key_from_bytes(entry["pem"].encode("ascii"), path), source)
        return cls(raw["ref"], Path(raw["worktree"]), keys, raw["policy"], dict(raw["ledgers"]), tuple(raw["suites"]))


class _Reader:
    """Bounded reads from one commit's tree."""

    def __init__(self, commit):
        self.commit = commit
        self.short = commit.hexsha[:12]
        self.visited = 0

    def where(self, path: str) -> str:
        return f"{path} at {self.short}"

    def item(self, path: str):
        try:
            return self.commit.tree / path
        except KeyError:
            return None

    def blob(self, path: str, limit: int, item=None) -> bytes | None:
        item = item if item is not None else self.item(path)
        if item is None:
            return None
        if item.type != "blob" or item.mode not in _BLOB_MODES:
            raise FileError(self.where(path), ["not a regular file in the trusted commit (a symlink or submodule "
                                               "is not followed)"])
        if item.size > limit:
            raise FileError(self.where(path), [f"{item.size} bytes; more than the {limit} the gate reads"])
        return item.data_stream.read()

    def walk(self, tree, prefix: PurePosixPath, depth: int = 0):
        """Every regular file below ``tree``: (path, blob), breadth bounded by MAX_TREE_ENTRIES."""
        if depth > MAX_DEPTH:
            raise FileError(self.where(prefix.as_posix()), [f"folders nested deeper than {MAX_DEPTH} levels"])
        for item in tree:
            self.visited += 1
            if self.visited > MAX_TREE_ENTRIES:
                raise CudagateError(f"the trusted commit {self.short} has more than {MAX_TREE_ENTRIES} files and "
                                    "folders; the gate does not read further")
            if item.type == "tree":
                yield from self.walk(item, prefix / item.name, depth + 1)
            elif item.type == "blob" and item.mode in _BLOB_MODES:
                yield (prefix / item.name).as_posix(), item


def _policy(reader: _Reader) -> dict:
    data = reader.blob("pyproject.toml", MAX_SMALL_BLOB)
    if data is None:
        return {}
    try:
        table = tomllib.loads(data.decode("utf-8")).get("tool", {}).get("cudagate", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise FileError(reader.where("pyproject.toml"), [f"cannot read [tool.cudagate]: {exc}"]) from None
    return table if isinstance(table, dict) else {}


def _key_files(reader: _Reader, policy: dict) -> list[tuple[str, object]]:
    files = []
    folder = reader.item(TRUSTED_KEYS_DIR.as_posix())
    if folder is not None and folder.type == "tree":
        files += [(p, item) for p, item in reader.walk(folder, PurePosixPath(TRUSTED_KEYS_DIR.as_posix()))
                  if p.endswith(".pub")]
    for entry in policy.get("trusted_keys", ()) or ():
        path = PurePosixPath(str(entry))
        if path.is_absolute() or ".." in path.parts:
            raise FileError(reader.where("pyproject.toml"), [f"tool.cudagate.trusted_keys: {entry!r} must be a path "
                                                             "inside the repository"])
        item = reader.item(path.as_posix())
        if item is None:
            raise FileError(reader.where("pyproject.toml"), [f"tool.cudagate.trusted_keys: {entry!r} is neither a "
                                                             "file nor a folder in the trusted commit"])
        if item.type == "tree":
            files += [(p, i) for p, i in reader.walk(item, path) if p.endswith(".pub")]
        else:
            files.append((path.as_posix(), item))
    if len(files) > MAX_KEYS:
        raise CudagateError(f"the trusted commit {reader.short} lists {len(files)} public keys; at most {MAX_KEYS}")
    return files


def _ledger_sequence(reader: _Reader, path: str, item) -> int:
    try:
        raw = json.loads(reader.blob(path, MAX_LEDGER_BLOB, item))
    except (ValueError, UnicodeDecodeError) as exc:
        raise FileError(reader.where(path), [f"not valid JSON: {exc}"]) from None
    sequence = raw.get("sequence", 0) if isinstance(raw, dict) else 0
    return sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else 0


def read_trust_root(worktree: Path, ref: str) -> TrustRoot:
    """The trust root at ``ref`` of the repository holding ``worktree``, from git objects only."""
    import git  # gitpython (~35 ms): only `cudagate gate --trusted-ref` reads a trust root from git

    try:
        repo = git.Repo(worktree)
        commit = repo.commit(ref)
        commit.tree  # resolves the object now: an unknown sha fails here, not mid-read
    except (git.exc.GitError, ValueError) as exc:
        raise CudagateError(f"--trusted-ref {ref}: not a commit of the repository at {worktree} ({exc}); fetch "
                            "the base commit first (actions/checkout with fetch-depth: 0)") from None
    reader = _Reader(commit)
    policy = _policy(reader)
    keys = TrustedKeys()
    keys.searched.append(f"{TRUSTED_KEYS_DIR.as_posix()}/*.pub at {reader.short}")
    if policy.get("trusted_keys"):
        keys.searched.append(f"[tool.cudagate] trusted_keys at {reader.short}")
    for path, item in _key_files(reader, policy):
        add_key(keys, public_key_from_bytes(reader.blob(path, MAX_SMALL_BLOB, item), reader.where(path)),
                reader.where(path))
    filter_by_allowed_ids(keys)
    ledgers, suites = {}, []
    for path, item in reader.walk(commit.tree, PurePosixPath(".")):
        name = PurePosixPath(path)
        if name.name == LEDGER_NAME:
            ledgers[name.parent.as_posix()] = _ledger_sequence(reader, path, item)
        elif name.name == SUITE_FILENAME:
            suites.append(path)
    return TrustRoot(commit.hexsha, Path(worktree).resolve(), keys, policy, ledgers, tuple(sorted(suites)))
