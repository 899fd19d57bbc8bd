"""The header every benchmark's ``--json`` output carries: how, on what code and card, and when it ran.

    {"evidence": {"command": "python benchmarks/x.py --json out.json", "commit": "<sha>", "dirty": false,
                  "card": "NVIDIA H200 GPU-…, driver 580.159.04", "date": "2026-12-03T10:00:00Z",
                  "script": "benchmarks/x.py"}}

``benchmarks/tables.py`` renders each table's command, commit, card and date from it. The commit is git's
HEAD in the repository root, unless ``$CUDAGATE_EVIDENCE_COMMIT`` names one: a copy of the tree whose
``.git`` is absent or not its own (a GPU machine's copy) is then said to be that commit, ``dirty`` where
git can compare the tree with it, else unknown (null). A file without the header is older evidence:
its commit was not recorded, and nothing here guesses it.
"""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMIT_ENV = "CUDAGATE_EVIDENCE_COMMIT"
KEYS = ("command", "commit", "dirty", "card", "date", "script")


@dataclass(frozen=True)
class Header:
    command: str
    commit: str | None  # None: not recorded
    dirty: bool | None  # None: not known (no git)
    card: str
    date: str  # ISO 8601, UTC
    script: str  # relative to the repository root

    def to_json(self) -> dict:
        return {"evidence": asdict(self)}


def _git(*args: str) -> tuple[int, str]:
    """(exit code, stdout) of git in the repository root; -1 where git cannot run."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return -1, ""
    return done.returncode, done.stdout


def commit_state() -> tuple[str | None, bool | None]:
    """(the commit, whether tracked files differ from it); untracked files (new evidence) do not count."""
    named = os.environ.get(COMMIT_ENV, "").strip()
    if named:
        code, _ = _git("diff", "--quiet", named, "--")  # 0: same, 1: differs, else git does not know it
        return named, {0: False, 1: True}.get(code)
    code, sha = _git("rev-parse", "HEAD")
    if code != 0:
        return None, None
    code, status = _git("status", "--porcelain", "--untracked-files=no")
    return sha.strip(), bool(status.strip()) if code == 0 else None


def smi_card() -> str:
    """Every card nvidia-smi lists: ``NVIDIA H200 GPU-…, driver 580.159.04``, joined by ``; ``."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU seen (nvidia-smi not found)"
    if done.returncode != 0 or not done.stdout.strip():
        return "no GPU seen (nvidia-smi failed)"
    cards = []
    for line in done.stdout.strip().splitlines():
        name, uuid, driver = (part.strip() for part in line.split(",", 2))
        cards.append(f"{name} {uuid}, driver {driver}")
    return "; ".join(cards)


def header(script: str | Path, argv: list[str] | None = None, card: str | None = None) -> Header:
    """The header of one run of ``script`` (its ``__file__``) with ``argv`` (default: ``sys.argv[1:]``).

    ``card``: the script's own words for the card it timed on (from its worker or NVML), else nvidia-smi's.
    """
    path = Path(script).resolve()
    try:
        shown = path.relative_to(ROOT).as_posix()
    except ValueError:
        shown = path.as_posix()
    argv = sys.argv[1:] if argv is None else argv
    sha, dirty = commit_state()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Header(" ".join(["python", shown, *map(shlex.quote, argv)]), sha, dirty, card or smi_card(), now, shown)


def with_header(document: dict, script: str | Path, argv: list[str] | None = None, card: str | None = None) -> dict:
    """``document`` with the header as its first key."""
    return {**header(script, argv, card).to_json(), **document}


def read_header(document: object) -> Header | None:
    """The header of a kept file, or None for older evidence written before the header existed."""
    raw = document.get("evidence") if isinstance(document, dict) else None
    if not isinstance(raw, dict):
        return None
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise ValueError(f"evidence header lacks {', '.join(missing)}: write the file with "
                         "benchmarks/evidence_header.py's with_header()")
    return Header(**{k: raw[k] for k in KEYS})
