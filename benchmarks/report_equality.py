"""Whether two report.json files say the same thing, times apart. Prints a markdown table.

    python benchmarks/report_equality.py BEFORE/report.json AFTER/report.json [--json OUT.json]

For a change that must change no verdict (a refactor, a faster path): the same examples gated by the
code before and after, with one ``--cuda-gate-fresh-seed``, so every input, output and correctness
figure is the same. Every item is compared field by field, and so are the report's ``verdict`` and
``counts``. A difference is a **time** only where a time may differ, as the report's fields declare it
(``per_run`` in :mod:`pytest_cudagate.reports.model` and the objects it holds): anything under an
item's ``phases``, ``worker_s``, ``head_start_s``, ``samples_ms``, ``latency`` and ``library``
(measured latencies and their intervals, rounds, verdict words aside: a ``verdict`` field anywhere must
match), ``correctness.median_ms``, and the words of ``warning``, ``headline`` and ``message`` once every
number in them is masked (a run level's "+0.4%"); a measured field one side lacks (a time the older code did
not record, such as ``head_start_s``) counts as a time too. Everything else (a verdict, a status, a count of wrong
elements, a request field, a key one side lacks) is a **difference**, listed by item and path. The
run-folder names in request paths (``cudagate-run-<pid>-<random>``) and each report's own folder (the
``--cuda-gate-report`` directory before ``requests/`` in its reproduce commands) are masked first. Exit 1 when any
difference is found.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from evidence_header import with_header
from pytest_cudagate.boundary.wire import FIGURES, TIME, per_run_keys
from pytest_cudagate.reports.model import Report

RUN_FOLDER = re.compile(r"cudagate-run-\d+-\w+")
# the --cuda-gate-report folder of a reproduce command's request (shell-quoted where it holds a space)
REPORT_FOLDER = re.compile(r"(?:'[^'\n]*/|[^\s\"']*/)?requests/([^/\s\"']+\.json)'?")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
# What the report's own declarations say may differ between two runs (json_field's and derived's per_run).
PER_RUN = per_run_keys(Report)
TIMED = {key for key, how in PER_RUN.items() if how == TIME}  # measured: may differ
WORDED = {key for key, how in PER_RUN.items() if how == FIGURES}  # may quote a measured figure


def masked(text: str) -> str:
    return NUMBER.sub("#", RUN_FOLDER.sub("RUN", text))


def has_verdict(value) -> bool:
    if isinstance(value, dict):
        return "verdict" in value or any(has_verdict(v) for v in value.values())
    return isinstance(value, list) and any(has_verdict(v) for v in value)


def walk(before, after, path: str, times: list[str], differences: list[str], timed: bool = False) -> None:
    key = path.rsplit(".", 1)[-1]
    if isinstance(before, dict) and isinstance(after, dict):
        for name in sorted(set(before) | set(after)):
            where = f"{path}.{name}"
            if name not in before or name not in after:
                # a phase that took no time on one side, a time newly recorded; never a lost verdict
                if (timed or name in TIMED) and not has_verdict(before.get(name, after.get(name))):
                    times.append(where)
                else:
                    differences.append(f"{where}: only {'after' if name in after else 'before'}")
            else:
                walk(before[name], after[name], where, times, differences, timed or name in TIMED)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for n, (b, a) in enumerate(zip(before, after)):
            walk(b, a, f"{path}[{n}]", times, differences, timed)
    elif RUN_FOLDER.sub("RUN", json.dumps(before)) == RUN_FOLDER.sub("RUN", json.dumps(after)):
        return
    elif timed and key != "verdict":
        times.append(path)
    elif key in WORDED and isinstance(before, str) and isinstance(after, str) and masked(before) == masked(after):
        times.append(path)
    else:
        differences.append(f"{path}: {json.dumps(before)[:120]} before, {json.dumps(after)[:120]} after")


def read(path: Path) -> dict:
    """A report.json with its own folder masked where its reproduce commands name its requests (the two
    runs wrote to different folders)."""
    return masked_folders(json.loads(path.read_text()))


def masked_folders(value):
    if isinstance(value, str):
        return REPORT_FOLDER.sub(r"<report>/requests/\1", value)
    if isinstance(value, dict):
        return {k: masked_folders(v) for k, v in value.items()}
    return [masked_folders(v) for v in value] if isinstance(value, list) else value


def compare(before: dict, after: dict) -> tuple[list[tuple[str, str]], list[str]]:
    items_before = {i["nodeid"]: i for i in before["items"]}
    items_after = {i["nodeid"]: i for i in after["items"]}
    times: list[str] = []
    differences = [f"{n}: only {'after' if n in items_after else 'before'}"
                   for n in sorted(set(items_before) ^ set(items_after))]
    for field in ("verdict", "counts"):
        walk(before.get(field), after.get(field), field, times, differences)
    for nodeid in sorted(set(items_before) & set(items_after)):
        walk(items_before[nodeid], items_after[nodeid], nodeid, times, differences)
    rows = [("items, before / after", f"{len(items_before)} / {len(items_after)}"),
            ("fields that differ only as times", str(len(times))),
            ("differences", str(len(differences))),
            ("cases_busy, after", json.dumps(after["runs"][-1].get("cases_busy")))]
    return rows, differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--json", type=Path, help="also write the table and the differences here")
    args = parser.parse_args()
    before, after = (read(p) for p in (args.before, args.after))
    rows, differences = compare(before, after)
    print("| | |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")
    for line in differences:
        print(f"- {line}")
    if args.json:
        args.json.write_text(json.dumps(with_header({"rows": rows, "differences": differences}, __file__), indent=1) + "\n")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
