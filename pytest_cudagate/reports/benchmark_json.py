"""Timings in pytest-benchmark's JSON format (seconds), for ``pytest-benchmark compare`` and the
dashboards that read it (github-action-benchmark, codspeed-style trackers).

The statistics follow pytest-benchmark's own definitions (``pytest_benchmark.stats.Stats``),
quartiles included, so numbers match what its tools would compute from ``data``.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from bisect import bisect_left, bisect_right
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagate import __version__
from pytest_cudagate.boundary.wire import to_json

if TYPE_CHECKING:
    from pytest_cudagate.reports.model import Item, Report, SkippedItem

FORMAT_VERSION = "5.1.0"  # the pytest-benchmark JSON layout this mirrors


def _quartiles(data: list[float]) -> tuple[float, float]:
    n = len(data)
    if n == 1:
        return data[0], data[0]
    if n % 2:  # pytest-benchmark's "method 3"
        k, q = n // 4, n % 4
        q1 = 0.25 * data[k - 1] + 0.75 * data[k] if q == 1 else 0.75 * data[k] + 0.25 * data[k + 1]
        q3 = 0.75 * data[3 * k] + 0.25 * data[3 * k + 1] if q == 1 else 0.25 * data[3 * k + 1] + 0.75 * data[3 * k + 2]
        return q1, q3
    return statistics.median(data[: n // 2]), statistics.median(data[n // 2:])


def stats(samples_s: list[float]) -> dict:
    data = sorted(samples_s)
    n = len(data)
    mean = statistics.mean(data)
    stddev = statistics.stdev(data) if n > 1 else 0.0
    q1, q3 = _quartiles(data)
    iqr = q3 - q1
    iqr_outliers = sum(1 for x in data if x < q1 - 1.5 * iqr or x > q3 + 1.5 * iqr)
    stddev_outliers = sum(1 for x in data if x < mean - stddev or x > mean + stddev)
    total = sum(data)
    return {
        "min": data[0], "max": data[-1], "mean": mean, "stddev": stddev, "rounds": n,
        "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3,
        "iqr_outliers": iqr_outliers, "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": data[0] if n == 1 else data[bisect_left(data, q1 - 1.5 * iqr)],
        "hd15iqr": data[0] if n == 1 else data[bisect_right(data, q3 + 1.5 * iqr) - 1],
        "ops": n / total if total else 0, "total": total,
        "data": list(samples_s), "iterations": 1,
    }


def _entry(doc: Report, item: Item | SkippedItem, role: str, samples_ms: list[float]) -> dict:
    run = doc.runs[item.run]
    fp = run.fingerprint
    lat = item.latency
    est = to_json(lat and lat.estimate) or {}  # as report.json holds it: an unbounded end is null
    name = f"{item.kernel}[{item.case}]" + ("" if role == "current" else f"@{role}")
    params = {"kernel": item.kernel, "case": item.case, "version": role, "fingerprint": fp and fp.key}
    return {
        "group": f"{item.suite}::{item.case}" + (f" ({fp.key[:8]})" if len(doc.runs) > 1 and fp else ""),
        "name": name, "fullname": item.nodeid + ("" if role == "current" else f"@{role}"),
        "params": params, "param": f"{item.kernel}-{item.case}-{role}",
        "extra_info": {"latency_verdict": lat and lat.verdict.value, "ratio": est.get("ratio"),
                       "interval": [est.get("low"), est.get("high")],
                       "threshold": lat and lat.threshold, "fingerprint": fp and fp.description,
                       "status": item.status, "unit_note": "seconds per kernel launch (CUDA events)"},
        "options": {"disable_gc": False, "timer": "cuda_event", "min_rounds": len(samples_ms),
                    "max_time": run.options.get("budget_s"), "min_time": 0, "warmup": True},
        "stats": stats([x / 1000 for x in samples_ms]),
    }


def commit_info(root: Path | None) -> dict:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"id": os.environ.get("GITHUB_SHA") or git("rev-parse", "HEAD") or "unversioned",
            "time": git("show", "-s", "--pretty=format:%cI"), "author_time": git("show", "-s", "--pretty=format:%aI"),
            "dirty": bool(status), "project": (root or Path.cwd()).name,
            "branch": os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME")
            or git("rev-parse", "--abbrev-ref", "HEAD") or "(unknown)"}


def machine_info(doc: Report) -> dict:
    return {"node": platform.node(), "processor": platform.processor(), "machine": platform.machine(),
            "python_compiler": platform.python_compiler(), "python_implementation": platform.python_implementation(),
            "python_implementation_version": platform.python_version(), "python_version": platform.python_version(),
            "python_build": list(platform.python_build()), "release": platform.release(), "system": platform.system(),
            "cpu": {"arch": platform.machine(), "brand_raw": platform.processor()},
            "gpus": [to_json(r.fingerprint) for r in doc.runs if r.fingerprint], "cudagate_version": __version__}


def benchmark_document(doc: Report, root: Path | None = None) -> dict:
    """One benchmark per timed item (the current kernel) and one for the approved kernel beside it."""
    benchmarks = []
    for item in doc.items:
        for role in ("current", "approved"):
            samples = item.samples_ms.get(role)
            if samples:
                benchmarks.append(_entry(doc, item, role, samples))
    return {"machine_info": machine_info(doc), "commit_info": commit_info(root), "benchmarks": benchmarks,
            "datetime": datetime.now(timezone.utc).isoformat(), "version": FORMAT_VERSION}
