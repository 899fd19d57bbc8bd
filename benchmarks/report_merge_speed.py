"""How long a large report takes to merge and to turn into a comment, and how much memory.

    python benchmarks/report_merge_speed.py [--items 12000] [--samples 300] [--tree DIR] [--json FILE]

One report.json of ``--items`` items (issue 41 measured 12,000 items, 108 MB: 25 s and 1.5 GB for
`cudagate report merge`), built from the report fixtures' six outcomes (tests/report_fixtures.py, the
real report builder on a generated suite), each copy under its own case name, every timed item with
``--samples`` timing samples per kernel (written by the writer, as a gate run writes it). Then, each in
a process of its own: `cudagate report merge OUT DIR` and `cudagate report comment DIR --out FILE`.
Prints one row per command: wall and CPU seconds, peak memory, and the size of what it wrote.
``--tree DIR``: the commands run another checkout's code (its pytest_cudagate and schemas), for a
before/after on the same machine and report.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from report_fixtures import build_scenario, built_report  # noqa: E402

from evidence_header import with_header  # noqa: E402
from pytest_cudagate.reports.writer import dumps  # noqa: E402

# Runs one cudagate command and prints its exit code, CPU seconds and peak memory (the child's own).
CHILD = """
import json, resource, sys
from pytest_cudagate.cli import main
code = main(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}))
"""


def big_report(folder: Path, items: int, samples: int, seed: int = 0) -> Path:
    """A report folder whose report.json holds ``items`` items (no request files: merge copies those)."""
    built = built_report(build_scenario(folder / "scale"))
    document = built.document
    rng = np.random.default_rng(seed)
    models = document["items"]
    copies = []
    for n in range(items):
        item = copy.deepcopy(models[n % len(models)])
        item.update(case=f"{item['case']}_{n}", nodeid=f"{item['nodeid']}_{n}", requests=[])
        for role in item["samples_ms"]:
            item["samples_ms"][role] = (0.0123 * rng.lognormal(0, 0.02, samples)).tolist()
        copies.append(item)
    document["items"] = copies
    report = folder / "report"
    report.mkdir(parents=True)
    (report / "report.json").write_text(dumps(document), encoding="utf-8")
    return report


def environment(tree: Path, scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    if tree != ROOT:  # its code first, its schemas under the name the code imports them by
        (scratch / "cudagate_schemas").symlink_to(tree / "schemas")
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(scratch), env.get("PYTHONPATH", "")])
    return env


def run(args: list[str], env: dict[str, str], cwd: Path) -> dict:
    start = time.perf_counter()
    # cwd: not a checkout, whose pytest_cudagate `python -c` would import before the one asked for
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall}


def table(rows: list[dict], report_mb: float, items: int, where: str) -> str:
    lines = [f"report.json: {report_mb:.1f} MB, {items:,} items; code: {where}", "",
             "| command | wall s | CPU s | peak MB | wrote MB |", "|---|---:|---:|---:|---:|"]
    lines += [f"| `{r['command']}` | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_mb']:.0f} | {r['wrote_mb']:.1f} |"
              for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=12_000)
    parser.add_argument("--samples", type=int, default=300, help="timing samples per kernel of each timed item")
    parser.add_argument("--tree", type=Path, default=ROOT, help="run this checkout's code")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="cudagate-merge-speed-") as tmp:
        scratch = Path(tmp)
        report = big_report(scratch, args.items, args.samples)
        env = environment(tree, scratch)
        size = (report / "report.json").stat().st_size / 1e6
        rows = []
        for command, out in [(["report", "merge", str(scratch / "merged"), str(report)], scratch / "merged"),
                             (["report", "comment", str(report), "--out", str(scratch / "comment.md")],
                              scratch / "comment.md")]:
            result = run(command, env, scratch)
            wrote = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) if out.is_dir() else out.stat().st_size
            rows.append({"command": f"cudagate report {command[1]}", **result, "wrote_mb": wrote / 1e6})
    print(table(rows, size, args.items, str(tree)))
    if args.json:
        document = {"report_mb": size, "items": args.items, "tree": str(tree), "rows": rows}
        card = f"CPU only: {os.cpu_count()} cores seen"  # no GPU work: the host's CPUs are what is timed
        args.json.write_text(json.dumps(with_header(document, __file__, card=card), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
