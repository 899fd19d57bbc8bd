"""Whether two report.json files say the same thing, times apart. Prints a markdown table.

    python benchmarks/report_equality.py BEFORE/report.json AFTER/report.json [--json OUT.json]

For a change that must change no verdict (a refactor, a faster path): the same examples gated by the
code before and after, with one ``--cuda-gate-fresh-seed``. Every item is compared field by field.
A difference is a **time** when both values are numbers, or strings equal once every number in them
is masked (a run level's "+0.4%", a duration); the per-item ``phases``, ``worker_s`` and ``head_start_s`` and the
run's ``runs`` (dates, phases, ``cases_busy``) are times too. Anything else (a verdict, a status, a
request field, a key one side lacks) is a **difference**, listed by item and path. The run-folder
names in request paths (``cudagate-run-<pid>-<random>``) are masked first. Exit 1 when any
difference is found.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from evidence_header import with_header

RUN_FOLDER = re.compile(r"cudagate-run-\d+-\w+")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
TIMES = {"phases", "worker_s", "head_start_s"}  # per item: wall-clock splits


def masked(text: str) -> str:
    return NUMBER.sub("#", RUN_FOLDER.sub("RUN", text))


def walk(before, after, path: str, times: list[str], differences: list[str]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            where = f"{path}.{key}"
            if key not in before or key not in after:
                differences.append(f"{where}: only {'after' if key in after else 'before'}")
            elif key in TIMES:
                times.append(where)
            else:
                walk(before[key], after[key], where, times, differences)
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            # sample lists are times: their length is where an adaptive stop fell
            if all(isinstance(v, (int, float)) for v in before + after):
                times.append(path)
            else:
                differences.append(f"{path}: {len(before)} entries before, {len(after)} after")
            return
        for n, (b, a) in enumerate(zip(before, after)):
            walk(b, a, f"{path}[{n}]", times, differences)
    elif before == after:
        return
    elif isinstance(before, (int, float)) and isinstance(after, (int, float)) and not isinstance(before, bool):
        times.append(path)
    elif isinstance(before, str) and isinstance(after, str) and masked(before) == masked(after):
        if RUN_FOLDER.sub("RUN", before) != RUN_FOLDER.sub("RUN", after):
            times.append(path)
    else:
        differences.append(f"{path}: {json.dumps(before)[:120]} before, {json.dumps(after)[:120]} after")


def compare(before: dict, after: dict) -> tuple[list[tuple[str, str]], list[str]]:
    items_before = {i["nodeid"]: i for i in before["items"]}
    items_after = {i["nodeid"]: i for i in after["items"]}
    times: list[str] = []
    differences = [f"{n}: only {'after' if n in items_after else 'before'}"
                   for n in sorted(set(items_before) ^ set(items_after))]
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
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
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
