"""How often the latency gate catches a real slowdown, and how often it cries wolf: every tool as its
users run it, one fresh process per comparison, each slowdown measured by nvbench.

    python benchmarks/gate_power.py [--quick] [--reps R] [--truth-procs 10] [--gpus N] [--json OUT.json]
    python benchmarks/gate_power.py --targets 0,3,5 --gate-only --json rerun.json  # the gate's rows only
    python benchmarks/gate_power.py --aa-only 200 --json aa-session1.json      # A/A false alarms only
    python benchmarks/gate_power.py --merge aa-session1.json aa-session2.json  # tables over several runs
    python benchmarks/gate_power.py --suites rmsnorm,split_reduce --targets 0,3,5 --gate-only  # other examples
    python benchmarks/gate_power.py --suites attention --targets 0,3,5 --gate-only  # cuBLAS, memset and kernels

``--gpus N`` (default: every GPU NVML sees) runs N independent streams of comparisons at once, stream i
pinned to card i through CUDA_VISIBLE_DEVICES (by UUID); every comparison is still a fresh process with
its own report folder, and every row records its card. In the A/A summary each card counts as its own
machine. Before anything runs on the GPU, the peer tools' versions are checked in a subprocess with the
peers' environment, so a pytest-benchmark that cannot run under the installed pytest stops the run with
one line instead of one error row per comparison.

For the first performance case of each example suite, the shipped kernel is approved (``cudagate
approve``), then copies slowed by a clock64() spin at the start of every block are judged against it.
The spin for each target slowdown is calibrated by nvbench first; the TRUE slowdown of every variant is
then measured by nvbench (cuda-bench, cold L2, its own stopping rule) in ``--truth-procs`` fresh
processes, independently of the gate's estimator, and reported as median [min, max] over them.

Each comparison is a process of its own, as in CI:
- cudagate: ``pytest --cuda-gate`` on the variant (fresh worker, allocations, random orders);
- pytest-benchmark: ``--benchmark-autosave`` on the approved kernel in one process, then
  ``--benchmark-compare --benchmark-compare-fail=median:2%`` on the variant in another;
- gpucheck 0.1.0: its ``gpu_benchmark`` fixture in the same two processes, its ``detect_regression`` at
  its defaults (two-sided Mann-Whitney p < 0.05 and a median ratio >= 1.1) and at ``min_effect=1.02``;
- asv's rule (two-sided Mann-Whitney p < 0.002 and a median ratio above ``--factor``, 1.1 by default)
  on the separate runs' raw samples (pytest-benchmark's, timed the way asv times: host clock).
A second table applies the rules alone to the very samples the gate measured interleaved (the same
samples), which no peer gets in real use. Needs a GPU, torch, cupy, cuda-bench, gpucheck and
pytest-benchmark>=5.3.1 (5.2.3 fails under pytest 9.2). ``--json`` files: schemas/gate-power.schema.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pynvml
import yaml
from packaging.version import InvalidVersion, Version
from scipy.stats import beta, mannwhitneyu

from evidence_header import with_header
from pytest_cudagate.boundary import schema
from pytest_cudagate.judge import stats
from pytest_cudagate.xdist_hooks import gpu_count

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
SUITES = ("matmul", "softmax")
TARGETS = (0.0, 0.015, 0.025, 0.03, 0.05, 0.10)
THRESHOLD = 0.02
ASSUMED_GHZ = 1.98  # only sizes the calibration spin; every slowdown used is measured
PEER_TOOLS = ("pytest", "pytest-benchmark", "gpucheck")
# pytest 9.2 dropped the private Node._nodeid that pytest-benchmark's fixture read up to 5.3.0
# (seen on the H200 with 5.2.3: AttributeError at fixture.py:85; 5.3.1 runs)
NODEID_GONE, BENCHMARK_FIXED = Version("9.2"), Version("5.3.1")


class UsageError(Exception):
    """Bad input or an environment the run cannot use: one line, exit code 2."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: list[str], cwd: Path = ROOT, env: dict | None = None, timeout: float = 180) -> tuple[int, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = -9, f"timed out after {timeout} s: {exc.stdout or ''}"
    return code, text, time.perf_counter() - start


# -- cards and streams -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    """One card of this host and the CUDA_VISIBLE_DEVICES value that pins a process to it."""

    index: int  # the stream's number
    uuid: str  # "" where NVML could not name the card
    name: str
    pin: str | None  # None: no pin, CUDA's own choice

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.pin} if self.pin else {}

    def to_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "name": self.name}


UNPINNED = Gpu(0, "", "unknown GPU", None)


def visible_gpus() -> list[Gpu]:
    """The cards the plugin's ``-n auto`` spreads over (NVML's count narrowed by CUDA_VISIBLE_DEVICES,
    no CUDA context), each pinned by UUID: CUDA's own device numbering need not follow NVML's."""
    count = gpu_count()
    if not count:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [d.strip() for d in visible.split(",") if d.strip()] if visible is not None else list(map(str, range(count)))
    pynvml.nvmlInit()  # gpu_count's NVML session may be closed; init is reference counted
    gpus = []
    for index, entry in enumerate(entries[:count]):
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(entry))
            uuid, name = str(pynvml.nvmlDeviceGetUUID(handle)), str(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError:  # e.g. a MIG instance NVML does not resolve: pinned as the user named it
            uuid, name = entry, "unknown GPU"
        gpus.append(Gpu(index, uuid, name, uuid))
    return gpus


def describe(gpus: list[Gpu]) -> str:
    """``2× NVIDIA H200 (driver 580.159.04)`` for the meta line."""
    try:
        driver = f" (driver {pynvml.nvmlSystemGetDriverVersion()})"
    except pynvml.NVMLError:
        driver = ""
    return ", ".join(f"{n}× {name}" for name, n in Counter(g.name for g in gpus).items()) + driver


def streams_for(requested: int | None, gpus: list[Gpu]) -> list[Gpu]:
    """``--gpus``: the first ``requested`` visible cards (all by default); one unpinned stream without NVML."""
    available = max(1, len(gpus))
    count = available if requested is None else requested
    if count < 1:
        raise UsageError(f"--gpus {count}: give at least 1")
    if count > available:
        raise UsageError(f"--gpus {count}: NVML sees only {len(gpus)} GPU(s) here "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): ask for fewer")
    return gpus[:count] or [UNPINNED]


def run_streams(gpus: list[Gpu], total: int, job: Callable[[Gpu, int], list[dict]], deadline_s: float = float("inf"),
                clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Jobs 0..total-1 on ``len(gpus)`` concurrent streams: stream i runs jobs i, i+N, i+2N, ... one after
    another on ``gpus[i]``, so no two of our processes time on one card at once. A stream starts no job
    that would end past ``deadline_s`` (from now), judged by its slowest job so far. Every row a job
    returns gets the card it ran on."""
    started = clock()

    def stream(gpu: Gpu, numbers: range) -> list[dict]:
        rows, slowest = [], 0.0
        for n in numbers:
            if clock() - started + slowest > deadline_s:
                log(f"GPU {gpu.index}: deadline, stopped before job {n} ({numbers.index(n)} of {len(numbers)} done)")
                break
            job_started = clock()
            rows += [{**row, "gpu": gpu.index, "gpu_uuid": gpu.uuid} for row in job(gpu, n)]
            slowest = max(slowest, clock() - job_started)
        return rows

    with ThreadPoolExecutor(max_workers=len(gpus)) as pool:
        futures = [pool.submit(stream, gpu, range(i, total, len(gpus))) for i, gpu in enumerate(gpus)]
        return [row for future in futures for row in future.result()]


# -- the peers' environment --------------------------------------------------------------------------

def peers_env(gpu: Gpu) -> dict[str, str]:
    # PYTEST_ADDOPTS may block gpucheck for the test suite; the peers' processes need its fixture
    return {"PYTEST_ADDOPTS": "", **gpu.env()}


PROBE = ("import importlib.metadata as m, json\n"
         "def version(name):\n"
         "    try:\n        return m.version(name)\n"
         "    except m.PackageNotFoundError:\n        return None\n"
         f"print('peer-tools', json.dumps({{n: version(n) for n in {PEER_TOOLS!r}}}))\n")


def check_peer_tools(env: dict[str, str]) -> dict[str, str]:
    """The versions the peers' pytest processes will import (same interpreter, same environment), or
    UsageError with the one fix, before any GPU time is spent on comparisons that cannot run."""
    code, text, _ = run([sys.executable, "-c", PROBE], env=env, timeout=120)
    found = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("peer-tools ")]
    if code != 0 or not found:
        raise UsageError(f"{sys.executable} could not report the peer tools' versions (exit {code}): {text.strip()[-300:]}")
    versions = json.loads(found[0])
    missing = [name for name in PEER_TOOLS if versions.get(name) is None]
    if missing:
        raise UsageError(f"{' and '.join(missing)} not installed for {sys.executable}: carry the wheel of each to "
                         f"this machine (pytest-benchmark>={BENCHMARK_FIXED} under pytest>={NODEID_GONE})")
    try:
        pytest_v, bench_v = Version(versions["pytest"]), Version(versions["pytest-benchmark"])
    except InvalidVersion as exc:
        raise UsageError(f"unreadable peer tool version ({exc}): reinstall pytest and pytest-benchmark") from None
    if pytest_v >= NODEID_GONE and bench_v < BENCHMARK_FIXED:
        raise UsageError(f"pytest-benchmark {bench_v} does not run under pytest {pytest_v} (its fixture reads "
                         f"Node._nodeid, gone since pytest {NODEID_GONE}): carry pytest-benchmark>={BENCHMARK_FIXED} "
                         f"with the other wheels, or run the peers under pytest<{NODEID_GONE}")
    return versions


# -- the kernels -------------------------------------------------------------------------------------

def variant_label(target: float) -> str:
    return "A/A" if target == 0 else f"+{target * 100:g}%"


def slowed(source: str, entry: str, cycles: int) -> str:
    """``source`` with a spin of ``cycles`` at the start of ``entry`` (a comment for 0: the A/A copy,
    which the gate must compare interleaved because its bytes differ from the approved version)."""
    if cycles <= 0:
        return source + "\n// identical copy (A/A)\n"
    name = entry.split("<", 1)[0].strip()  # a templated entry's spin goes into its template
    match = re.search(r"__global__\s+void\s+" + re.escape(name) + r"\s*\([^)]*\)\s*\{", source)
    if match is None:
        raise ValueError(f"no __global__ {entry}(...) {{ in the kernel source")
    spin = f"\n    {{ const long long t0 = clock64(); while (clock64() - t0 < {cycles}) {{ }} }}\n"
    return source[: match.end()] + spin + source[match.end():]


@dataclass
class Prepared:
    """One example suite reduced to its first performance case, approved on this GPU."""

    name: str
    root: Path
    source_file: str
    entry: str
    case: str
    request: Path  # the run request the gate saved for the approved kernel's case
    base_us: float

    def variant(self, label: str, source: str) -> Path:
        folder = self.root.parent / re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(self.root, folder)
        (folder / self.source_file).write_text(source)
        return folder / "cudagate.yaml"

    @property
    def source(self) -> str:
        return (self.root / self.source_file).read_text()


# A gate process loads cudagate as its only pytest plugin, as in a CI venv: this machine's image carries
# other projects' plugins (gpucheck imports torch) that cost seconds per process and decide nothing.
GATE_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": "pytest_cudagate.plugin"}


def gate_args(paths: list[Path], report: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "--cuda-gate", *map(str, paths),
            "--cuda-gate-require-gpu", "--cuda-gate-allow-unsigned", "--cuda-gate-report", str(report),
            "-p", "no:cacheprovider", "-q"]


def prepare(name: str, work: Path, env: dict[str, str], case: str | None = None) -> Prepared:
    """Example suite ``name`` reduced to one performance case (``case``, default its first that is no
    holdout) and its first kernel, approved on this GPU."""
    root = work / name / "approved"
    shutil.copytree(ROOT / "examples" / name, root,
                    ignore=shutil.ignore_patterns("approved", "cudagate.approvals.json", "cudagate.sig.json"))
    raw = yaml.safe_load((root / "cudagate.yaml").read_text())
    case = next(c for c in raw["cases"] if c["name"] == case or (case is None and c["kind"] == "performance"
                                                                and not c.get("holdout")))
    kernel = raw["kernels"][0]
    raw["kernels"], raw["cases"] = [kernel], [case]
    raw["checks"] = {"sanitizer": "off"}  # runs once per new kernel; says nothing about latency
    # A generated case's arrays live only in a gate run's folder: store them in this copy, so the saved
    # request that nvbench replays names files that are still there.
    generated = bool(case.pop("generated", False))
    (root / "cudagate.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False))
    if generated:
        code, text, _ = run([sys.executable, "-m", "pytest_cudagate.cli", "cases", "generate", str(root / "cudagate.yaml"),
                             "--case", case["name"]], cwd=root, env=env)
        if code != 0:
            raise RuntimeError(f"cudagate cases generate failed for {name}:\n{text[-3000:]}")
    code, text, _ = run([sys.executable, "-m", "pytest_cudagate.cli", "approve", str(root / "cudagate.yaml"),
                         "--approved-by", "gate-power"], cwd=root, env=env)
    if code != 0:
        raise RuntimeError(f"cudagate approve failed for {name}:\n{text[-3000:]}")
    report = work / name / "report-approved"
    code, text, _ = run(gate_args([root / "cudagate.yaml"], report), cwd=root, env={**env, **GATE_ENV})
    item = perf_item(report, text)
    requests = [report / r for r in item.get("requests", []) if not r.endswith("-approved.json")]
    if not requests:
        raise RuntimeError(f"{name}: the gate saved no request for {case['name']}:\n{text[-3000:]}")
    samples = (item.get("samples_ms") or {}).get("current") or (item.get("samples_ms") or {}).get("approved")
    base_us = float(np.median(samples)) * 1000 if samples else 15.0
    # the kernel's first launch (a memset, copy or library step before it has no source to slow)
    entry = (next(s["entry"] for s in kernel["steps"] if "entry" in s) if "steps" in kernel
             else kernel.get("entry", kernel["name"]))
    return Prepared(name, root, kernel["source"], entry, case["name"], requests[0], base_us)


def perf_item(report: Path, output: str) -> dict:
    path = report / "report.json"
    if not path.is_file():
        raise RuntimeError(f"no {path}; the gate said:\n{output[-3000:]}")
    items = [i for i in json.loads(path.read_text())["items"] if i.get("kind") == "performance"]
    if len(items) != 1:
        raise RuntimeError(f"{path}: expected one performance item, found {len(items)}:\n{output[-2000:]}")
    return items[0]


def nvbench(kernels: list[dict], work: Path, env: dict[str, str]) -> dict:
    """One fresh nvbench process over ``kernels``; cold median seconds per label."""
    spec, out = Path(tempfile.mkstemp(suffix=".json", dir=work)[1]), Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    spec.write_text(json.dumps({"kernels": kernels}))
    code, text, _ = run([sys.executable, str(HERE / "nvbench_probe.py"), str(spec), str(out)], env=env, timeout=300)
    if code != 0:
        raise RuntimeError(f"nvbench probe failed:\n{text[-3000:]}")
    return {label: entry["median_s"] for label, entry in json.loads(out.read_text()).items()}


def calibrate(prepared: list[Prepared], targets: tuple[float, ...], work: Path,
              env: dict[str, str]) -> dict[tuple[str, float], int]:
    """Spin cycles per (suite, target): nvbench measures a reference spin, the rest scales linearly."""
    probes = []
    for p in prepared:
        ref = max(200, int(0.05 * p.base_us * 1000 * ASSUMED_GHZ))
        probes += [{"label": f"{p.name}-base", "request": str(p.request), "source": p.source},
                   {"label": f"{p.name}-ref", "request": str(p.request), "source": slowed(p.source, p.entry, ref)}]
    medians = nvbench(probes, work, env)
    cycles = {}
    for p in prepared:
        ref = max(200, int(0.05 * p.base_us * 1000 * ASSUMED_GHZ))
        per_cycle = (medians[f"{p.name}-ref"] / medians[f"{p.name}-base"] - 1) / ref
        if per_cycle <= 0:
            raise RuntimeError(f"{p.name}: a {ref}-cycle spin did not slow the kernel down (nvbench: {medians})")
        for t in targets:
            cycles[p.name, t] = int(round(t / per_cycle)) if t else 0
        log(f"{p.name}: base {medians[f'{p.name}-base'] * 1e6:.2f} µs (nvbench); "
            f"{ref} cycles -> {per_cycle * ref * 100:+.2f}%")
    return cycles


# -- one comparison per process ------------------------------------------------------------------------

def gate_process(suite_yaml: Path, report: Path, env: dict[str, str], timeout: float = 180) -> tuple[dict, dict]:
    """One fresh gate process on ``suite_yaml``: its performance item (empty where it wrote none) and
    the process's exit code and wall time (or the error)."""
    code, text, wall = run(gate_args([suite_yaml], report), cwd=suite_yaml.parent, env={**env, **GATE_ENV},
                           timeout=timeout)
    try:
        return perf_item(report, text), {"exit": code, "wall_s": wall}
    except RuntimeError as exc:
        return {}, {"error": str(exc)[-1500:], "wall_s": wall}


def gate_comparison(suite_yaml: Path, report: Path, env: dict[str, str]) -> dict:
    item, process = gate_process(suite_yaml, report, env)
    if "error" in process:
        return process
    latency = item.get("latency") or {}
    estimate = latency.get("estimate") or {}
    samples = item.get("samples_ms") or {}
    return {"verdict": latency.get("verdict"), "status": item.get("status"), "ratio": estimate.get("ratio"),
            "low": estimate.get("low"), "high": estimate.get("high"), "pairs": latency.get("pairs"),
            "measurement_s": latency.get("measurement_s"), **process,
            "approved": samples.get("approved"), "current": samples.get("current")}


def peers_process(mode: str, kernels: dict, storage: Path, extra: list[str],
                  env: dict[str, str]) -> tuple[int, str, dict, dict]:
    """One pytest process of benchmarks/peers on one kernel version per suite."""
    spec = storage / f"spec-{mode}-{time.monotonic_ns()}.json"
    gpucheck_out = storage / f"gpucheck-{time.monotonic_ns()}.json"
    bench_json = storage / f"bench-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps({"mode": mode, "kernels": kernels, "gpucheck_baseline": str(storage / "gpucheck.json"),
                                "gpucheck_out": str(gpucheck_out)}))
    args = [sys.executable, "-m", "pytest", str(HERE / "peers"), "-p", "no:cacheprovider", "-p", "no:cudagate",
            "-q", f"--benchmark-storage=file://{storage / 'pytest-benchmark'}", "--benchmark-save-data",
            f"--benchmark-json={bench_json}", *extra]
    code, text, _ = run(args, env={"CUDAGATE_PEERS": str(spec), **env}, timeout=300)
    raw = {}
    try:
        for b in json.loads(bench_json.read_text())["benchmarks"]:
            raw[b["param"]] = b["stats"].get("data") or []
    except (OSError, ValueError, KeyError) as exc:  # the row says "error"; the log says why
        log(f"peers ({mode}): no pytest-benchmark data in {bench_json.name} ({exc!r}); exit {code}:\n{text[-2500:]}")
    verdicts = json.loads(gpucheck_out.read_text()) if gpucheck_out.is_file() else {}
    return code, text, raw, verdicts


def asv_flags(current: list[float], approved: list[float], factor: float) -> bool:
    """asv compare's rule: a two-sided Mann-Whitney U p < 0.002 and a median ratio above ``factor``."""
    if factor == 1.1:
        return stats.rule_asv(current, approved)
    p = mannwhitneyu(current, approved, alternative="two-sided").pvalue
    return bool(p < 0.002 and np.median(current) / np.median(approved) > factor)


def peers_rep(prepared: list[Prepared], variants: dict, rep: int, work: Path, env: dict[str, str]) -> list[dict]:
    storage = work / f"peers-rep{rep}"
    storage.mkdir(parents=True)
    base = {p.name: {"request": str(p.request), "source": p.source} for p in prepared}
    code, text, base_raw, _ = peers_process("baseline", base, storage, ["--benchmark-autosave"], env)
    if code != 0:
        return [{"tool": "peers", "rep": rep, "error": text[-1500:]}]
    rows = []
    for target in sorted({t for (_, t) in variants}):
        kernels = {p.name: {"request": str(p.request), "source": variants[p.name, target]} for p in prepared}
        code, text, raw, gpucheck = peers_process("compare", kernels, storage,
                                                  ["--benchmark-compare", "--benchmark-compare-fail=median:2%"], env)
        failed = [line for line in text.splitlines() if "has failed" in line]
        for p in prepared:
            row = {"suite": p.name, "target": target, "rep": rep, "exit": code}
            if p.name not in raw or p.name not in gpucheck:
                row["error"] = text[-1500:]
            else:
                row.update({
                    "pytest-benchmark median:2%": any(f"test_pytest_benchmark[{p.name}]" in line for line in failed),
                    "gpucheck default": gpucheck[p.name]["default"]["regression"],
                    "gpucheck min_effect 1.02": gpucheck[p.name]["min_effect_1.02"]["regression"],
                    "asv factor 1.1": asv_flags(raw[p.name], base_raw[p.name], 1.1),
                    "asv factor 1.02": asv_flags(raw[p.name], base_raw[p.name], 1.02),
                    "host median ratio": float(np.median(raw[p.name]) / np.median(base_raw[p.name]))})
            rows.append({"tool": "peers", **row})
    return rows


def same_samples(row: dict) -> dict:
    """The peers' rules alone, applied to the interleaved samples the gate measured."""
    cur, app = row["current"], row["approved"]
    return {"median:2%": stats.rule_median_percent(cur, app, 2.0), "median:5%": stats.rule_median_percent(cur, app, 5.0),
            "MWU p<.05 & >=1.1 (gpucheck, one-sided)": stats.rule_mann_whitney(cur, app, p=0.05, min_ratio=1.1),
            "MWU p<.002 & >1.1 (asv)": stats.rule_asv(cur, app)}


# -- the runs ------------------------------------------------------------------------------------------

def parse_suites(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if not (ROOT / "examples" / n / "cudagate.yaml").is_file()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: name example suites under examples/, e.g. matmul,softmax")
    return names


def parse_targets(text: str) -> tuple[float, ...]:
    """``--targets 0,3,5``: slowdowns in percent, A/A as 0; each from 0 to 50, none twice."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of percents: write e.g. 0,3,5") from None
    if any(not 0 <= v <= 50 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: each slowdown from 0 to 50 (percent), none twice: write e.g. 0,3,5")
    return tuple(sorted(v / 100 for v in values))


def measure(args, gpus: list[Gpu], work: Path, meta: dict) -> list[dict]:
    if not args.gate_only:
        meta["peers"] = check_peer_tools(peers_env(gpus[0]))  # before any GPU time is spent
    suites = ("matmul",) if args.quick and args.suites == SUITES else args.suites
    targets = args.targets or ((0.0, 0.05) if args.quick else TARGETS)
    started = time.perf_counter()
    first = gpus[0].env()
    prepared = [prepare(name, work, first) for name in suites]
    cycles = calibrate(prepared, targets, work, first)
    variants = {(p.name, t): slowed(p.source, p.entry, cycles[p.name, t]) for p in prepared for t in targets}
    folders = {(p.name, t): p.variant(variant_label(t), variants[p.name, t]) for p in prepared for t in targets}
    rows = [{"tool": "spin", "suite": p.name, "target": t, "cycles": cycles[p.name, t]} for p in prepared for t in targets]

    def truth(gpu: Gpu, proc: int) -> list[dict]:
        probes = [{"label": f"{p.name}-base", "request": str(p.request), "source": p.source} for p in prepared]
        probes += [{"label": f"{p.name}-{t}", "request": str(p.request), "source": variants[p.name, t]}
                   for p in prepared for t in targets]
        medians = nvbench(probes, work, gpu.env())
        return [{"tool": "nvbench", "suite": p.name, "target": t, "proc": proc,
                 "ratio": medians[f"{p.name}-{t}"] / medians[f"{p.name}-base"],
                 "base_us": medians[f"{p.name}-base"] * 1e6} for p in prepared for t in targets]

    def repetition(gpu: Gpu, rep: int) -> list[dict]:
        out = []
        for p in prepared:
            for t in targets:
                result = gate_comparison(folders[p.name, t], work / "reports" / f"{p.name}-{t}-{rep}", gpu.env())
                out.append({"tool": "cudagate", "suite": p.name, "case": p.case, "target": t, "rep": rep, **result})
                if "error" in result:
                    log(f"cudagate {p.name} {variant_label(t)} on GPU {gpu.index}: {result['error']}")
        if not args.gate_only:
            out += peers_rep(prepared, variants, rep, work, peers_env(gpu))
        log(f"repetition {rep + 1} done on GPU {gpu.index} at {time.perf_counter() - started:.0f} s")
        return out

    rows += run_streams(gpus, args.truth_procs, truth)
    log(f"truth measured ({args.truth_procs} nvbench processes on {len(gpus)} GPU(s)) at "
        f"{time.perf_counter() - started:.0f} s")
    rows += run_streams(gpus, args.reps, repetition, deadline_s=args.deadline - (time.perf_counter() - started))
    return [{**row, "session": meta["session"]} for row in rows]


def measure_aa(args, gpus: list[Gpu], work: Path, meta: dict) -> list[dict]:
    """``--aa-only N``: N A/A comparisons, each in a fresh gate process, alternating the suites."""
    started = time.perf_counter()
    prepared = [prepare(name, work, gpus[0].env()) for name in args.suites]
    folders = {p.name: p.variant("A/A", slowed(p.source, p.entry, 0)) for p in prepared}

    def comparison(gpu: Gpu, n: int) -> list[dict]:
        p = prepared[n % len(prepared)]
        result = gate_comparison(folders[p.name], work / "reports" / f"aa-{n}", gpu.env())
        if "error" in result:
            log(f"A/A {n} on GPU {gpu.index}: {result['error']}")
        return [{"tool": "cudagate", "suite": p.name, "case": p.case, "target": 0.0, "rep": n,
                 "session": meta["session"], **result}]

    return run_streams(gpus, args.aa_only, comparison, deadline_s=args.deadline - (time.perf_counter() - started))


# -- tables --------------------------------------------------------------------------------------------

def pct(flags: list[bool]) -> str:
    return f"{sum(flags) / len(flags):.0%} ({sum(flags)}/{len(flags)})" if flags else "—"


def upper95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate seen k times in n."""
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def card_of(row: dict) -> str:
    """A card's identity across sessions: its UUID, or (rows without one) the session's stream."""
    return row.get("gpu_uuid") or f"{row['session']}/gpu{row.get('gpu', 0)}"


def sources(metas: list[dict], merged: str | None) -> list[str]:
    """The runs behind a table: command, date, GPUs, session, peer versions; and the merge command."""
    out = [f"Merged by `{merged}` from:" if merged else "Measured by:", ""]
    for meta in metas:
        peers = meta.get("peers")
        versions = f" — {', '.join(f'{k} {v}' for k, v in peers.items())}" if peers else ""
        out.append(f"- `{meta['command']}` — {meta['date']} — {meta['gpu']} — session `{meta['session']}`{versions}")
    return out + [""]


def aa_cards(aa: list[dict], metas: list[dict]) -> list[str]:
    """Per card: A/A comparisons, false alarms and the sessions it served in."""
    names = {g["uuid"]: g["name"] for meta in metas for g in meta.get("gpus", []) if g.get("uuid")}
    head = ("card (UUID)", "GPU", "sessions", "A/A comparisons", "regressed", "inconclusive", "improved")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for card in sorted({card_of(r) for r in aa}):
        mine = [r for r in aa if card_of(r) == card]
        out.append("| " + " | ".join([
            f"`{card}`", names.get(card, "—"), str(len({r["session"] for r in mine})), str(len(mine)),
            str(sum(r["verdict"] == "regressed" for r in mine)),
            str(sum(r["verdict"] == "inconclusive" for r in mine)),
            str(sum(r["verdict"] == "improved" for r in mine))]) + " |")
    return out


SKEW = 0.03  # an A/A process whose two copies' medians differ by more than this is counted as skewed
TAIL = 1.3  # a launch above this multiple of its copy's 10th percentile, in its process, is in the slow tail


def aa_symmetry(aa: list[dict]) -> list[str]:
    """Per suite: do the two identical copies read alike? Random order should make a skew in either
    direction equally likely; a one-sided count points at something that favours one role."""
    head = ("suite · case", "A/A comparisons", f"approved copy's median > {SKEW:.0%} above the current's",
            f"current copy's median > {SKEW:.0%} above the approved's", "gate's estimate: median [min, max]",
            "approved copy µs: median over processes",
            f"launches in the slow tail (> {TAIL:g}× the copy's 10th percentile): approved / current")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def tail(rows: list[dict], role: str) -> str:
        flags = np.concatenate([np.asarray(r[role]) > TAIL * np.percentile(r[role], 10) for r in rows])
        return f"{flags.mean():.0%}"

    for suite, case in sorted({(r["suite"], r["case"]) for r in aa}):
        mine = [r for r in aa if (r["suite"], r["case"]) == (suite, case) and r.get("approved") and r.get("current")]
        if not mine:  # rows of the first edition kept no samples
            continue
        skew = [float(np.median(r["approved"]) / np.median(r["current"])) for r in mine]
        out.append("| " + " | ".join([
            f"{suite} {case}", str(len(mine)), str(sum(s > 1 + SKEW for s in skew)),
            str(sum(s < 1 / (1 + SKEW) for s in skew)), estimate_cell(mine),
            f"{np.median([np.median(r['approved']) for r in mine]) * 1000:.2f}",
            f"{tail(mine, 'approved')} / {tail(mine, 'current')}"]) + " |")
    return out if len(out) > 2 else []


def estimate_cell(rows: list[dict]) -> str:
    """The gate's own ratio estimates of some comparisons, as a change in percent."""
    ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
    if not ratios:
        return "—"
    return (f"{(np.median(ratios) - 1) * 100:+.2f} % [{(min(ratios) - 1) * 100:+.2f}, {(max(ratios) - 1) * 100:+.2f}]"
            f" ({len(ratios)})")


def tables(rows: list[dict], metas: list[dict], merged: str | None = None) -> str:
    above = sources(metas, merged)
    gates = [r for r in rows if r["tool"] == "cudagate" and "error" not in r]
    keys = sorted({(r["suite"], r["target"]) for r in gates + [r for r in rows if r["tool"] == "nvbench"]})
    truth_of = {}
    for suite, target in keys:
        ratios = [r["ratio"] for r in rows if r["tool"] == "nvbench" and r["suite"] == suite and r["target"] == target]
        truth_of[suite, target] = (f"{(np.median(ratios) - 1) * 100:+.2f} % [{(min(ratios) - 1) * 100:+.2f}, "
                                   f"{(max(ratios) - 1) * 100:+.2f}] ({len(ratios)})" if ratios else "—")
    peer_cols = ("pytest-benchmark median:2%", "gpucheck default", "gpucheck min_effect 1.02", "asv factor 1.1",
                 "asv factor 1.02")
    head = ("suite · case", "variant", "true slowdown, nvbench: median [min, max] (processes)",
            "gate's own estimate: median [min, max]", "cudagate regressed", "cudagate inconclusive", *peer_cols,
            "gate process wall s, median / max")
    out = ["### Each tool as its users run it (a fresh process per comparison)", "", *above,
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suite, target in keys:
        mine = [r for r in gates if r["suite"] == suite and r["target"] == target]
        peers = [r for r in rows if r["tool"] == "peers" and r.get("suite") == suite and r.get("target") == target
                 and "error" not in r]
        walls = [r["wall_s"] for r in mine]
        case = mine[0]["case"] if mine else ""
        out.append("| " + " | ".join([
            f"{suite} {case}", variant_label(target), truth_of[suite, target], estimate_cell(mine),
            pct([r["verdict"] == "regressed" for r in mine]), pct([r["verdict"] == "inconclusive" for r in mine]),
            *(pct([bool(r[c]) for r in peers]) for c in peer_cols),
            f"{np.median(walls):.1f} / {max(walls):.1f}" if walls else "—"]) + " |")
    errors = [r for r in rows if "error" in r]
    if errors:
        out.append(f"\n{len(errors)} comparison(s) gave no verdict (see the JSON for their output).")

    aa = [r for r in gates if r["target"] == 0.0]
    if aa:
        k = sum(r["verdict"] == "regressed" for r in aa)
        cards, sessions = len({card_of(r) for r in aa}), len({r["session"] for r in aa})
        out += ["", "### A/A false alarms per card", "", *above, *aa_cards(aa, metas),
                f"\nA/A: cudagate said `regressed` in {k} of {len(aa)} comparisons, each in a fresh process, on "
                f"{cards} distinct card(s) over {sessions} session(s) (the cards of one host share it); 95 % upper "
                f"bound on the false-alarm rate {upper95(k, len(aa)):.1%}.",
                *(["", "Do the two identical copies read alike (per case, over the A/A comparisons with samples)?", "",
                   *symmetry] if (symmetry := aa_symmetry(aa)) else [])]

    rule_cols = ("median:2%", "median:5%", "MWU p<.05 & >=1.1 (gpucheck, one-sided)", "MWU p<.002 & >1.1 (asv)")
    head = ("suite · case", "variant", "cudagate regressed", *rule_cols, "median rounds")
    out += ["", "### the rule alone (same samples)", "", *above,
            "Each rule applied to the interleaved, drift-cancelled samples of the same cudagate comparisons "
            "(no peer gets such samples in real use).", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suite, target in keys:
        mine = [r for r in gates if r["suite"] == suite and r["target"] == target and r.get("current")]
        judged = [same_samples(r) for r in mine]
        pairs = [r["pairs"] for r in mine if r.get("pairs") is not None]
        out.append("| " + " | ".join([
            f"{suite} {mine[0]['case'] if mine else ''}", variant_label(target),
            pct([r["verdict"] == "regressed" for r in mine]), *(pct([j[c] for j in judged]) for c in rule_cols),
            f"{int(np.median(pairs))}" if pairs else "—"]) + " |")
    return "\n".join(out)


def load_runs(paths: list[Path]) -> list[dict]:
    """``--merge`` input: files written by ``--json``, each session once."""
    runs, seen = [], {}
    for path in paths:
        try:
            document = json.loads(path.read_text())
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror}): pass files written by --json") from None
        except ValueError as exc:
            raise UsageError(f"{path}: not JSON ({exc}): pass files written by --json") from None
        found = schema.problems(document, "gate-power")
        if found:
            raise UsageError(f"{path}: {found[0]} (schemas/gate-power.schema.json): pass files written by --json")
        session = document["meta"]["session"]
        if session in seen:
            raise UsageError(f"{path}: session {session} is already in {seen[session]}: pass each run once")
        seen[session] = path
        runs.append(document)
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: matmul, A/A and +5 %%, one repetition per GPU")
    parser.add_argument("--reps", type=int, help="comparisons per variant and tool, spread over the GPUs (default: "
                                                 "4 or one per GPU if more, as far as --deadline allows; with --quick "
                                                 "one per GPU)")
    parser.add_argument("--truth-procs", type=int, help="fresh nvbench processes (default 10; 2 with --quick)")
    parser.add_argument("--targets", type=parse_targets, metavar="P,P,...",
                        help="slowdowns in percent, 0 for A/A (default: 0,1.5,2.5,3,5,10; 0,5 with --quick)")
    parser.add_argument("--gate-only", action="store_true",
                        help="no peer tools: cudagate's comparisons and nvbench's truth only (peer columns read —)")
    parser.add_argument("--aa-only", type=int, metavar="N", help="only N A/A comparisons, a fresh process each")
    parser.add_argument("--gpus", type=int, metavar="N",
                        help="concurrent streams, one per GPU (default: every GPU NVML sees)")
    parser.add_argument("--deadline", type=float, default=420.0,
                        help="start no repetition or comparison that would end after this many seconds")
    parser.add_argument("--suites", type=parse_suites, default=SUITES, metavar="NAME,...",
                        help=f"example suites to compare on, their first performance case each (default {','.join(SUITES)}; "
                             "a kernel of steps is slowed in its first step)")
    parser.add_argument("--json", type=Path, help="write every comparison here (input of --merge)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON", help="print the tables of earlier runs")
    args = parser.parse_args(argv)
    try:
        if args.merge:
            runs = load_runs(args.merge)
            print(tables([r for run_ in runs for r in run_["rows"]], [run_["meta"] for run_ in runs],
                         merged="python benchmarks/gate_power.py " + " ".join(argv)))
            return 0
        found = visible_gpus()
        gpus = streams_for(args.gpus, found)
        args.reps = args.reps if args.reps is not None else (len(gpus) if args.quick else max(4, len(gpus)))
        args.truth_procs = args.truth_procs if args.truth_procs is not None else (2 if args.quick else 10)
        now = datetime.datetime.now(datetime.timezone.utc)
        meta = {"command": "python benchmarks/gate_power.py " + " ".join(argv),
                "date": now.strftime("%Y-%m-%d %H:%M UTC"), "gpu": describe(gpus) if found else "no GPU seen by NVML",
                "gpus": [g.to_json() for g in gpus],
                "session": f"{platform.node()}-{now.strftime('%Y%m%dT%H%M%S')}"}
        with tempfile.TemporaryDirectory(prefix="cudagate-power-") as tmp:
            rows = (measure_aa(args, gpus, Path(tmp), meta) if args.aa_only
                    else measure(args, gpus, Path(tmp), meta))
    except UsageError as exc:
        print(f"gate_power: {exc}", file=sys.stderr)
        return 2
    if args.json:
        card = f"{meta['gpu']}: {', '.join(g['uuid'] for g in meta['gpus']) or 'no uuid'}"
        args.json.write_text(json.dumps(with_header({"meta": meta, "rows": rows}, __file__, argv, card), indent=1))
    print(tables(rows, [meta]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
