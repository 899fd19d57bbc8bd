"""``--proposer replay:DIR``: recorded proposals, one round per file, for tests and audits.

DIR holds either

- proposal files, replayed in name order, one round each: ``{"label": .., "notes": ..,
  "source_file": "x.cu" (relative to the file) or "source": "..", "launch": {grid, block,
  shared_bytes}, "launch_overrides": {CASE: launch}, "defines": {NAME: int}, "classes": {CLASS:
  {"options": ["-DNAME=value"], "launch": launch}}}`` (per-class variants, as in the suite), or
  ``{"proposals": [..]}`` for several candidates in one round; or
- an audit pack (``history.json``): its attempts of rounds 1 and later, round by round, exactly as
  they were compiled, class variants included (an audit re-runs a search on other hardware, or
  after a gate change).
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, load_json, read_text
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.optimize.candidate import Candidate, CandidateError, classes_from_json, launch_from_json
from pytest_cudagate.optimize.proposers import ProposerExhausted, RoundContext
from pytest_cudagate.boundary.schema import validate

MAX_PROPOSAL_BYTES = 2 * MAX_SOURCE_BYTES  # a source given inline, with its launch and notes
MAX_HISTORY_BYTES = 64 * 1024 * 1024  # every attempt of a run, each with its source
PROPOSAL_KEYS = ("label", "notes", "source_file", "source", "launch", "launch_overrides", "defines", "classes")
DEFINE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # a define becomes a `#define NAME value` line
DEFINE_BOUND = 2**63  # what a 64-bit integer holds


def _kind(value) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _text_field(raw: dict, key: str, path: Path, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise FileError(path, [f"{where}{key}: expected a string, got {_kind(value)}"])
    return value


def _defines(raw, path: Path, where: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise FileError(path, [f"{where}defines: expected an object of NAME: integer, got {_kind(raw)}"])
    for name, value in raw.items():
        if not DEFINE_NAME.fullmatch(name):
            raise FileError(path, [f"{where}defines: {name[:80]!r} is not a C macro name; use letters, digits "
                                   "and underscores"])
        if isinstance(value, bool) or not isinstance(value, int) or not -DEFINE_BOUND <= value < DEFINE_BOUND:
            raise FileError(path, [f"{where}defines.{name}: expected an integer of 64 bits, got {_kind(value)}"])
    return dict(raw)


def _candidate(raw: dict, base: Path, label: str, path: Path, where: str = "") -> Candidate:
    """One proposal (``raw``, at ``where`` in the file ``path``), its types checked field by field."""
    source_file = _text_field(raw, "source_file", path, where)
    source = _text_field(raw, "source", path, where)
    if source_file is not None:
        resolved = (base / source_file).resolve()
        if base.resolve() not in resolved.parents:
            raise FileError(path, [f"{where}source_file: {source_file!r} lies outside the replay folder {base}"])
        try:
            source = read_text(resolved, MAX_SOURCE_BYTES, "source file")
        except FileNotFoundError:
            raise FileError(path, [f"{where}source_file: {source_file!r} not found next to it"]) from None
    elif source is None:
        raise FileError(path, [f"{where.rstrip('.') or 'the proposal'}: needs source or source_file"])
    overrides = raw.get("launch_overrides") or {}
    if not isinstance(overrides, dict):
        raise FileError(path, [f"{where}launch_overrides: expected an object of CASE: launch, got {_kind(overrides)}"])
    try:
        launch = launch_from_json(raw.get("launch") or {}, "launch")
        overrides = {case: launch_from_json(l, f"launch_overrides[{case}]") for case, l in overrides.items()}
        classes = classes_from_json(raw.get("classes") or {})
    except CandidateError as exc:
        raise FileError(path, [f"{where}{exc}"]) from None
    return Candidate(source=source, launch=launch, launch_overrides=overrides,
                     defines=_defines(raw.get("defines") or {}, path, where), origin="replay",
                     label=_text_field(raw, "label", path, where) or label,
                     notes=_text_field(raw, "notes", path, where) or "", classes=classes)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are unique: a proposal naming one class twice says two things."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"key {key[:80]!r} appears twice in one object; give it once")
        seen.add(key)
    return dict(pairs)


def _load(path: Path, limit: int, what: str, **rules):
    """:func:`load_json`, a missing file (a link to nothing: the folder was listed) said as such."""
    try:
        return load_json(path, limit, what, **rules)
    except FileNotFoundError:
        raise FileError(path, [f"cannot read the {what}: it is a link to nothing; replace it with the file"]) from None


def _history_rounds(history: Path, folder: Path) -> list[list[Candidate]]:
    """An audit pack's attempts of rounds 1 and later, round by round, as they were compiled."""
    raw = _load(history, MAX_HISTORY_BYTES, "audit pack history")
    validate(raw, "optimize-history", history)
    rounds: dict[int, list[Candidate]] = {}
    for index, attempt in enumerate(raw["attempts"]):
        cand = attempt["candidate"]
        if attempt["round"] < 1 or not cand or not cand["source"]:
            continue
        cand = {**cand, "defines": {}}  # the recorded source already carries them as #define lines
        where = f"attempts[{index}].candidate."
        rebuilt = _candidate(cand, folder, cand.get("label") or f"attempt {attempt['attempt']}", history, where)
        if cand.get("source_sha256") and rebuilt.sha256 != cand["source_sha256"]:
            raise FileError(history, [f"attempt {attempt['attempt']}: its source does not match its recorded "
                                      f"source_sha256 ({where}source); the pack was edited, replay an unedited one"])
        rounds.setdefault(attempt["round"], []).append(rebuilt)
    if not rounds:
        raise FileError(history, ["attempts: none of round 1 or later has a source, so there is nothing to replay; "
                                  "name the pack of a run that searched"])
    return [rounds[r] for r in sorted(rounds)]


def _proposal_round(path: Path) -> list[Candidate]:
    """One proposal file: a proposal, or ``{"proposals": [...]}`` for several in one round."""
    raw = _load(path, MAX_PROPOSAL_BYTES, "proposal file", pairs_hook=_unique_keys)
    if isinstance(raw, dict) and "proposals" in raw:
        entries, prefix = raw["proposals"], "proposals"
        if not isinstance(entries, list):
            raise FileError(path, [f"proposals: expected a list of proposals, got {_kind(entries)}"])
    elif isinstance(raw, list):
        entries, prefix = raw, ""
    else:
        entries, prefix = [raw], None
    if not entries:
        raise FileError(path, [f"{prefix or '(top level)'}: an empty list; give at least one proposal"])
    found = []
    for i, entry in enumerate(entries):
        where = f"{prefix}[{i}]." if prefix is not None else ""
        if not isinstance(entry, dict):
            raise FileError(path, [f"{where.rstrip('.') or '(top level)'}: expected an object (a proposal), "
                                   f"got {_kind(entry)}"])
        unknown = sorted(set(entry) - set(PROPOSAL_KEYS))
        if unknown:
            raise FileError(path, [f"{where}{unknown[0]}: not a key of a proposal; allowed keys: "
                                   f"{', '.join(PROPOSAL_KEYS)}"])
        found.append(_candidate(entry, path.parent, f"{path.stem}[{i}]" if len(entries) > 1 else path.stem, path, where))
    return found


def load_rounds(folder: Path) -> list[list[Candidate]]:
    folder = Path(folder)
    if not folder.is_dir():
        raise CudagateError(f"replay folder {folder} does not exist")
    history = folder / "history.json"
    if history.exists() or history.is_symlink():
        return _history_rounds(history, folder)
    files = sorted(p for p in folder.glob("*.json") if not p.is_dir())
    if not files:
        raise CudagateError(f"replay folder {folder} holds no proposal files (*.json) and no history.json")
    return [_proposal_round(path) for path in files]


class ReplayProposer:
    name = "replay"
    supports_repair = False

    def __init__(self, folder: str, **_ignored):
        self.folder = Path(folder)
        self.rounds = load_rounds(self.folder)
        self.next = 0

    def describe(self) -> dict:
        return {"folder": str(self.folder), "rounds": len(self.rounds)}

    def propose(self, context: RoundContext) -> list[Candidate]:
        if self.next >= len(self.rounds):
            raise ProposerExhausted(f"all {len(self.rounds)} recorded round(s) of {self.folder} were replayed")
        self.next += 1
        return self.rounds[self.next - 1]

    def close(self) -> None:
        pass
