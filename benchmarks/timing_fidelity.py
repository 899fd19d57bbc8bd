"""Does cudagate time a kernel the way other tools do? Cold L2, four outside timers, one run.

    python benchmarks/timing_fidelity.py [--quick] [--procs 5] [--json OUT.json]   (schemas/timing-fidelity.schema.json)
    python benchmarks/timing_fidelity.py --tree DIR   # also `cudagate run` of another checkout: before/after, one card

Kernels: the examples' shipped kernels on their performance cases (softmax 256×1024 and 2048×128,
matmul 256³ and 384×256×320, about 5-20 µs), and the matmul kernel on 1024³ and 2048³ (about 0.3 and
2 ms; inputs drawn here, launch grid scaled from the 256³ case's). Each is taken from the run requests
that ``pytest --cuda-gate --cuda-gate-report`` saves, so every tool launches exactly what the gate
replays, and timed cold by:
- cudagate: ``cudagate run REQUEST.json`` (the harness: 2×L2 memset before each launch, one event pair
  per launch, warm-up until 50 ms), median of 300 launches;
- nvbench (cuda-bench): cold measurement, its own stopping rule (benchmarks/nvbench_probe.py);
- Nsight Compute: ``gpu__time_duration.sum`` of 50 launches, ``--cache-control all`` (flushed before
  each), ``--clock-control none`` (the clocks the others run at), median;
- Triton: ``triton.testing.do_bench`` at its defaults (zeroes 256 MB before each launch), median.
With ``--tree DIR``, the same requests are also replayed by DIR's code (``cudagate run`` with DIR and
DIR/harness first on the path), in the same processes' rounds, so two versions meet on one card.
Every tool runs in ``--procs`` fresh processes (ncu in fewer: it is slow); a cell is the median over
processes of each process's median, with [min, max] over the processes. Needs a GPU, ncu, torch,
triton, cupy and cuda-bench.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from evidence_header import with_header
from pytest_cudagate.boundary import schema

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
CASES = {  # label: (suite, case, scale of the matmul 256³ case or None)
    "softmax 256×1024": ("softmax", "perf_256x1024", None),
    "softmax 2048×128": ("softmax", "perf_2048x128", None),
    "matmul 256³": ("matmul", "perf_256x256x256", None),
    "matmul 384×256×320": ("matmul", "perf_384x256x320", None),
    "matmul 1024³": ("matmul", "perf_256x256x256", 4),
    "matmul 2048³": ("matmul", "perf_256x256x256", 8),
}
QUICK = ("softmax 256×1024", "matmul 2048³")
NCU_LAUNCHES = 50
TIMING = {"warmup": 10, "cache": "cold", "warmup_ms": 50}  # the gate's defaults, where a request names none
UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def run(args: list[str], timeout: float = 300, cwd: Path = ROOT, env: dict | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} … exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def gate_requests(work: Path, paths: tuple[str, ...] = ("examples",)) -> dict[tuple[str, str], Path]:
    """Run requests of the performance cases under ``paths``, as the gate saves them (approved kernels)."""
    report = work / "report"
    done = subprocess.run([sys.executable, "-m", "pytest", "--cuda-gate", *paths, "--cuda-gate-require-gpu",
                           "--cuda-gate-report", str(report), "-p", "no:cacheprovider", "-p", "no:gpucheck", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if not (report / "report.json").is_file():
        raise RuntimeError(f"pytest --cuda-gate {' '.join(paths)} wrote no report: {done.stdout[-3000:]}{done.stderr[-2000:]}")
    found = {}
    for item in json.loads((report / "report.json").read_text())["items"]:
        names = [r for r in item.get("requests", []) if not r.endswith("-approved.json")]
        if item.get("kind") == "performance" and names:
            suite = Path(item["suite"]).parent.name if "/" in item["suite"] else item["suite"]
            found[suite, item["case"]] = report / names[0]
    return found


def scaled(request_path: Path, factor: int, work: Path) -> Path:
    """The matmul request on (factor·m, factor·n, factor·k): new uniform inputs, the grid scaled alike."""
    request = json.loads(request_path.read_text())
    case = request["cases"][0]
    s = {k: v * factor for k, v in case["scalars"].items()}
    rng = np.random.default_rng(factor)
    folder = work / f"matmul-x{factor}"
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {"a": (s["m"], s["k"]), "b": (s["k"], s["n"]), "c": (s["m"], s["n"])}
    for name, spec in case["buffers"].items():
        spec["count"] = int(np.prod(shapes[name]))
        if "input" in spec:
            np.save(folder / f"{name}.npy", rng.uniform(-1, 1, shapes[name]).astype(np.float32))
            spec["input"] = str(folder / f"{name}.npy")
    grid = case["launch"]["grid"]
    case["launch"]["grid"] = [grid[0] * factor, grid[1] * factor, grid[2]]
    case["scalars"], case["name"] = s, f"bench_{s['m']}x{s['n']}x{s['k']}"
    for key in ("expected", "tolerance", "shapes"):
        case.pop(key, None)
    request["output_dir"] = str(folder / "out")
    request["timing"] = {**TIMING, **(request.get("timing") or {}), "repeat": 300}
    path = folder / "request.json"
    path.write_text(json.dumps(request))
    return path


def with_repeat(request_path: Path, work: Path, label: str) -> Path:
    request = json.loads(request_path.read_text())
    base = Path(request.get("base_dir") or request_path.parent)
    for case in request["cases"]:
        for spec in case["buffers"].values():
            if "input" in spec:
                spec["input"] = str(base / spec["input"])
        case["expected"] = {k: str(base / v) for k, v in case.get("expected", {}).items()}
    request["timing"] = {**TIMING, **(request.get("timing") or {}), "repeat": 300}
    path = work / f"{label.replace(' ', '_').replace('×', 'x').replace('³', '3')}.json"
    path.write_text(json.dumps(request))
    return path


def tree_env(tree: Path) -> dict:
    """The environment in which ``python -m`` runs ``tree``'s cudagate (its worker too), from ``tree``
    (``-m`` puts the working directory first on the path)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "harness"), os.environ.get("PYTHONPATH", "")])}


def cudagate_ms(request: Path, tree: Path = ROOT) -> float:
    """``cudagate run REQUEST`` with ``tree``'s code (client and worker); the request's paths are absolute."""
    env = tree_env(tree) if tree != ROOT else None
    answer = json.loads(run([sys.executable, "-m", "pytest_cudagate.cli", "run", str(request)], cwd=tree, env=env))
    return float(np.median(answer["cases"][0]["timing"]["samples_ms"]))


def ncu_ms(spec: Path, labels: list[str], entries: dict[str, str]) -> dict[str, float]:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    text = run([ncu, "--metrics", "gpu__time_duration.sum", "--cache-control", "all", "--clock-control", "none",
                "--csv", "--print-units", "base", sys.executable, str(HERE / "kernel_timers.py"), "loop", str(spec),
                str(NCU_LAUNCHES)], timeout=500)
    body = "\n".join(line for line in text.splitlines() if line.startswith('"'))  # drop ==PROF== lines
    rows = [r for r in csv.DictReader(io.StringIO(body)) if r.get("Metric Name") == "gpu__time_duration.sum"]
    ours = [r for r in rows if r["Kernel Name"].split("(")[0] in set(entries.values())]
    ours.sort(key=lambda r: int(r["ID"]))
    if len(ours) != NCU_LAUNCHES * len(labels):
        raise RuntimeError(f"ncu profiled {len(ours)} of {NCU_LAUNCHES * len(labels)} launches:\n{text[-2000:]}")
    values = [float(r["Metric Value"].replace(",", "")) * UNITS[r["Metric Unit"]] for r in ours]
    return {label: float(np.median(values[i * NCU_LAUNCHES:(i + 1) * NCU_LAUNCHES])) for i, label in enumerate(labels)}


def cell(values: list[float], reference: list[float] | None = None) -> str:
    if not values:
        return "—"
    text = f"{np.median(values) * 1000:.2f} [{min(values) * 1000:.2f}, {max(values) * 1000:.2f}]"
    if reference:
        text += f" ({(np.median(values) / np.median(reference) - 1) * 100:+.1f} %)"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two kernels, one process per tool")
    parser.add_argument("--procs", type=int, help="fresh processes per tool (default 5; ncu: 3)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tree", type=Path, help="also replay every request with this checkout's code")
    args = parser.parse_args(argv)
    if args.tree is not None and not (args.tree / "pytest_cudagate" / "cli.py").is_file():
        parser.error(f"--tree {args.tree}: no pytest_cudagate/cli.py there; give a checkout of this repository")
    procs = args.procs or (1 if args.quick else 5)
    ncu_procs = 1 if args.quick else min(procs, 3)
    labels = list(QUICK if args.quick else CASES)
    started = time.perf_counter()
    other = f"cudagate ({args.tree})" if args.tree is not None else None
    tools = ("cudagate", "nvbench", "ncu", "do_bench") + ((other,) if other else ())
    results: dict[str, dict[str, list[float]]] = {tool: {label: [] for label in labels} for tool in tools}
    errors = []
    with tempfile.TemporaryDirectory(prefix="cudagate-fidelity-") as tmp:
        work = Path(tmp)
        saved = gate_requests(work)
        requests, entries = {}, {}
        for label in labels:
            suite, case, factor = CASES[label]
            source = saved[suite, case]
            requests[label] = scaled(source, factor, work) if factor else with_repeat(source, work, label)
            entries[label] = json.loads(requests[label].read_text())["kernel"]["entry"]
        spec = work / "spec.json"
        spec.write_text(json.dumps({"kernels": [{"label": label, "request": str(requests[label])} for label in labels]}))
        for proc in range(procs):
            for label in labels:
                results["cudagate"][label].append(cudagate_ms(requests[label]))
                if other:
                    results[other][label].append(cudagate_ms(requests[label], args.tree.resolve()))
            out = work / f"nvbench-{proc}.json"
            try:
                run([sys.executable, str(HERE / "nvbench_probe.py"), str(spec), str(out)])
                for label, entry in json.loads(out.read_text()).items():
                    results["nvbench"][label].append(entry["median_s"] * 1000)
            except RuntimeError as exc:
                errors.append(f"nvbench: {exc}")
            out = work / f"do_bench-{proc}.json"
            try:
                run([sys.executable, str(HERE / "kernel_timers.py"), "do_bench", str(spec), str(out)])
                for label, ms in json.loads(out.read_text()).items():
                    results["do_bench"][label].append(ms)
            except RuntimeError as exc:
                errors.append(f"do_bench: {exc}")
            if proc < ncu_procs:
                try:
                    for label, ms in ncu_ms(spec, labels, entries).items():
                        results["ncu"][label].append(ms)
                except (RuntimeError, ValueError, KeyError) as exc:
                    errors.append(f"ncu: {exc}")
            print(f"process round {proc + 1} of {procs} done at {time.perf_counter() - started:.0f} s",
                  file=sys.stderr, flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python benchmarks/timing_fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    # Every card of the host (name, driver, UUID), kept with the figures; the processes use CUDA device 0.
    try:
        cards = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:  # no nvidia-smi: the figures are still written
        cards = []
    gpu = ", ".join(cards[0].split(", ")[:2]) if cards else ""
    print(f"<!-- {command} — {now} — {gpu} -->\n")
    print("| kernel | cudagate cold µs | nvbench cold µs | ncu gpu__time_duration µs | do_bench cold µs |"
          + (f" {other} cold µs |" if other else ""))
    print("|---|---|---|---|---|" + ("---|" if other else ""))
    for label in labels:
        ref = results["cudagate"][label]
        print(f"| {label} | {cell(ref)} | {cell(results['nvbench'][label], ref)} | {cell(results['ncu'][label], ref)} | "
              f"{cell(results['do_bench'][label], ref)} |" + (f" {cell(results[other][label], ref)} |" if other else ""))
    print(f"\nmedian [min, max] over fresh processes (cudagate, nvbench, do_bench: {procs}; ncu: {ncu_procs}); "
          "in brackets after a peer: its median against cudagate's")
    for error in errors:
        print(f"\nnot measured: {error[:1500]}")
    if args.json:
        document = with_header({"command": command, "date": now, "gpus": cards, "results": results, "errors": errors},
                               __file__, argv, "; ".join(cards) or None)
        found = schema.problems(document, "timing-fidelity")
        if found:  # a bug of this script: say so, but keep the measurements
            print(f"\n{args.json}: {found[0]} (schemas/timing-fidelity.schema.json)", file=sys.stderr)
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
