"""How long the history takes: `cudagate history record` over many commits' reports, and `show`.

    python benchmarks/history_speed.py [--commits 1000] [--cases 20] [--rounds 300] [--json FILE]

A git repository of ``--commits`` commits (written with git fast-import: a suite's approvals ledger
that changes every 100 commits, a release tag every 250) and one report per commit, each with
``--cases`` timed cases of ``--rounds`` interleaved rounds. The reports come from the real report
builder (:func:`pytest_cudagate.reports.document.build_report`, real statistics on seeded samples),
one template whose latencies drift from commit to commit, written as the writer writes report.json,
each naming its commit as a run in GitHub Actions does. Timed, in one process through ``cudagate``'s
own entry point: ``record`` of every report in one command (a history filled from kept artifacts;
the target), and again one command per report into another history (as CI records one per push),
how much of that is reading and checking report.json, and ``show`` of everything and of the last 50
commits. Targets (issue 30, on the 2-core
CPU machine): record ≤ 10 s, show ≤ 2 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from evidence_header import with_header
from pytest_cudagate.cli import main as cudagate
from pytest_cudagate.gate import GateOptions, decide
from pytest_cudagate.history.record import read_measured
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.correctness import CaseVerdict
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.judge.latency import LatencyResult, classify
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.reports.document import build_report
from pytest_cudagate.reports.writer import dumps
from pytest_cudagate.boundary.schema import validate
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.suite.model import Tolerance
from pytest_cudagate.worker.fingerprint import Fingerprint

SUITE_PATH = "kernels/bench/cudagate.yaml"
LEDGER = "kernels/bench/cudagate.approvals.json"
APPROVE_EVERY, TAG_EVERY = 100, 250
THRESHOLD = 0.02
TARGETS = {"record": 10.0, "show": 2.0}
START = 1_764_000_000  # the first commit's time (2025-11-24); one commit a minute after it


def h200() -> Fingerprint:
    return Fingerprint(gpu_name="NVIDIA H200", compute_capability="9.0", memory_total_bytes=150_754_820_096,
                       driver_version="570.124.06", cuda_driver_version="12.8", nvrtc_version="12.8.93",
                       cuda_bindings_version="12.8.0", power_limit_w=700.0, ecc=True, mig=False, sm_count=132,
                       l2_bytes=62_914_560)


def write_repository(root: Path, commits: int) -> list[str]:
    """``commits`` commits on main (fast-import), oldest first; returns their shas."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    stream = []
    for n in range(commits):
        ledger = json.dumps({"format": 2, "suite": "bench", "approvals": {
            "bench": {"kernel": "bench", "source_sha256": f"{n // APPROVE_EVERY:064x}",
                      "approved_at": datetime.datetime.fromtimestamp(START + 60 * (n // APPROVE_EVERY) * APPROVE_EVERY,
                                                                     datetime.timezone.utc).isoformat()}}}).encode()
        message = f"change {n}".encode()
        stream.append(b"commit refs/heads/main\nmark :%d\ncommitter Bench <bench@example.com> %d +0000\n"
                      b"data %d\n%s\n" % (n + 1, START + 60 * n, len(message), message))
        if n:
            stream.append(b"from :%d\n" % n)
        if n % APPROVE_EVERY == 0:
            stream.append(b"M 100644 inline %s\ndata %d\n%s\n" % (LEDGER.encode(), len(ledger), ledger))
        stream.append(b"M 100644 inline notes.txt\ndata %d\n%s\n\n" % (len(message), message))
    subprocess.run(["git", "fast-import", "--quiet"], cwd=root, input=b"".join(stream), check=True)
    shas = subprocess.run(["git", "rev-list", "--reverse", "main"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.split()
    for n in range(0, commits, TAG_EVERY):
        subprocess.run(["git", "tag", f"v0.{n // TAG_EVERY}.0", shas[n]], cwd=root, check=True)
    subprocess.run(["git", "checkout", "-q", "main"], cwd=root, check=True)
    return shas


def template(cases: int, rounds: int) -> dict:
    """A report of ``cases`` timed performance cases, built as the gate builds one."""
    rng = np.random.default_rng(30)
    expected = rng.standard_normal(4096).astype(np.float32)
    outcomes = []
    for n in range(cases):
        base = 0.004 * 1.25 ** (n % 12)  # 4 µs to 46 µs
        approved = (base * rng.lognormal(0, 0.03, rounds)).tolist()
        current = (base * (1 + 0.01 * (n % 5 - 2)) * rng.lognormal(0, 0.03, rounds)).tolist()
        estimate = stats.paired_ratio(current, approved)
        outcome = CaseOutcome("bench", "bench", f"perf_{n:02d}", "performance", shape_class=("small", "large")[n % 2])
        outcome.latency = LatencyResult(classify(estimate, THRESHOLD), THRESHOLD, reason="approved", estimate=estimate,
                                        approved=stats.summarize(approved), current=stats.summarize(current),
                                        pairs=rounds, measurement_s=0.2, samples={"approved": approved, "current": current},
                                        telemetry=[{"sm_clock_mhz": 1980, "temperature_c": 41, "power_w": 320.5}])
        outcome.correctness = CaseVerdict("bench", outcome.case, True, comparisons=[
            check_output("y", expected.copy(), expected, Tolerance(atol=1e-5, rtol=1e-5), (64, 64))])
        decide(outcome, GateOptions())
        outcomes.append(outcome)
    # report.json's JSON: the drift below edits it as each commit's file would differ
    document = to_json(build_report(outcomes, [], index={}, fingerprint=h200(), options=GateOptions(), exitstatus=0).document)
    for item in document["items"]:
        item["suite_path"] = SUITE_PATH
    return document


def write_reports(folder: Path, document: dict, shas: list[str]) -> list[Path]:
    """One report.json per commit: the template's current latencies drifting by a few % (a +3 % step
    at every approval), its run created a minute after its commit, naming the commit."""
    items = [(item["latency"], item["latency"]["current"]["median"], item["latency"]["estimate"]["ratio"])
             for item in document["items"]]
    paths = []
    for n, sha in enumerate(shas):
        drift = 1 + 0.03 * (n // APPROVE_EVERY % 3) + 0.004 * np.sin(n / 7)
        for latency, median, ratio in items:
            latency["current"]["median"] = median * drift
            latency["estimate"]["ratio"] = ratio * drift
        created = datetime.datetime.fromtimestamp(START + 60 * n + 60, datetime.timezone.utc).isoformat()
        document["created"] = document["runs"][0]["created"] = created
        document["runs"][0]["github"] = {"repository": "bench/bench", "run_id": str(n), "job": "gate",
                                         "ref": "refs/heads/main", "sha": sha, "server_url": "https://github.com",
                                         "runner": "gpu-1"}
        if n == 0:
            validate(document, "report", folder)
        path = folder / f"r{n:04d}" / "report.json"
        path.parent.mkdir(parents=True)
        path.write_text(dumps(document), encoding="utf-8")
        paths.append(path.parent)
    return paths


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def quiet(argv: list[str]) -> None:
    with open(os.devnull, "w") as sink:
        saved, sys.stdout = sys.stdout, sink
        try:
            code = cudagate(argv)
        finally:
            sys.stdout = saved
    if code:
        raise SystemExit(f"cudagate {' '.join(argv)} exited {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds per case (samples per kernel)")
    parser.add_argument("--json", type=Path, help="write the rows here, with the commit and date")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cudagate-history-") as tmp:
        base = Path(tmp)
        shas = write_repository(base / "repo", args.commits)
        reports = write_reports(base / "reports", template(args.cases, args.rounds), shas)
        size = (reports[0] / "report.json").stat().st_size
        db, each_db = base / "history.sqlite", base / "each.sqlite"
        repo = ["--repo", str(base / "repo")]
        record_s = timed(lambda: quiet(["history", "record", *map(str, reports), "--db", str(db), *repo]))
        each_s = timed(lambda: [quiet(["history", "record", str(r), "--db", str(each_db), *repo]) for r in reports])
        read_s = timed(lambda: [read_measured(r) for r in reports])
        again_s = timed(lambda: quiet(["history", "record", *map(str, reports[-50:]), "--db", str(db), *repo]))
        show_s = timed(lambda: quiet(["history", "show", "--db", str(db), "--out", str(base / "page")]))
        last_s = timed(lambda: quiet(["history", "show", "--db", str(db), "--out", str(base / "last"), "--last", "50"]))
        page_bytes = (base / "page" / "history.html").stat().st_size
        db_bytes = db.stat().st_size
    n = len(reports)
    rows = [
        {"step": "record", "what": f"{n} reports x {args.cases} cases, one command", "seconds": record_s,
         "per_report_ms": 1000 * record_s / n, "target_s": TARGETS["record"]},
        {"step": "record, a command per report", "what": f"{n} commands, as CI runs one per push", "seconds": each_s,
         "per_report_ms": 1000 * each_s / n, "target_s": None},
        {"step": "record: reading and checking report.json", "what": "of the above", "seconds": read_s,
         "per_report_ms": 1000 * read_s / n, "target_s": None},
        {"step": "record again", "what": "50 reports already stored, one command", "seconds": again_s,
         "per_report_ms": 1000 * again_s / 50, "target_s": None},
        {"step": "show", "what": f"{n} commits x {args.cases} cases", "seconds": show_s, "per_report_ms": None,
         "target_s": TARGETS["show"]},
        {"step": "show --last 50", "what": f"50 commits x {args.cases} cases", "seconds": last_s, "per_report_ms": None,
         "target_s": None},
    ]
    for row in rows:
        row["met"] = None if row["target_s"] is None else row["seconds"] <= row["target_s"]
    print(f"history speed: {n} commits x {args.cases} cases, {args.rounds} rounds a case "
          f"(report.json {size / 1024:.0f} KiB each); {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"history {db_bytes / 2**20:.1f} MiB, page {page_bytes / 2**20:.1f} MiB")
    print("| step | what | seconds | ms per report | target |")
    print("|---|---|---:|---:|---|")
    for row in rows:
        per = f"{row['per_report_ms']:.1f}" if row["per_report_ms"] is not None else ""
        target = "" if row["target_s"] is None else f"≤ {row['target_s']:g} s: {'met' if row['met'] else 'MISSED'}"
        print(f"| {row['step']} | {row['what']} | {row['seconds']:.2f} | {per} | {target} |")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        document = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "commit": commit.stdout.strip() or None, "machine": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "commits": n, "cases": args.cases, "rounds": args.rounds,
                    "report_bytes": size, "history_bytes": db_bytes, "page_bytes": page_bytes, "rows": rows}
        # A CPU benchmark: the machine, not a card, is what its figures depend on.
        document = with_header(document, __file__, argv, f"CPU only: {platform.machine()}, {os.cpu_count()} CPUs")
        validate(document, "history-speed", args.json)
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return 0 if all(row["met"] is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
