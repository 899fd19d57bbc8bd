"""What the gate costs around the kernels it times. Prints markdown tables.

    python benchmarks/gate_speed.py                 # plugin-off cost (CPU) + warm gate on examples/ (GPU)
    python benchmarks/gate_speed.py --plugin-only   # the CPU part alone
    python benchmarks/gate_speed.py --xdist         # -n 2 against -n 0 on a host with two GPUs
    python benchmarks/gate_speed.py --no-gpu        # the gate's host side on a machine without one
    python benchmarks/gate_speed.py --tree DIR      # the examples and code of another checkout (before/after)
    python benchmarks/gate_speed.py --json OUT.json # also keep the tables (schemas/gate-speed.schema.json)

1. Plugin off: a one-test project, run in fresh processes alternately with cudagate loaded and with
   it left out; the medians of each and their difference (target: ≤ 30 ms).
2. `pytest --cuda-gate examples` in fresh processes, first run with an empty compile cache and then
   warm: wall time of the whole command, the per-phase split every case records in report.json
   (summed over the cases), and beside it the run's phases that `--cuda-gate-durations` prints
   (process start to the summary; the rest of the wall time is teardown and exit). ``--no-gpu``:
   the same without a GPU, where the cases skip: startup, imports, suites, trust, compiles, reports.
3. ``--xdist``: a generated suite of 4 kernels × 12 timed cases (48 items) in a temp folder, run
   with `-n 0` and with `-n 2` in fresh processes: wall time, throughput ratio, the report's item
   count, whether the verdicts agree, and how many items each worker (GPU) ran.

The environment is a venv that holds cudagate and its dependencies, as a user's GPU runner does:
every pytest run gets ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` and names the plugins it uses in
``PYTEST_PLUGINS`` (cudagate's, and xdist's for ``-n``), so pytest plugins that this machine's image
carries for other projects are not loaded (``--as-installed`` loads them, as a plain ``pytest``
here would); bytecode is written (``PYTHONDONTWRITEBYTECODE`` dropped, as after a ``pip install``),
and one untimed run writes it before any timed one. The first table row says what a one-test
pytest run costs in that environment: the floor under every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from evidence_header import with_header

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Env:
    """How the pytest runs are started: the code's checkout, and whether the machine's other pytest
    plugins load (see the module docstring)."""

    tree: Path = ROOT
    installed: bool = False

    def environ(self, *plugins: str, **extra: str) -> dict:
        """The environment of a run that uses ``plugins`` (module names), where autoloading is off:
        named in PYTEST_PLUGINS, which imports them as they are, with no scan of the installed
        packages' entry points (``-p`` would scan them: ~70 ms on the H200 image, a cost the run
        without cudagate would not pay)."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if self.tree != ROOT:  # its own code first, the worker (started with this environment) too
            env["PYTHONPATH"] = os.pathsep.join([str(self.tree), str(self.tree / "harness"), env.get("PYTHONPATH", "")])
        if not self.installed:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            env.pop("PYTEST_PLUGINS", None)
            if plugins:
                env["PYTEST_PLUGINS"] = ",".join(plugins)
        return {**env, **extra}

    def describe(self) -> str:
        where = "" if self.tree == ROOT else f", code and examples of {self.tree}"
        return ("the machine's pytest plugins loaded" if self.installed else "cudagate the only pytest plugin") + where


def _wall(args: list[str], cwd: Path, env: dict | None = None) -> tuple[float, int]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, done.returncode


def plugin_off(repeats: int, env: Env) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="cudagate-speed-") as tmp:
        project = Path(tmp)
        (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        common = ["-q", "-p", "no:cacheprovider", "test_one.py"]
        left_out = [*common, "-p", "no:cudagate"] if env.installed else common
        loaded_env, left_out_env = env.environ("pytest_cudagate.plugin"), env.environ()
        _wall(common, project, loaded_env)  # warm the file system cache and bytecode
        on, off = [], []
        for _ in range(repeats):  # alternate so drift of the machine hits both alike
            on.append(_wall(common, project, loaded_env)[0])
            off.append(_wall(left_out, project, left_out_env)[0])
    m_on, m_off = statistics.median(on), statistics.median(off)
    return [
        (f"one-test project, cudagate installed (median of {repeats})", f"{m_on * 1000:.0f} ms"),
        (f"same without cudagate (median of {repeats}): the floor of any pytest run here", f"{m_off * 1000:.0f} ms"),
        ("cost of the installed plugin when off (target ≤ 30 ms)", f"{(m_on - m_off) * 1000:+.0f} ms "
                                                                    f"(ratio {m_on / m_off:.3f})"),
    ]


RUN_TITLE = "cudagate run phases: seconds of this process's wall time until this summary"
RUN_ROW = re.compile(r"^\s*(\d+\.\d{3})  (\w+)\s")


def run_phases(stdout: str) -> dict[str, float]:
    """The run phases `--cuda-gate-durations` printed (without the total)."""
    lines = stdout.splitlines()
    found: dict[str, float] = {}
    for line in lines[lines.index(RUN_TITLE) + 1:] if RUN_TITLE in lines else []:
        row = RUN_ROW.match(line)
        if not row or row.group(2) == "total":
            break
        found[row.group(2)] = float(row.group(1))
    return found


def gate_runs(repeats: int, env: Env, gpu: bool = True) -> list[tuple[str, str]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="cudagate-speed-") as tmp:
        walls, phases, runs, verdicts, busy = [], [], [], [], []
        # run -1 writes the bytecode, in caches of its own, so that run 0 meets empty compile caches
        for i in range(-1, repeats + 1):
            report = Path(tmp) / f"report-{i}"
            cache = Path(tmp) / ("cache-bytecode" if i < 0 else "cache")
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "pytest", "--cuda-gate", "examples", "-q", "-p",
                                   "no:cacheprovider", *(["--cuda-gate-require-gpu"] if gpu else []),
                                   "--cuda-gate-durations", "0", "--cuda-gate-report", str(report)],
                                  cwd=env.tree, env=env.environ("pytest_cudagate.plugin", CUDAGATE_CACHE_DIR=str(cache)),
                                  capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if done.returncode not in (0, 1):
                rows.append((f"run {i}", f"exit {done.returncode}: the gate did not run: {done.stdout[-600:]}"))
                return rows
            if i < 0:
                continue
            document = json.loads((report / "report.json").read_text())
            split: dict[str, float] = defaultdict(float)
            for item in document["items"]:
                for phase, seconds in (item.get("phases") or {}).items():
                    split[phase] += seconds
            walls.append(wall)
            phases.append(split)
            run = run_phases(done.stdout)
            busy.append(document["runs"][-1].get("cases_busy") or {})
            run["after the summary: teardown, exit"] = max(0.0, wall - sum(run.values()))
            runs.append(run)
            verdicts.append(", ".join(f"{v} {n}" for v, n in sorted(_counts(document).items())))
    rows.append(("environment", env.describe()))
    rows.append(("first run, empty compile and sanitizer caches: wall", f"{walls[0]:.2f} s"))
    rows.append((f"warm runs: wall, median of {repeats}", f"{statistics.median(walls[1:]):.2f} s "
                 f"(min {min(walls[1:]):.2f}, max {max(walls[1:]):.2f})"))
    rows.append(("items and latency verdicts, each run", " / ".join(dict.fromkeys(verdicts))))
    summary = [sum(v for k, v in run.items() if not k.startswith("after")) for run in runs]
    around = [total - run.get("cases", 0.0) for total, run in zip(summary, runs)]
    rows.append(("process start to the summary (the run phases' total): first run / warm (median)",
                 f"{summary[0]:.2f} / {statistics.median(summary[1:]):.2f} s"))
    rows.append(("  of it around the cases (all but `cases`): first run / warm (median)",
                 f"{around[0]:.2f} / {statistics.median(around[1:]):.2f} s"))
    if all(busy):
        for key, what in (("worker_fraction", "the worker's own time on the cases"),
                          ("launches_fraction", "warm-up and timed launches alone")):
            rows.append((f"  share of the cases' span (first case start to last case end) busy in the worker, {what}: "
                         "first run / warm (median)",
                         f"{busy[0][key]:.0%} / {statistics.median(b[key] for b in busy[1:]):.0%}"))
    names = sorted({name for split in phases for name in split}, key=lambda n: -phases[-1].get(n, 0))
    for name in names:
        rows.append((f"  phase `{name}` summed over cases: first run / warm (median)",
                     f"{phases[0].get(name, 0.0):.3f} / {statistics.median(split.get(name, 0.0) for split in phases[1:]):.3f} s"))
    for name in runs[-1]:  # the order the run meets them
        rows.append((f"  run phase `{name}`: first run / warm (median)",
                     f"{runs[0].get(name, 0.0):.3f} / {statistics.median(run.get(name, 0.0) for run in runs[1:]):.3f} s"))
    return rows


def _counts(document: dict) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in document["items"]:
        counts[(item.get("latency") or {}).get("verdict") or item["status"]] += 1
    return counts


XDIST_KERNELS = 4
XDIST_CASES = 12  # timed cases per kernel
XDIST_CU = """\
extern "C" __global__ void KERNEL(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = 2.0f * x[blockIdx.x * cols + c];
}
"""
XDIST_REFERENCE = """\
import numpy as np


def scale_rows(x, rows, cols):
    return (x.astype(np.float64).reshape(rows, cols) * 2).astype(np.float32)
"""


def xdist_suite(root: Path) -> Path:
    """A suite of XDIST_KERNELS copies of a row-scaling kernel and XDIST_CASES timed cases, data generated."""
    from pytest_cudagate.defences.expected import generate
    from pytest_cudagate.suite.loader import load_suite

    names = [f"scale{k}" for k in range(XDIST_KERNELS)]
    (root / "scale.cu").write_text("".join(XDIST_CU.replace("KERNEL", n) for n in names))
    (root / "reference.py").write_text(XDIST_REFERENCE)
    kernels = "".join(f"  - {{name: {n}, source: scale.cu, launch: {{grid: [rows], block: [256]}}}}\n" for n in names)
    cases = "".join(f"  - {{name: perf_{i}, kind: performance, scalars: {{rows: {256 * (i + 1)}, cols: 1024}}}}\n"
                    for i in range(XDIST_CASES))
    path = root / "cudagate.yaml"
    path.write_text("suite: spread\nsignature:\n"
                    "  - {name: x, buffer: float32, intent: in, size: rows*cols, shape: [rows, cols]}\n"
                    "  - {name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}\n"
                    "  - {name: rows, scalar: int32}\n  - {name: cols, scalar: int32}\n"
                    "reference:\n  python: reference.py:scale_rows\ntolerance:\n  y: {atol: 1.0e-6, rtol: 1.0e-5}\n"
                    f"kernels:\n{kernels}cases:\n{cases}")
    generate(load_suite(path))
    return path


def _verdicts(document: dict) -> dict[str, tuple]:
    return {i["nodeid"]: (i["status"], (i.get("latency") or {}).get("verdict")) for i in document["items"]}


def _spent(document: dict, what: str) -> str:
    """Where a run's time went, to tell a GPU-bound -n 2 from one whose cards disturb each other."""
    latencies = [i["latency"] for i in document["items"] if i.get("latency")]
    if what == "measurement s":
        return f"{sum(lat.get('measurement_s') or 0 for lat in latencies):.1f}"
    if what == "discarded chunks":
        return str(sum(len(lat.get("discarded") or []) for lat in latencies))
    counts: dict[str, int] = defaultdict(int)
    for lat in latencies:
        counts[lat.get("verdict")] += 1
    return ", ".join(f"{v} {n}" for v, n in sorted(counts.items(), key=lambda kv: str(kv[0])))


def xdist_runs(env: Env) -> list[tuple[str, str]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="cudagate-xdist-") as tmp:
        suite = xdist_suite(Path(tmp))
        results = {}
        for workers in ("0", "2"):
            report = Path(tmp) / f"report-n{workers}"
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "pytest", "--cuda-gate", str(suite), "-n", workers, "-v",
                                   "-p", "no:cacheprovider", "--cuda-gate-allow-unsigned", "--cuda-gate-require-gpu",
                                   "--cuda-gate-report", str(report)], cwd=tmp,
                                  env=env.environ("pytest_cudagate.plugin", "xdist.plugin", "xdist.looponfail"),
                                  capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if done.returncode not in (0, 1):
                return [(f"-n {workers}", f"exit {done.returncode}: {done.stdout[-400:]}")]
            document = json.loads((report / "report.json").read_text())
            split: dict[str, int] = defaultdict(int)
            for line in done.stdout.splitlines():
                found = re.match(r"\[(gw\d+)\] .*::perf_\d+", line)
                if found:
                    split[found.group(1)] += 1
            results[workers] = (wall, document, dict(sorted(split.items())))
        (w0, d0, _), (w2, d2, split) = results["0"], results["2"]
        same = _verdicts(d0) == _verdicts(d2)
        rows += [("timed items in the suite", str(XDIST_KERNELS * XDIST_CASES)),
                 ("`-n 0`: wall / report items", f"{w0:.2f} s / {len(d0['items'])}"),
                 ("`-n 2`: wall / report items", f"{w2:.2f} s / {len(d2['items'])}"),
                 ("throughput `-n 2` ÷ `-n 0` (target ≥ 1.8)", f"{w0 / w2:.2f}×"),
                 ("same items, statuses and latency verdicts", "yes" if same else "NO"),
                 *((f"`-n {w}`: {what}", _spent(results[w][1], what)) for w in ("0", "2")
                   for what in ("measurement s", "discarded chunks", "verdicts")),
                 ("`-n 2`: case items per worker (gwN runs on GPU N)",
                  ", ".join(f"{k}: {v}" for k, v in split.items()) or "none seen")]
    return rows


def table(title: str, rows: list[tuple[str, str]], kept: list[dict]) -> None:
    kept.append({"title": title, "rows": [list(row) for row in rows]})
    width = max(len(r[0]) for r in rows)
    print(f"\n### {title}\n\n| {'what'.ljust(width)} | value |\n|{'-' * (width + 2)}|---|")
    for what, value in rows:
        print(f"| {what.ljust(width)} | {value} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin-only", action="store_true", help="only the CPU measurement of the plugin when off")
    parser.add_argument("--xdist", action="store_true", help="only -n 2 against -n 0 (a host with two GPUs)")
    parser.add_argument("--no-gpu", action="store_true",
                        help="the examples without a GPU (cases skip): the host's share of a gate run")
    parser.add_argument("--gate-only", action="store_true", help="only `pytest --cuda-gate examples`")
    parser.add_argument("--as-installed", action="store_true",
                        help="let pytest load every plugin installed here (the machine's other projects' too)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="run this checkout's code and examples")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the tables here, with the evidence header")
    args = parser.parse_args()
    env = Env(args.tree.resolve(), args.as_installed)
    kept: list[dict] = []
    if args.xdist:
        table("`-n 2` against `-n 0`", xdist_runs(env), kept)
    else:
        if not args.gate_only:
            table("Plugin off", plugin_off(args.repeats, env), kept)
        if not args.plugin_only:
            table("`pytest --cuda-gate examples`" + (" without a GPU" if args.no_gpu else ""),
                  gate_runs(max(args.repeats // 2, 3) if not args.gate_only else args.repeats, env, gpu=not args.no_gpu),
                  kept)
    if args.json:
        args.json.write_text(json.dumps(with_header({"tables": kept}, __file__), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
