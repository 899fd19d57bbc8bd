"""How often the latency gate catches a real slowdown, and how often it cries wolf: every tool as its
users run it, one fresh process per comparison, each slowdown measured by nvbench.

    python benchmarks/gate_power.py [--quick] [--reps 4] [--truth-procs 10] [--json OUT.json]
    python benchmarks/gate_power.py --aa-only 100 --json aa-session1.json      # A/A false alarms only
    python benchmarks/gate_power.py --merge aa-session1.json aa-session2.json  # tables over several runs

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
samples), which no peer gets in real use. Needs a GPU, torch, cupy, cuda-bench, gpucheck.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy.stats import beta, mannwhitneyu

from pytest_cudagate.judge import stats

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
SUITES = ("matmul", "softmax")
TARGETS = (0.0, 0.015, 0.025, 0.03, 0.05, 0.10)
THRESHOLD = 0.02
ASSUMED_GHZ = 1.98  # only sizes the calibration spin; every slowdown used is measured


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


def variant_label(target: float) -> str:
    return "A/A" if target == 0 else f"+{target * 100:g}%"


def slowed(source: str, entry: str, cycles: int) -> str:
    """``source`` with a spin of ``cycles`` at the start of ``entry`` (a comment for 0: the A/A copy,
    which the gate must compare interleaved because its bytes differ from the approved version)."""
    if cycles <= 0:
        return source + "\n// identical copy (A/A)\n"
    match = re.search(r"__global__\s+void\s+" + re.escape(entry) + r"\s*\([^)]*\)\s*\{", source)
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


def gate_args(paths: list[Path], report: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "--cuda-gate", *map(str, paths), "--cuda-gate-require-gpu",
            "--cuda-gate-allow-unsigned", "--cuda-gate-report", str(report), "-p", "no:cacheprovider",
            "-p", "no:gpucheck", "-q"]


def prepare(name: str, work: Path) -> Prepared:
    root = work / name / "approved"
    shutil.copytree(ROOT / "examples" / name, root,
                    ignore=shutil.ignore_patterns("approved", "cudagate.approvals.json", "cudagate.sig.json"))
    raw = yaml.safe_load((root / "cudagate.yaml").read_text())
    case = next(c for c in raw["cases"] if c["kind"] == "performance" and not c.get("holdout"))
    kernel = raw["kernels"][0]
    raw["kernels"], raw["cases"] = [kernel], [case]
    raw["checks"] = {"sanitizer": "off"}  # runs once per new kernel; says nothing about latency
    (root / "cudagate.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False))
    code, text, _ = run([sys.executable, "-m", "pytest_cudagate.cli", "approve", str(root / "cudagate.yaml"),
                         "--approved-by", "gate-power"], cwd=root)
    if code != 0:
        raise RuntimeError(f"cudagate approve failed for {name}:\n{text[-3000:]}")
    report = work / name / "report-approved"
    code, text, _ = run(gate_args([root / "cudagate.yaml"], report), cwd=root)
    item = perf_item(report, text)
    requests = [report / r for r in item.get("requests", []) if not r.endswith("-approved.json")]
    if not requests:
        raise RuntimeError(f"{name}: the gate saved no request for {case['name']}:\n{text[-3000:]}")
    samples = (item.get("samples_ms") or {}).get("current") or (item.get("samples_ms") or {}).get("approved")
    base_us = float(np.median(samples)) * 1000 if samples else 15.0
    entry = kernel.get("entry", kernel["name"])
    return Prepared(name, root, kernel["source"], entry, case["name"], requests[0], base_us)


def perf_item(report: Path, output: str) -> dict:
    path = report / "report.json"
    if not path.is_file():
        raise RuntimeError(f"no {path}; the gate said:\n{output[-3000:]}")
    items = [i for i in json.loads(path.read_text())["items"] if i.get("kind") == "performance"]
    if len(items) != 1:
        raise RuntimeError(f"{path}: expected one performance item, found {len(items)}:\n{output[-2000:]}")
    return items[0]


def nvbench(kernels: list[dict], work: Path) -> dict:
    """One fresh nvbench process over ``kernels``; cold median seconds per label."""
    spec, out = Path(tempfile.mkstemp(suffix=".json", dir=work)[1]), Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    spec.write_text(json.dumps({"kernels": kernels}))
    code, text, _ = run([sys.executable, str(HERE / "nvbench_probe.py"), str(spec), str(out)], timeout=300)
    if code != 0:
        raise RuntimeError(f"nvbench probe failed:\n{text[-3000:]}")
    return {label: entry["median_s"] for label, entry in json.loads(out.read_text()).items()}


def calibrate(prepared: list[Prepared], targets: tuple[float, ...], work: Path) -> dict[tuple[str, float], int]:
    """Spin cycles per (suite, target): nvbench measures a reference spin, the rest scales linearly."""
    probes = []
    for p in prepared:
        ref = max(200, int(0.05 * p.base_us * 1000 * ASSUMED_GHZ))
        probes += [{"label": f"{p.name}-base", "request": str(p.request), "source": p.source},
                   {"label": f"{p.name}-ref", "request": str(p.request), "source": slowed(p.source, p.entry, ref)}]
    medians = nvbench(probes, work)
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


def gate_comparison(suite_yaml: Path, report: Path) -> dict:
    code, text, wall = run(gate_args([suite_yaml], report), cwd=suite_yaml.parent)
    try:
        item = perf_item(report, text)
    except RuntimeError as exc:
        return {"error": str(exc)[-1500:], "wall_s": wall}
    latency = item.get("latency") or {}
    estimate = latency.get("estimate") or {}
    samples = item.get("samples_ms") or {}
    return {"verdict": latency.get("verdict"), "status": item.get("status"), "ratio": estimate.get("ratio"),
            "low": estimate.get("low"), "high": estimate.get("high"), "pairs": latency.get("pairs"),
            "measurement_s": latency.get("measurement_s"), "wall_s": wall, "exit": code,
            "approved": samples.get("approved"), "current": samples.get("current")}


def peers_process(mode: str, kernels: dict, storage: Path, extra: list[str]) -> tuple[int, str, dict, dict]:
    """One pytest process of benchmarks/peers on one kernel version per suite."""
    spec = storage / f"spec-{mode}-{time.monotonic_ns()}.json"
    gpucheck_out = storage / f"gpucheck-{time.monotonic_ns()}.json"
    bench_json = storage / f"bench-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps({"mode": mode, "kernels": kernels, "gpucheck_baseline": str(storage / "gpucheck.json"),
                                "gpucheck_out": str(gpucheck_out)}))
    args = [sys.executable, "-m", "pytest", str(HERE / "peers"), "-p", "no:cacheprovider", "-p", "no:cudagate",
            "-q", f"--benchmark-storage=file://{storage / 'pytest-benchmark'}", "--benchmark-save-data",
            f"--benchmark-json={bench_json}", *extra]
    # PYTEST_ADDOPTS may block gpucheck for the test suite; these processes need its fixture
    code, text, _ = run(args, env={"CUDAGATE_PEERS": str(spec), "PYTEST_ADDOPTS": ""}, timeout=300)
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


def peers_rep(prepared: list[Prepared], variants: dict, rep: int, work: Path) -> list[dict]:
    storage = work / f"peers-rep{rep}"
    storage.mkdir(parents=True)
    base = {p.name: {"request": str(p.request), "source": p.source} for p in prepared}
    code, text, base_raw, _ = peers_process("baseline", base, storage, ["--benchmark-autosave"])
    if code != 0:
        return [{"tool": "peers", "rep": rep, "error": text[-1500:]}]
    rows = []
    for target in sorted({t for (_, t) in variants}):
        kernels = {p.name: {"request": str(p.request), "source": variants[p.name, target]} for p in prepared}
        code, text, raw, gpucheck = peers_process("compare", kernels, storage,
                                                  ["--benchmark-compare", "--benchmark-compare-fail=median:2%"])
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


def measure(args, work: Path, meta: dict) -> list[dict]:
    suites = ("matmul",) if args.quick else SUITES
    targets = (0.0, 0.05) if args.quick else TARGETS
    started = time.perf_counter()
    prepared = [prepare(name, work) for name in suites]
    cycles = calibrate(prepared, targets, work)
    variants = {(p.name, t): slowed(p.source, p.entry, cycles[p.name, t]) for p in prepared for t in targets}
    folders = {(p.name, t): p.variant(variant_label(t), variants[p.name, t]) for p in prepared for t in targets}
    rows = [{"tool": "spin", "suite": p.name, "target": t, "cycles": cycles[p.name, t]} for p in prepared for t in targets]

    for proc in range(args.truth_procs):
        probes = [{"label": f"{p.name}-base", "request": str(p.request), "source": p.source} for p in prepared]
        probes += [{"label": f"{p.name}-{t}", "request": str(p.request), "source": variants[p.name, t]}
                   for p in prepared for t in targets]
        medians = nvbench(probes, work)
        for p in prepared:
            for t in targets:
                rows.append({"tool": "nvbench", "suite": p.name, "target": t, "proc": proc,
                             "ratio": medians[f"{p.name}-{t}"] / medians[f"{p.name}-base"],
                             "base_us": medians[f"{p.name}-base"] * 1e6})
    log(f"truth measured ({args.truth_procs} nvbench processes) at {time.perf_counter() - started:.0f} s")

    last = 0.0
    for rep in range(args.reps):
        if time.perf_counter() - started + last > args.deadline:  # the next one would end past the deadline
            log(f"deadline: stopped after {rep} repetitions")
            break
        rep_started = time.perf_counter()
        for p in prepared:
            for t in targets:
                result = gate_comparison(folders[p.name, t], work / "reports" / f"{p.name}-{t}-{rep}")
                rows.append({"tool": "cudagate", "suite": p.name, "case": p.case, "target": t, "rep": rep, **result})
                if "error" in result:
                    log(f"cudagate {p.name} {variant_label(t)}: {result['error']}")
        rows += peers_rep(prepared, variants, rep, work)
        last = time.perf_counter() - rep_started
        log(f"repetition {rep + 1} done at {time.perf_counter() - started:.0f} s")
    for row in rows:
        row.setdefault("session", meta["session"])
    return rows


def measure_aa(args, work: Path, meta: dict) -> list[dict]:
    """``--aa-only N``: N A/A comparisons, each in a fresh gate process, alternating the suites."""
    started = time.perf_counter()
    prepared = [prepare(name, work) for name in SUITES]
    folders = {p.name: p.variant("A/A", slowed(p.source, p.entry, 0)) for p in prepared}
    rows = []
    for n in range(args.aa_only):
        if time.perf_counter() - started > args.deadline:
            log(f"deadline: stopped after {n} comparisons")
            break
        p = prepared[n % len(prepared)]
        result = gate_comparison(folders[p.name], work / "reports" / f"aa-{n}")
        rows.append({"tool": "cudagate", "suite": p.name, "case": p.case, "target": 0.0, "rep": n,
                     "session": meta["session"], **result})
        if "error" in result:
            log(f"A/A {n}: {result['error']}")
    return rows


def pct(flags: list[bool]) -> str:
    return f"{sum(flags) / len(flags):.0%} ({sum(flags)}/{len(flags)})" if flags else "—"


def upper95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate seen k times in n."""
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def tables(rows: list[dict], metas: list[dict]) -> str:
    out = []
    for meta in metas:
        out.append(f"<!-- {meta['command']} — {meta['date']} — {meta['gpu']} — session {meta['session']} -->")
    gates = [r for r in rows if r["tool"] == "cudagate" and "error" not in r]
    keys = sorted({(r["suite"], r["target"]) for r in gates + [r for r in rows if r["tool"] == "nvbench"]})
    truth_of = {}
    for suite, target in keys:
        ratios = [r["ratio"] for r in rows if r["tool"] == "nvbench" and r["suite"] == suite and r["target"] == target]
        truth_of[suite, target] = (f"{(np.median(ratios) - 1) * 100:+.2f} % [{(min(ratios) - 1) * 100:+.2f}, "
                                   f"{(max(ratios) - 1) * 100:+.2f}] ({len(ratios)})" if ratios else "—")
    peer_cols = ("pytest-benchmark median:2%", "gpucheck default", "gpucheck min_effect 1.02", "asv factor 1.1",
                 "asv factor 1.02")
    head = ("suite · case", "variant", "true slowdown, nvbench: median [min, max] (processes)", "cudagate regressed",
            "cudagate inconclusive", *peer_cols, "gate process wall s, median / max")
    out += ["", "### Each tool as its users run it (a fresh process per comparison)", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suite, target in keys:
        mine = [r for r in gates if r["suite"] == suite and r["target"] == target]
        peers = [r for r in rows if r["tool"] == "peers" and r.get("suite") == suite and r.get("target") == target
                 and "error" not in r]
        walls = [r["wall_s"] for r in mine]
        case = mine[0]["case"] if mine else ""
        out.append("| " + " | ".join([
            f"{suite} {case}", variant_label(target), truth_of[suite, target],
            pct([r["verdict"] == "regressed" for r in mine]), pct([r["verdict"] == "inconclusive" for r in mine]),
            *(pct([bool(r[c]) for r in peers]) for c in peer_cols),
            f"{np.median(walls):.1f} / {max(walls):.1f}" if walls else "—"]) + " |")
    aa = [r for r in gates if r["target"] == 0.0]
    if aa:
        k = sum(r["verdict"] == "regressed" for r in aa)
        sessions = len({r["session"] for r in aa})
        out.append(f"\nA/A: cudagate said `regressed` in {k} of {len(aa)} comparisons, each in a fresh process, "
                   f"over {sessions} session(s); 95 % upper bound on the false-alarm rate {upper95(k, len(aa)):.1%}.")
    errors = [r for r in rows if "error" in r]
    if errors:
        out.append(f"\n{len(errors)} comparison(s) gave no verdict (see the JSON for their output).")

    rule_cols = ("median:2%", "median:5%", "MWU p<.05 & >=1.1 (gpucheck, one-sided)", "MWU p<.002 & >1.1 (asv)")
    head = ("suite · case", "variant", "cudagate regressed", *rule_cols, "median rounds")
    out += ["", "### the rule alone (same samples)", "",
            "Each rule applied to the interleaved, drift-cancelled samples of the same cudagate comparisons "
            "(no peer gets such samples in real use).", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suite, target in keys:
        mine = [r for r in gates if r["suite"] == suite and r["target"] == target and r.get("current")]
        judged = [same_samples(r) for r in mine]
        out.append("| " + " | ".join([
            f"{suite} {mine[0]['case'] if mine else ''}", variant_label(target),
            pct([r["verdict"] == "regressed" for r in mine]), *(pct([j[c] for j in judged]) for c in rule_cols),
            f"{int(np.median([r['pairs'] for r in mine]))}" if mine else "—"]) + " |")
    return "\n".join(out)


def gpu_name() -> str:
    code, text, _ = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=30)
    return text.strip().splitlines()[0] if code == 0 and text.strip() else "unknown GPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: matmul, A/A and +5 %%, one repetition")
    parser.add_argument("--reps", type=int, help="comparisons per variant and tool (default 4, as far as --deadline allows; 1 with --quick)")
    parser.add_argument("--truth-procs", type=int, help="fresh nvbench processes (default 10; 2 with --quick)")
    parser.add_argument("--aa-only", type=int, metavar="N", help="only N A/A comparisons, a fresh process each")
    parser.add_argument("--deadline", type=float, default=420.0,
                        help="start no repetition that would end after this many seconds")
    parser.add_argument("--json", type=Path, help="write every comparison here (input of --merge)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON", help="print the tables of earlier runs")
    args = parser.parse_args(argv)
    if args.merge:
        runs = [json.loads(p.read_text()) for p in args.merge]
        print(tables([r for run_ in runs for r in run_["rows"]], [run_["meta"] for run_ in runs]))
        return 0
    args.reps = args.reps if args.reps is not None else (1 if args.quick else 4)
    args.truth_procs = args.truth_procs if args.truth_procs is not None else (2 if args.quick else 10)
    now = datetime.datetime.now(datetime.timezone.utc)
    meta = {"command": "python benchmarks/gate_power.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": now.strftime("%Y-%m-%d %H:%M UTC"), "gpu": gpu_name(),
            "session": f"{platform.node()}-{now.strftime('%Y%m%dT%H%M%S')}"}
    with tempfile.TemporaryDirectory(prefix="cudagate-power-") as tmp:
        rows = measure_aa(args, Path(tmp), meta) if args.aa_only else measure(args, Path(tmp), meta)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(tables(rows, [meta]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
