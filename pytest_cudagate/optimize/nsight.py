"""``--use-nsight``: a short Nsight Compute summary of one launch, for the next proposal.

``ncu --clock-control none`` (the GPU keeps its normal clocks, as in the timed runs) profiles the
first launch of the entry while the harness runs a one-case request file; a handful of metrics
come back: achieved and theoretical occupancy, DRAM and SM throughput, registers per thread, the
kernel's duration. Spills come from the compile (ptxas -v). Needs ``ncu`` and permission to read
the counters; without either the summary says why and the loop carries on.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cudagate_harness.toolkit import find_tool

METRICS = {
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "gpu__time_duration.sum": "duration",
}
TIMEOUT_S = 180.0


def find_ncu() -> str | None:
    """Nsight Compute's CLI: $CUDAGATE_NCU, the PATH, then the usual toolkit folders."""
    return find_tool("ncu", "CUDAGATE_NCU")


def parse_csv(text: str) -> dict:
    """Metric values of the first profiled launch in ``ncu --csv`` output (``==PROF==`` lines skipped)."""
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    reader = csv.reader(io.StringIO("\n".join(rows)))
    header = None
    found: dict = {}
    for row in reader:
        if header is None:
            if "Metric Name" in row and "Metric Value" in row:
                header = {name: i for i, name in enumerate(row)}
            continue
        if len(row) < len(header):
            continue
        metric = row[header["Metric Name"]]
        if metric not in METRICS or METRICS[metric] in found:
            continue
        unit = row[header["Metric Unit"]] if "Metric Unit" in header else ""
        raw = row[header["Metric Value"]].replace(",", "").strip()
        try:
            value = float(raw)
        except ValueError:
            continue
        key = METRICS[metric]
        if key == "duration":
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit.strip(), None)
            if scale is None:
                continue
            found["duration_us"] = round(value * scale, 3)
        else:
            found[key] = round(value, 2)
    return found


def describe(summary: dict, resources: dict | None = None) -> str:
    """One short paragraph for a model prompt."""
    if summary.get("error"):
        return f"Nsight Compute: no summary ({summary['error']})"
    parts = []
    names = [("achieved_occupancy_pct", "achieved occupancy {:.0f}%"), ("theoretical_occupancy_pct", "theoretical {:.0f}%"),
             ("dram_throughput_pct", "DRAM throughput {:.0f}% of peak"), ("sm_throughput_pct", "SM throughput {:.0f}% of peak"),
             ("registers_per_thread", "{:.0f} registers/thread"), ("duration_us", "{:.2f} µs (profiled, warm)")]
    for key, fmt in names:
        if summary.get(key) is not None:
            parts.append(fmt.format(summary[key]))
    resources = resources or {}
    if resources:
        parts.append(f"{resources.get('spill_store_bytes', 0)} B spill stores, {resources.get('spill_load_bytes', 0)} B spill "
                     f"loads, {resources.get('shared_static_bytes', 0)} B static shared")
    return f"Nsight Compute on case {summary.get('case', '?')}: " + ", ".join(parts)


def profile(request: dict, entry: str, *, env: dict | None = None, timeout_s: float = TIMEOUT_S) -> dict:
    """Profile the first launch of ``entry`` in the one-case ``request``; a summary or ``{"error": ...}``."""
    exe = find_ncu()
    if exe is None:
        return {"error": "ncu not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)"}
    with tempfile.TemporaryDirectory(prefix="cudagate-ncu-") as work:
        path = Path(work) / "request.json"
        request = {**request, "timing": None, "output_dir": str(Path(work) / "out")}
        path.write_text(json.dumps(request), encoding="utf-8")
        log = Path(work) / "ncu.csv"
        command = [exe, "--clock-control", "none", "--target-processes", "all", "--kernel-name", entry,
                   "--launch-count", "1", "--csv", "--log-file", str(log), "--metrics", ",".join(METRICS),
                   sys.executable, "-m", "cudagate_harness", str(path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, **(env or {})}, cwd="/")  # no module from a checkout
        except subprocess.TimeoutExpired:
            return {"error": f"ncu did not finish within {timeout_s:g} s"}
        except OSError as exc:
            return {"error": f"ncu could not start: {exc}"}
        text = log.read_text(errors="replace") if log.is_file() else ""
        summary = parse_csv(text) or parse_csv(done.stdout)  # where --csv goes has varied between versions
        if not summary:
            tail = (text + "\n" + done.stdout[-600:] + "\n" + done.stderr[-600:]).strip()
            reason = "ERR_NVGPUCTRPERM: no permission to read the GPU counters" if "ERR_NVGPUCTRPERM" in tail else \
                f"ncu exited {done.returncode} without metrics: {tail[-400:]}"
            return {"error": reason}
        summary["metrics"] = sorted(METRICS)
        return summary
