"""How many launches a kernel timed alone needs for its run level. Prints a markdown table.

    python benchmarks/run_level_rounds.py [LEDGER ...] [--json OUT.json]  # default: examples/*/cudagate.approvals.json

A kernel identical to its approval is judged by its run level (the 10th percentile of its launches,
``stats.run_level``) against the levels of the approval runs, with their spread floored at the
between-card spread (``stats.RUN_SPREAD_FLOOR``). The ledgers keep one approval run's launches per
case (GPU data, recorded by ``cudagate approve`` on an H200). This script takes the level from the
first and from the last N launches of that run and prints how far each lands from the level of all
of them, beside the spread of the approval runs' levels and the floor: a run of N launches is long
enough when that offset is small against both. The last two columns apply the gate's own stopping
rule for a kernel timed alone (``cudagate_harness.stopping.next_rounds`` with the settle rule of
``pytest_cudagate.gate.baseline_timing`` for the ledger's suite) to the stored launches in their
order: how many it times, and how far the level of those lands from the level of all of them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from evidence_header import with_header  # noqa: E402

from cudagate_harness.stopping import Settle, next_rounds  # noqa: E402
from pytest_cudagate.gate import baseline_timing  # noqa: E402
from pytest_cudagate.suite.loader import load_suite  # noqa: E402
from pytest_cudagate.judge import stats  # noqa: E402

COUNTS = (100, 200, 300, 500)


def settled_count(samples: np.ndarray, timing: dict) -> int:
    """How many of the stored launches, in order, the stopping rule of a kernel timed alone with
    ``timing`` (:func:`baseline_timing`) times, a block at a time."""
    rule, rounds = Settle.from_json(timing["settle"]), int(timing["repeat"])
    done: list[float] = []
    while todo := next_rounds(rule, rounds, [done], lambda kept: kept[0]):
        done = list(samples[:len(done) + todo])
    return len(done)


def rows(ledger: Path) -> list[tuple[str, int, dict[int, float], float, int, float]]:
    """(kernel::case, launches stored, {N: worst offset of a first/last-N level, %}, run spread %,
    launches the stopping rule times, offset of their level %)."""
    found = []
    timing = baseline_timing(load_suite(ledger.parent / "cudagate.yaml"))
    for approval in json.loads(ledger.read_text()).get("approvals", {}).values():
        for baseline in (approval.get("baselines") or {}).values():
            for case, entry in baseline.get("cases", {}).items():
                samples = np.asarray(entry.get("samples_ms") or [], dtype=float)
                runs = entry.get("run_p10_ms") or []
                if samples.size < max(COUNTS) or len(runs) < 2:
                    continue
                level = stats.run_level(samples)
                worst = {n: 100 * max(abs(stats.run_level(part) / level - 1) for part in (samples[:n], samples[-n:]))
                         for n in COUNTS}
                spread = 100 * math.expm1(float(np.std(np.log(runs), ddof=1)))
                ruled = settled_count(samples, timing)
                found.append((f"{approval.get('kernel', '?')}::{case}", int(samples.size), worst, spread, ruled,
                              100 * abs(stats.run_level(samples[:ruled]) / level - 1)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledgers", nargs="*", type=Path,
                        default=sorted((ROOT / "examples").glob("*/cudagate.approvals.json")))
    parser.add_argument("--json", type=Path, help="also write the rows here (schemas/run-level-rounds.schema.json)")
    args = parser.parse_args()
    table = [row for ledger in args.ledgers for row in rows(ledger)]
    if not table:
        print("no baseline with stored launches and approval runs in " + ", ".join(map(str, args.ledgers)))
        return 1
    floor = 100 * math.expm1(stats.RUN_SPREAD_FLOOR)
    print(f"Level = 10th percentile. Offset: the larger of |level(first N) / level(all) - 1| and the same for the "
          f"last N launches, %. Spread: standard deviation of ln(level) over the approval runs, %; the gate "
          f"floors it at {floor:.1f}% (RUN_SPREAD_FLOOR).\n")
    print("| case | launches | " + " | ".join(f"offset, N={n}" for n in COUNTS)
          + " | spread of the approval runs | stopping rule: launches | stopping rule: offset |")
    print("|---|---|" + "---|" * len(COUNTS) + "---|---|---|")
    for name, count, worst, spread, ruled, offset in table:
        print(f"| {name} | {count} | " + " | ".join(f"{worst[n]:.2f}" for n in COUNTS)
              + f" | {spread:.2f} | {ruled} | {offset:.2f} |")
    print("| **worst** | | " + " | ".join(f"**{max(r[2][n] for r in table):.2f}**" for n in COUNTS)
          + f" | {max(r[3] for r in table):.2f} | | **{max(r[5] for r in table):.2f}** |")
    if args.json:
        # Ledgers hold GPU data; this script only reads them, so the cards named are the ledgers' own.
        cards = sorted({b.get("fingerprint", {}).get("uuid", "?") for ledger in args.ledgers
                        for a in json.loads(ledger.read_text()).get("approvals", {}).values()
                        for b in (a.get("baselines") or {}).values()})
        document = {"ledgers": [str(p.resolve().relative_to(ROOT) if p.resolve().is_relative_to(ROOT) else p)
                                for p in args.ledgers],
                    "floor_pct": floor, "counts": list(COUNTS),
                    "rows": [{"case": name, "launches": count, "offset_pct": {str(n): worst[n] for n in COUNTS},
                              "spread_pct": spread, "ruled_launches": ruled, "ruled_offset_pct": offset}
                             for name, count, worst, spread, ruled, offset in table]}
        card = "read on CPU from ledgers recorded on " + ", ".join(cards)
        args.json.write_text(json.dumps(with_header(document, __file__, card=card), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
