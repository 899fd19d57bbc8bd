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

import json
from pathlib import Path

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.optimize.candidate import Candidate, CandidateError, classes_from_json, launch_from_json
from pytest_cudagate.optimize.proposers import ProposerExhausted, RoundContext


def _candidate(raw: dict, base: Path, label: str) -> Candidate:
    if "source_file" in raw:
        path = (base / raw["source_file"]).resolve()
        if base.resolve() not in path.parents:
            raise CudagateError(f"{base}: source_file {raw['source_file']!r} lies outside the replay folder")
        source = path.read_text(encoding="utf-8")
    elif "source" in raw:
        source = raw["source"]
    else:
        raise CudagateError(f"{base / label}: a proposal needs source or source_file")
    try:
        launch = launch_from_json(raw.get("launch") or {}, "launch")
        overrides = {case: launch_from_json(l, f"launch_overrides[{case}]")
                     for case, l in (raw.get("launch_overrides") or {}).items()}
        classes = classes_from_json(raw.get("classes") or {})
    except CandidateError as exc:
        raise CudagateError(f"{base / label}: {exc}") from None
    defines = {str(k): int(v) for k, v in (raw.get("defines") or {}).items()}
    return Candidate(source=source, launch=launch, launch_overrides=overrides, defines=defines, origin="replay",
                     label=raw.get("label") or label, notes=raw.get("notes", ""), classes=classes)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are unique: a proposal naming one class twice says two things."""
    keys = [k for k, _ in pairs]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        raise ValueError(f"key {twice!r} appears twice in one object; give it once")
    return dict(pairs)


def load_rounds(folder: Path) -> list[list[Candidate]]:
    folder = Path(folder)
    if not folder.is_dir():
        raise CudagateError(f"replay folder {folder} does not exist")
    history = folder / "history.json"
    if history.is_file():
        raw = json.loads(history.read_text(encoding="utf-8"))
        rounds: dict[int, list[Candidate]] = {}
        for attempt in raw.get("attempts", []):
            if attempt.get("round", 0) < 1 or not attempt.get("candidate", {}).get("source"):
                continue
            cand = dict(attempt["candidate"])
            cand["defines"] = {}  # the recorded source already carries them as #define lines
            label = cand.get("label") or f"attempt {attempt.get('attempt')}"
            rebuilt = _candidate(cand, folder, label)
            if cand.get("source_sha256") and rebuilt.sha256 != cand["source_sha256"]:
                raise CudagateError(f"{history}: attempt {attempt.get('attempt')}: its source does not match its "
                                    "recorded source_sha256; the pack was edited, replay an unedited one")
            rounds.setdefault(attempt["round"], []).append(rebuilt)
        return [rounds[r] for r in sorted(rounds)]
    files = sorted(p for p in folder.glob("*.json") if p.is_file())
    if not files:
        raise CudagateError(f"replay folder {folder} holds no proposal files (*.json) and no history.json")
    rounds_list = []
    for path in files:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
        except ValueError as exc:
            raise CudagateError(f"{path}: not JSON: {exc}") from None
        entries = raw.get("proposals", [raw]) if isinstance(raw, dict) else raw
        rounds_list.append([_candidate(e, path.parent, f"{path.stem}[{i}]" if len(entries) > 1 else path.stem)
                            for i, e in enumerate(entries)])
    return rounds_list


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
