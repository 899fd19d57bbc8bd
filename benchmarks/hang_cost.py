"""What one hanging kernel costs a gate run, against the case timeout. Prints a markdown table (GPU).

    python benchmarks/hang_cost.py [--timeout 10] [--json OUT.json]

Two suites, each a copy of examples/softmax (its correctness and performance cases): the control holds
the example kernel twice; the fault suite holds the same two and, between them, a kernel that spins
forever. Each runs in a fresh `pytest --cuda-gate` process (after an untimed run of each that fills the
compile caches), with `--cuda-gate-timeout T`. The hang's cost is the fault suite's wall time less the
control's; the target is at most 2 × T for the whole run (every case of the hanging kernel, its
sanitizer run and the worker restarts included). Beside it: the hanging kernel's items by phase, and
the run phases of both runs (`--cuda-gate-durations`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

from evidence_header import with_header
from gate_speed import run_phases

ROOT = Path(__file__).resolve().parents[1]
CASES = ("correct_7x33", "perf_256x1024")
HANG_CU = """\
extern "C" __global__ void hang(const float* x, float* y, int rows, int cols) {
    volatile const float* p = x;
    while (p[0] < 1e30f) { }
    y[0] = p[0];
}
"""


def suite(dest: Path, with_hang: bool) -> Path:
    shutil.copytree(ROOT / "examples" / "softmax", dest,
                    ignore=shutil.ignore_patterns("approved", "cudagate.approvals.json", "cudagate.sig.json"))
    path = dest / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    good = raw["kernels"][0]
    good = dict(good, entry=good.get("entry", good["name"]))  # renamed copies keep the example's entry
    kernels = [dict(good, name="good_first")]
    if with_hang:
        (dest / "hang.cu").write_text(HANG_CU)
        kernels.append({"name": "hang", "source": "hang.cu", "launch": good["launch"]})
    kernels.append(dict(good, name="good_last"))
    raw["kernels"] = kernels
    raw["cases"] = [c for c in raw["cases"] if c["name"] in CASES]
    path.write_text(yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False))
    return path


def gate(path: Path, timeout: float, report: Path, cache: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": "pytest_cudagate.plugin",
           "CUDAGATE_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "--cuda-gate", str(path), "--cuda-gate-require-gpu",
                           "--cuda-gate-allow-unsigned", "--cuda-gate-timeout", f"{timeout:g}", "-q", "-p",
                           "no:cacheprovider", "--cuda-gate-durations", "0", "--cuda-gate-report", str(report)],
                          cwd=path.parent, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, done


def measure(timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="cudagate-hang-") as tmp:
        tmp = Path(tmp)
        runs = {}
        for name, with_hang in (("control", False), ("with a hanging kernel", True)):
            path = suite(tmp / name.replace(" ", "_") / "softmax", with_hang)
            cache = tmp / "cache"
            gate(path, timeout, tmp / f"warm-{with_hang}", cache)  # compiles and sanitizer verdicts cached
            wall, done = gate(path, timeout, tmp / f"report-{with_hang}", cache)
            if done.returncode not in (0, 1):
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            document = json.loads((tmp / f"report-{with_hang}" / "report.json").read_text())
            hang_phases: dict[str, float] = defaultdict(float)
            statuses = {}
            for item in document["items"]:
                statuses[f"{item['kernel']}::{item['case']}"] = item["status"]
                if item["kernel"] == "hang":
                    for phase, seconds in (item.get("phases") or {}).items():
                        hang_phases[phase] += seconds
            runs[name] = {"wall_s": wall, "exit": done.returncode, "run_phases": run_phases(done.stdout),
                          "hang_item_phases": dict(hang_phases), "statuses": statuses}
    extra = runs["with a hanging kernel"]["wall_s"] - runs["control"]["wall_s"]
    problems = unsound(runs)
    return {"timeout_s": timeout, "runs": runs, "hang_cost_s": extra, "target_s": 2 * timeout,
            "problems": problems, "met": not problems and extra <= 2 * timeout}


def unsound(runs: dict) -> list[str]:
    """Why the two runs do not measure a hang (empty when they do): the good kernels must pass (or
    warn) in both, and every case of the hanging kernel must fail."""
    problems = []
    if runs["control"]["exit"] != 0:
        problems.append(f"the control run exited {runs['control']['exit']}")
    for name, run in runs.items():
        # warnings are expected: the copies are unsigned and never approved
        bad = [k for k, v in run["statuses"].items() if not k.startswith("hang::") and v not in ("passed", "warning")]
        if bad:
            problems.append(f"{name}: good items not passed: {', '.join(bad)}")
    hung = {k: v for k, v in runs["with a hanging kernel"]["statuses"].items() if k.startswith("hang::")}
    if len(hung) != len(CASES) or set(hung.values()) != {"failed"}:
        problems.append(f"the hanging kernel's items: {hung}")
    return problems


def table(result: dict) -> str:
    runs = result["runs"]
    control, fault = runs["control"], runs["with a hanging kernel"]
    rows = [("case timeout", f"{result['timeout_s']:g} s"),
            ("control run (2 good kernels): wall", f"{control['wall_s']:.2f} s"),
            ("fault run (the same + a hanging kernel): wall", f"{fault['wall_s']:.2f} s"),
            ("the hang's cost (difference)", f"{result['hang_cost_s']:.2f} s (target ≤ {result['target_s']:g} s: "
                                              f"{'met' if result['met'] else 'NOT met'})"),
            ("hanging kernel's items", ", ".join(f"{k} {v}" for k, v in fault["statuses"].items() if k.startswith("hang"))),
            ("good kernels in the fault run", ", ".join(sorted(set(v for k, v in fault["statuses"].items()
                                                                   if not k.startswith("hang")))))]
    rows += [("NOT a measurement of a hang", p) for p in result["problems"]]
    rows += [(f"  hanging kernel, phase `{p}`", f"{s:.2f} s") for p, s in sorted(fault["hang_item_phases"].items(),
                                                                                  key=lambda kv: -kv[1])]
    rows += [(f"  run phase `{p}`: control / fault", f"{control['run_phases'].get(p, 0.0):.2f} / {s:.2f} s")
             for p, s in fault["run_phases"].items()]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=10.0, help="--cuda-gate-timeout of both runs (s)")
    parser.add_argument("--json", type=Path, help="also keep the result here, with the evidence header")
    args = parser.parse_args()
    result = measure(args.timeout)
    print(f"`python benchmarks/hang_cost.py --timeout {args.timeout:g}`, {time.strftime('%Y-%m-%d')}\n")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(with_header(result, __file__), indent=1))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
