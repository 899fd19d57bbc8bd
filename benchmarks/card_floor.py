"""The between-card floor of a stored baseline: how far an unchanged kernel's run level moves between cards.

    python benchmarks/card_floor.py measure --json OUT.json [--examples matmul,softmax] [--runs 5] [--each-gpu]
    python benchmarks/card_floor.py derive FILE... [--json OUT.json]     # CPU: the floor, and a markdown table

``measure`` (a GPU): approves each example's kernels with ``cudagate approve --runs N`` in a scratch
copy (held timing, as every approval), and keeps per (kernel, case) the N run levels (10th percentiles,
``stats.run_level``) with the card's uuid, name and driver from the worker's fingerprint, and whether
launches were held. The file is rewritten after each example, so a run cut short keeps what it timed.
``--each-gpu`` repeats it on every card nvidia-smi lists, each pinned by uuid.
Files: schemas/card-floor.schema.json.

``derive``: over files from different cards (``measure`` outputs, or ledgers such as
examples/*/cudagate.approvals.json, whose baselines keep their approval runs' levels), for every
(kernel, case) timed on two cards the same way (held or not), takes one card's runs as the approval and
each run of the other as today's: offset = today's level / geometric mean of the approval's levels - 1,
as ``stats.run_spread`` forms it. The floor is the widest |offset| (as ln, back to a ratio);
``stats._BETWEEN_CARD_OFFSET`` must be at least that. Exits 1 when no (kernel, case) was timed on two
cards.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from itertools import permutations
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from evidence_header import header, read_header  # noqa: E402
from pytest_cudagate.judge import stats  # noqa: E402

EXAMPLES = ("matmul", "softmax", "fir", "rmsnorm", "split_reduce")


class UsageError(Exception):
    """Bad input: one line, exit code 2."""


@dataclass(frozen=True)
class Levels:
    """One (kernel, case)'s approval runs on one card in one session."""

    suite: str
    kernel: str
    case: str
    card: str  # uuid
    gpu_name: str
    driver: str
    held: bool
    session: str
    run_levels_ms: list[float]

    @property
    def key(self) -> tuple[str, str, bool]:
        return (self.kernel, self.case, self.held)


@dataclass(frozen=True)
class Offset:
    kernel: str
    case: str
    held: bool
    cards: int
    low: float  # most negative offset, a ratio - 1
    high: float
    approval_card: str  # the pair that gave the widest |offset|
    today_card: str


# -- reading ---------------------------------------------------------------------------------------

def ledger_levels(document: dict, suite: str, session: str) -> list[Levels]:
    """Every baseline's approval runs in a ledger (``cudagate.approvals.json``)."""
    found = []
    for approval in document.get("approvals", {}).values():
        for baseline in (approval.get("baselines") or {}).values():
            card = baseline.get("fingerprint") or {}
            for case, entry in (baseline.get("cases") or {}).items():
                runs = entry.get("run_p10_ms") or []
                if len(runs) >= 2:
                    found.append(Levels(suite, approval.get("kernel", "?"), case, str(card.get("uuid", "")),
                                        str(card.get("gpu_name", "")), str(card.get("driver_version", "")),
                                        bool(card.get("timing_hold", False)),
                                        f"{session} {baseline.get('measured_at', '')}".strip(),
                                        [float(r) for r in runs]))
    return found


def load(path: Path) -> list[Levels]:
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror}): pass card_floor.py measure outputs or ledgers")
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc}): pass card_floor.py measure outputs or ledgers") from None
    if isinstance(document, dict) and "approvals" in document:
        return ledger_levels(document, path.parent.name, str(path))
    if not isinstance(document, dict) or not isinstance(document.get("levels"), list):
        raise UsageError(f"{path}: field 'levels' missing: pass files written by card_floor.py measure --json, "
                         "or cudagate.approvals.json ledgers")
    from pytest_cudagate.boundary import schema

    found = schema.problems(document, "card-floor")
    if found:
        raise UsageError(f"{path}: {found[0]} (schemas/card-floor.schema.json): rewrite it with card_floor.py measure")
    return [Levels(**entry) for entry in document["levels"]]


# -- deriving --------------------------------------------------------------------------------------

def offsets(levels: list[Levels]) -> list[Offset]:
    """Per (kernel, case, held) timed on two or more cards: the widest offsets of one card's run from
    another card's approval runs."""
    groups: dict[tuple[str, str, bool], dict[str, list[float]]] = {}
    for entry in levels:
        # Runs of one card from several sessions are pooled: the floor is about cards, not sessions.
        groups.setdefault(entry.key, {}).setdefault(entry.card, []).extend(entry.run_levels_ms)
    found = []
    for (kernel, case, held), cards in sorted(groups.items()):
        if len(cards) < 2:
            continue
        widest, low, high = -1.0, math.inf, -math.inf
        pair = ("", "")
        for approval, today in permutations(sorted(cards), 2):
            centre = sum(map(math.log, cards[approval])) / len(cards[approval])
            for level in cards[today]:
                d = math.log(level) - centre
                low, high = min(low, d), max(high, d)
                if abs(d) > widest:
                    widest, pair = abs(d), (approval, today)
        found.append(Offset(kernel, case, held, len(cards), math.expm1(low), math.expm1(high), *pair))
    return found


def floor_of(found: list[Offset]) -> float:
    """The widest |offset| as a ratio - 1 (a -8% offset counts as ln(0.92), wider than +8%)."""
    return math.expm1(max(max(-math.log1p(o.low), math.log1p(o.high)) for o in found))


def table(found: list[Offset]) -> str:
    rows = ["| kernel | case | held | cards | lowest offset | highest offset | widest: approval card → today's |",
            "|---|---|---|---|---|---|---|"]
    for o in found:
        rows.append(f"| {o.kernel} | {o.case} | {'yes' if o.held else 'no'} | {o.cards} | {100 * o.low:+.2f} % "
                    f"| {100 * o.high:+.2f} % | {o.approval_card} → {o.today_card} |")
    return "\n".join(rows)


def derive(args) -> int:
    levels = [entry for path in args.files for entry in load(path)]
    found = offsets(levels)
    if not found:
        cards = sorted({e.card for e in levels})
        print(f"no (kernel, case) timed on two cards the same way in {len(args.files)} file(s) "
              f"({len(levels)} sets of runs, cards: {', '.join(cards) or 'none'})", file=sys.stderr)
        return 1
    floor = floor_of(found)
    print(table(found))
    print(f"\nfloor: ±{100 * floor:.2f} % (shipped: ±{100 * stats._BETWEEN_CARD_OFFSET:.1f} %, "
          f"_BETWEEN_CARD_OFFSET in pytest_cudagate/judge/stats.py)")
    if args.json:
        sources = []
        for path in args.files:
            try:
                kept = read_header(json.loads(path.read_text()))
            except ValueError:
                kept = None
            sources.append({"path": str(path), "commit": kept.commit if kept else None})
        document = {**header(__file__, card="derived on CPU from the files' cards").to_json(),
                    "floor": floor, "shipped": stats._BETWEEN_CARD_OFFSET, "sources": sources,
                    "offsets": [asdict(o) for o in found]}
        args.json.write_text(json.dumps(document, indent=1))
    return 0


# -- measuring -------------------------------------------------------------------------------------

def smi_uuids() -> list[str]:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def approve_copy(name: str, work: Path, runs: int, env: dict[str, str]) -> list[Levels]:
    """``cudagate approve --runs N`` of a scratch copy of examples/NAME; its ledger's run levels."""
    root = work / name
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ROOT / "examples" / name, root, ignore=shutil.ignore_patterns(
        "approved", "proposals", "cudagate.approvals.json", "cudagate.sig.json", "__pycache__"))
    raw = yaml.safe_load((root / "cudagate.yaml").read_text())
    raw["checks"] = {**(raw.get("checks") or {}), "sanitizer": "off"}  # says nothing about latency
    (root / "cudagate.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False))
    print(f"card_floor: approving examples/{name}, {runs} runs{' on ' + env['CUDA_VISIBLE_DEVICES'] if env else ''}",
          file=sys.stderr, flush=True)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest_cudagate.cli", "approve", str(root / "cudagate.yaml"),
                               "--approved-by", "card-floor", "--runs", str(runs)],
                              cwd=root, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, text = "timed out after 1800 s", ""
    print(text, file=sys.stderr, flush=True)
    if code != 0:
        print(f"card_floor: cudagate approve of examples/{name}: exit {code} (its output above); "
              "the file keeps the other examples", file=sys.stderr)
        return []
    session = f"{platform.node()}-{os.getpid()}"
    return ledger_levels(json.loads((root / "cudagate.approvals.json").read_text()), name, session)


def measure(args) -> int:
    names = args.examples
    unknown = [n for n in names if not (ROOT / "examples" / n / "cudagate.yaml").is_file()]
    if unknown:
        raise UsageError(f"--examples: no examples/{unknown[0]}/cudagate.yaml; choose from {', '.join(EXAMPLES)}")
    pins = [{"CUDA_VISIBLE_DEVICES": uuid} for uuid in smi_uuids()] if args.each_gpu else [{}]
    if not pins:
        raise UsageError("--each-gpu: nvidia-smi lists no card")
    levels: list[Levels] = []
    failed = 0
    with tempfile.TemporaryDirectory(prefix="cudagate-card-floor-") as tmp:
        for env in pins:
            for name in names:
                timed = approve_copy(name, Path(tmp), args.runs, env)
                failed += not timed
                levels += timed
                cards = sorted({f"{e.gpu_name} {e.card}, driver {e.driver}" for e in levels})
                document = {**header(__file__, card="; ".join(cards) or None).to_json(),
                            "levels": [asdict(e) for e in levels]}
                args.json.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.json}: {len(levels)} (kernel, case) sets of {args.runs} runs; "
          f"{failed} approval(s) failed", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="approve the examples on this GPU and keep their run levels")
    m.add_argument("--json", type=Path, required=True)
    m.add_argument("--examples", type=lambda s: [n for n in s.split(",") if n], default=list(EXAMPLES),
                   metavar="NAME,...")
    m.add_argument("--runs", type=int, default=stats.DEFAULT_APPROVAL_RUNS)
    m.add_argument("--each-gpu", action="store_true", help="repeat on every card nvidia-smi lists")
    d = sub.add_parser("derive", help="the floor over files from several cards (CPU)")
    d.add_argument("files", type=Path, nargs="+")
    d.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "measure":
            if args.runs < 2:
                raise UsageError(f"--runs {args.runs}: a card's spread needs at least 2 runs")
            return measure(args)
        return derive(args)
    except UsageError as exc:
        print(f"card_floor: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
