"""The trust root read from a trusted commit's git objects, never from the working tree.

Under ``cudagate gate --trusted-ref SHA`` the pull request's checkout is the working tree; what
decides whom to trust comes from the base commit instead: the public keys under
``.cudagate/trusted_keys/`` and in ``[tool.cudagate] trusted_keys``, the ``[tool.cudagate]`` policy,
each approvals ledger's sequence number and state id, and each suite there: its path, its ``suite:``
name and its kernels' names. A pull request can then neither add a key nor loosen a setting by
editing files, nor roll a ledger back or bring one signed over another base, nor drop, move, rename
or swap a suite (a copy of another signed suite put in its place), nor drop a kernel from one.

Everything is read from git objects with size and depth bounds (a hostile history must not make the
gate read gigabytes or recurse forever); symlinks and submodules in the trusted tree are not followed.
The result travels to the pytest plugin as a JSON document (``schemas/trust-root.schema.json``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives import serialization

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.trust.approvals import LEDGER_NAME
from pytest_cudagate.boundary.yaml_rules import parse_yaml
from pytest_cudagate.config import Settings, cudagate_table, settings_from_table
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.suite.loader import SUITE_FILENAME
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust.keys import TRUSTED_KEYS_DIR, TrustedKeys, add_key, filter_by_allowed_ids, public_key_from_bytes
from pytest_cudagate.trust.ledger import BaseLedger, state_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FORMAT = 4  # 2: each suite with its name and kernels; 3: each ledger's state id; 4: the pull request
MAX_KEY_BLOB = 1 << 20
MAX_DEPTH = 32
MAX_TREE_ENTRIES = 500_000
MAX_KEYS = 256
MAX_SUITES = 1024  # suite files at the trusted commit, each parsed (within the boundary's YAML rules)
MAX_REF_CHARS = 256  # a sha, a tag or a branch name; gitpython's rev-parse walks whatever it is given
MAX_TRUST_ROOT_BYTES = 64 << 20
FETCH_BASE_FIX = "fetch the base commit first (actions/checkout with fetch-depth: 0)"
_BLOB_MODES = (0o100644, 0o100755)


def resolve_commit(repo, ref: str, what: str, fix: str = FETCH_BASE_FIX, error: type = CudagateError):
    """The commit a user-given ``ref`` names in ``repo``: every ref from a command line is resolved here.

    Anything git cannot resolve (an unknown name, too few parents, a reflog entry that is not there,
    a tree) is one ``error`` line naming ``what`` (the option) and the fix; a ref is bounded in length.
    """
    import git  # gitpython (~35 ms): only the commands that read git history resolve a ref

    shown = repr(ref) if len(ref) <= 60 else f"{ref[:40]!r}... ({len(ref)} characters)"
    where = f"{what} {shown}: not a commit of the repository at {repo.working_dir}"
    if not ref.strip():
        raise error(f"{where} (the ref is empty); pass a sha, a tag or a branch name")
    if len(ref) > MAX_REF_CHARS:
        raise error(f"{where} (longer than {MAX_REF_CHARS} characters); pass a sha, a tag or a branch name")
    try:
        commit = repo.commit(ref)
        commit.tree  # resolves the object now: an unknown sha fails here, not mid-read
    except (git.exc.GitError, git.exc.ODBError, ValueError, IndexError, KeyError, NotImplementedError, OSError) as exc:
        # gitpython's errors for a ref name: BadName, a ValueError (a tree, not a commit), IndexError
        # (HEAD@{N} past the reflog), KeyError (REF:path), NotImplementedError (@{date})
        raise error(f"{where} ({_reason(exc)}); {fix}") from None
    return commit


def _reason(exc: Exception) -> str:
    try:
        text = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - gitdb's BadObject cannot always format itself
        text = ""
    return text[:160] or type(exc).__name__


@dataclass(frozen=True)
class SuiteIdentity:
    """A suite file as the trusted commit has it: where, which suite and which kernels it gates."""

    path: str  # posix, from the repository root
    name: str | None  # its `suite:`; None when the file is no readable suite there (it judged nothing)
    kernels: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"path": self.path, "suite": self.name, "kernels": list(self.kernels)}


def suite_identity(text: str, path: str) -> SuiteIdentity:
    """The ``suite:`` name and kernel names of the suite file ``path``'s text, read within the
    boundary's YAML rules (bounded depth, no aliases); :class:`FileError` when it is not YAML."""
    raw = parse_yaml(text, path, "suite file")
    if not isinstance(raw, dict) or not isinstance(raw.get("suite"), str):
        return SuiteIdentity(path, None)
    kernels = raw.get("kernels") if isinstance(raw.get("kernels"), list) else []
    names = {k["name"] for k in kernels if isinstance(k, dict) and isinstance(k.get("name"), str)}
    return SuiteIdentity(path, raw["suite"], tuple(sorted(names)))


def _checkout_identity(path: Path, posix: str) -> SuiteIdentity | None:
    """The pull request's suite file at ``path``; None when it cannot be read: then it is a failed
    item of the run (if judged), or not judged at all, and there is no identity to compare."""
    try:
        return suite_identity(boundary.read_text(path, boundary.MAX_SUITE_BYTES, "suite file"), posix)
    except (OSError, CudagateError):
        return None


@dataclass
class TrustRoot:
    ref: str  # the commit's full sha
    worktree: Path  # the checkout whose suites are judged
    keys: TrustedKeys
    policy: dict = field(default_factory=dict)  # [tool.cudagate] at the ref
    ledgers: dict[str, BaseLedger] = field(default_factory=dict)  # suite folder (posix, from the root) -> ledger
    suites: tuple[SuiteIdentity, ...] = ()  # suite files at the ref, by path
    # The pull request gated (`cudagate gate --pull-request N`, from the workflow, never the checkout):
    # a signed state other than the base's counts only when signed for it. None: a push or a local run.
    pull_request: int | None = None

    def ledger(self, suite: Suite) -> BaseLedger | None:
        """``suite``'s ledger at the trusted ref; None when it had none there."""
        try:
            folder = suite.root.resolve().relative_to(self.worktree.resolve()).as_posix()
        except ValueError:
            return None
        return self.ledgers.get(folder)

    def settings(self) -> Settings:
        return settings_from_table(self.worktree, self.policy, f"pyproject.toml at {self.ref[:12]}")

    def suite_problems(self, found: list[Path]) -> list[str]:
        """What the checkout changed about the suites this ref gates: each must still be at its path,
        with its ``suite:`` name and every kernel. ``found``: the checkout's suite files the run judges
        (where a moved suite is looked for)."""
        short = self.ref[:12]
        # A link would let the gate judge another folder's files under a gated path: an older signed
        # copy whose ledger the trusted sequences never name (the ledger is looked up by real folder).
        linked = {self.worktree / base.path for base in self.suites} | {Path(os.path.abspath(f)) for f in found}
        problems = [f"{_posix(path, self.worktree) or path}: reached through the symbolic link {link}; under "
                    "--trusted-ref a suite is judged only at its real path (replace the link with the folder)"
                    for path in sorted(linked) if (link := _link_in(path, self.worktree))]
        moved: dict[str, str] | None = None  # suite name -> its file in the checkout, read once when needed
        for base in self.suites:
            path = self.worktree / base.path
            named = f"suite {base.name!r}" if base.name else "it"
            if _link_in(path, self.worktree):
                continue  # said above
            if not path.is_file():
                if moved is None:
                    moved = {}
                    for file in found:
                        ident = _checkout_identity(file, _posix(file, self.worktree) or str(file))
                        if ident is not None and ident.name is not None:
                            moved.setdefault(ident.name, ident.path)
                to = moved.get(base.name) if base.name else None
                problems.append(f"{base.path}: {f'moved to {to}' if to else 'deleted'} by this change; the trusted "
                                f"ref {short} gates {named} at {base.path} ({_maintainer('moves or removes a suite')})")
                continue
            ident = _checkout_identity(path, base.path)
            if base.name is None or ident is None or ident.name is None:
                continue  # it judged nothing at the ref, or the run fails it as a suite that does not load
            if ident.name != base.name:
                signed = next((s.path for s in self.suites if s.name == ident.name), None)
                problems.append(f"{base.path}: its suite name is {ident.name!r}"
                                + (f" (the signed suite of {signed})" if signed else "")
                                + f"; the trusted ref {short} gates {named} here ({_maintainer('moves or renames a suite')})")
                continue
            problems += [f"{base.path}: kernel {kernel!r} removed by this change; the trusted ref {short} gates it in "
                         f"{named} ({_maintainer('removes a kernel')})" for kernel in base.kernels
                         if kernel not in ident.kernels]
        return problems

    def collection_problems(self, gated: list[Path], collected: dict[Path, tuple[str, set[str]] | None]) -> list[str]:
        """Each suite this ref gates below the paths ``gated`` must have been collected with every kernel,
        whatever pytest skips on its own (a folder holding a pyvenv.cfg looks like a virtualenv to it).
        ``collected``: suite file -> (its suite name, the kernels with items), or None for a suite that
        failed to load (a failed item: the run fails)."""
        seen = {_posix(path, self.worktree): value for path, value in collected.items()}
        folders = [Path(os.path.normpath(path)) for path in gated]
        problems = []
        for base in self.suites:
            path = self.worktree / base.path
            if base.name is None or not any(path.is_relative_to(folder) for folder in folders):
                continue
            if base.path not in seen:
                problems.append(f"{base.path}: the trusted ref {self.ref[:12]} gates suite {base.name!r} here, but the "
                                "run collected none of its items (pytest skips a folder holding a pyvenv.cfg, for "
                                "one); remove what hides it")
            elif seen[base.path] is not None:
                name, kernels = seen[base.path]
                missing = [k for k in base.kernels if k not in kernels]
                if name != base.name or missing:
                    problems.append(f"{base.path}: the trusted ref {self.ref[:12]} gates suite {base.name!r} here with "
                                    f"kernels {', '.join(base.kernels)}; the run collected suite {name!r}"
                                    + (f" without {', '.join(missing)}" if missing else ""))
        return problems

    def to_json(self) -> dict:
        raw = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        return {"format": FORMAT, "ref": self.ref, "worktree": str(self.worktree), "policy": self.policy,
                "keys": {kid: {"pem": key.public_bytes(*raw).decode("ascii"), "sources": self.keys.sources.get(kid, [])}
                         for kid, key in sorted(self.keys.items())},
                "searched": self.keys.searched,
                "ledgers": {folder: {"sequence": ledger.sequence, "state": ledger.state}
                            for folder, ledger in sorted(self.ledgers.items())},
                "suites": [suite.to_json() for suite in self.suites], "pull_request": self.pull_request}

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> TrustRoot:
        path = Path(path)
        try:
            raw = boundary.load_json(path, MAX_TRUST_ROOT_BYTES, "trust root")
        except FileNotFoundError:
            raise FileError(path, ["cannot read the trust root: no such file"]) from None
        schema.validate(raw, "trust-root", path)
        keys = TrustedKeys()
        keys.searched = list(raw["searched"])
        for kid, entry in raw["keys"].items():
            for source in entry["sources"] or [f"trust root {kid}"]:
                add_key(keys, public_key_from_bytes(entry["pem"].encode("ascii"), path), source)
        suites = tuple(SuiteIdentity(s["path"], s["suite"], tuple(s["kernels"])) for s in raw["suites"])
        ledgers = {folder: BaseLedger(raw["ref"], entry["sequence"], entry["state"])
                   for folder, entry in raw["ledgers"].items()}
        return cls(raw["ref"], Path(raw["worktree"]), keys, raw["policy"], ledgers, suites, raw["pull_request"])


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


def _maintainer(does: str) -> str:
    return f"a maintainer {does} on the base branch"


def _link_in(path: Path, worktree: Path) -> str | None:
    """The first symbolic link on the way from ``worktree`` to ``path`` (``path`` itself included),
    as a path from the worktree; None when there is none or ``path`` lies outside it."""
    try:
        parts = Path(os.path.abspath(path)).relative_to(worktree).parts
    except ValueError:
        return None
    folder = worktree
    for part in parts:
        folder = folder / part
        if folder.is_symlink():
            return folder.relative_to(worktree).as_posix()
    return None


def _posix(path: Path, root: Path) -> str | None:
    try:
        return Path(os.path.normpath(path)).relative_to(root).as_posix()
    except ValueError:
        return None


def _policy(reader: _Reader, worktree: Path) -> dict:
    """``[tool.cudagate]`` at the ref, checked as every command checks it (a non-table is refused)."""
    data = reader.blob("pyproject.toml", boundary.MAX_SETTINGS_BYTES)
    if data is None:
        return {}
    where = reader.where("pyproject.toml")
    try:
        table = cudagate_table(tomllib.loads(data.decode("utf-8")), where)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise FileError(where, [f"cannot read [tool.cudagate]: {str(exc)[:200] or 'nested too deeply'}"]) from None
    settings_from_table(worktree, table, where)
    return table


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


def _base_ledger(reader: _Reader, path: str, item) -> BaseLedger:
    where = reader.where(path)
    try:
        raw = boundary.parse_json(reader.blob(path, boundary.MAX_LEDGER_BYTES, item).decode("utf-8"), where,
                                  "approvals ledger")
    except (ValueError, UnicodeDecodeError) as exc:
        raise FileError(where, [f"not valid JSON: {exc}"]) from None
    raw = raw if isinstance(raw, dict) else {}
    sequence = raw.get("sequence", 0)
    sequence = sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else 0
    return BaseLedger(reader.commit.hexsha, sequence, state_id(raw.get("signature")))


def _suite_identity(reader: _Reader, path: str, item) -> SuiteIdentity:
    try:
        return suite_identity(reader.blob(path, boundary.MAX_SUITE_BYTES, item).decode("utf-8"), path)
    except (UnicodeDecodeError, FileError):
        # no suite the loader reads (not YAML, over its size cap): it judged nothing at the ref, so
        # only its existence is kept (a test fixture may be broken on purpose)
        return SuiteIdentity(path, None)


def read_trust_root(worktree: Path, ref: str) -> TrustRoot:
    """The trust root at ``ref`` of the repository holding ``worktree``, from git objects only."""
    import git  # gitpython (~35 ms): only `cudagate gate --trusted-ref` reads a trust root from git

    try:
        repo = git.Repo(worktree, expand_vars=False)
    except git.exc.GitError:
        raise CudagateError(f"--trusted-ref: {worktree} is not a git repository; run the gate in the pull request's "
                            "checkout (--repo DIR)") from None
    commit = resolve_commit(repo, ref, "--trusted-ref")
    reader = _Reader(commit)
    policy = _policy(reader, Path(worktree))
    keys = TrustedKeys()
    keys.searched.append(f"{TRUSTED_KEYS_DIR.as_posix()}/*.pub at {reader.short}")
    if policy.get("trusted_keys"):
        keys.searched.append(f"[tool.cudagate] trusted_keys at {reader.short}")
    for path, item in _key_files(reader, policy):
        add_key(keys, public_key_from_bytes(reader.blob(path, MAX_KEY_BLOB, item), reader.where(path)),
                reader.where(path))
    filter_by_allowed_ids(keys)
    ledgers, suites = {}, []
    for path, item in reader.walk(commit.tree, PurePosixPath(".")):
        name = PurePosixPath(path)
        if name.name == LEDGER_NAME:
            ledgers[name.parent.as_posix()] = _base_ledger(reader, path, item)
        elif name.name == SUITE_FILENAME:
            if len(suites) == MAX_SUITES:
                raise CudagateError(f"the trusted commit {reader.short} has more than {MAX_SUITES} {SUITE_FILENAME} "
                                    "files; the gate does not read further")
            suites.append(_suite_identity(reader, path, item))
    return TrustRoot(commit.hexsha, Path(worktree).resolve(), keys, policy, ledgers,
                     tuple(sorted(suites, key=lambda s: s.path)))
