"""How often the latency gate catches a real slowdown, and how often it cries wolf.

For each example suite's first performance case, the shipped kernel is compared (interleaved, as
the gate does) with copies of itself slowed by ~1, 2, 3, 5 and 10% (a clock64() spin at the start
of every block) and with an identical copy (A/A), REPS times each with fresh random launch orders.
On the very same samples it also applies the rules other tools use. Prints one table.

    python benchmarks/gate_power.py [--reps 50] [--budget 2.0] [--threshold 0.02]

Needs a GPU. The "true" slowdown of each variant is measured first with one long comparison.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from pytest_cudagate.judge import stats
from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.judge.latency import AdaptiveSampler
from pytest_cudagate.worker.requests import case_spec, kernel_spec
from pytest_cudagate.suite.loader import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["examples/matmul/cudagate.yaml", "examples/softmax/cudagate.yaml"]
TARGETS = [0.0, 0.01, 0.02, 0.03, 0.05, 0.10]
CLOCK_GHZ = 1.98  # H200 boost clock; only sets the spin length, the true slowdown is measured


def slowed(source: str, entry: str, cycles: int) -> str:
    """``source`` with a spin of ``cycles`` at the start of ``entry`` (a comment for 0: A/A copy)."""
    if cycles <= 0:
        return source + "\n// identical copy (A/A)\n"
    match = re.search(r"__global__\s+void\s+" + re.escape(entry) + r"\s*\([^)]*\)\s*\{", source)
    spin = f"\n    {{ const long long t0 = clock64(); while (clock64() - t0 < {cycles}) {{ }} }}\n"
    return source[: match.end()] + spin + source[match.end():]


def compare(client, suite, program, case, current_source, *, budget, threshold, seed, out):
    request = {
        "protocol": 1, "op": "compare",
        "kernels": {"approved": kernel_spec(program), "current": kernel_spec(program, current_source)},
        "launches": {role: program.launch_for(case.name).resolve(case.scalars) for role in ("approved", "current")},
        "signature": [p.protocol() for p in suite.signature],
        "case": case_spec(suite, program, case),
        "timing": {**suite.timing.to_json(), "chunk": 100, "seed": seed},
        "output_dir": out,
    }
    sampler = AdaptiveSampler(threshold, budget)
    result = client.compare(request, sampler.decide)
    assert result.body and result.body["status"] == "ok", result.body
    return sampler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--budget", type=float, default=2.0, help="measurement seconds per comparison")
    parser.add_argument("--threshold", type=float, default=0.02)
    parser.add_argument("--json", type=Path, help="also write every repetition's numbers here")
    args = parser.parse_args()

    rows, raw = [], []
    out = tempfile.mkdtemp(prefix="cudagate-power-")
    with HarnessClient(timeout_s=120) as client:
        client.start()
        for suite_path in SUITES:
            suite = load_suite(ROOT / suite_path)
            program = suite.kernels[0]
            case = next(c for c in suite.cases if c.kind == "performance")
            base = program.source.read_text()
            probe = compare(client, suite, program, case, slowed(base, program.entry, 0),
                            budget=0.5, threshold=args.threshold, seed=1, out=out)
            base_us = float(np.median(probe.approved)) * 1000
            for target in TARGETS:
                cycles = int(round(target * base_us * 1000 * CLOCK_GHZ))
                source = slowed(base, program.entry, cycles)
                truth = compare(client, suite, program, case, source, budget=3.0, threshold=0.001, seed=2, out=out)
                true_ratio = stats.paired_ratio(truth.current, truth.approved).ratio
                verdicts, peers, pairs, seconds = [], {"median:5%": [], "gpucheck": [], "asv": []}, [], []
                for rep in range(args.reps):
                    sampler = compare(client, suite, program, case, source, budget=args.budget,
                                      threshold=args.threshold, seed=100 + rep, out=out)
                    result = sampler.result()
                    verdicts.append(result.verdict.value)
                    pairs.append(result.pairs)
                    seconds.append(result.measurement_s)
                    cur, app = sampler.current, sampler.approved
                    peers["median:5%"].append(stats.rule_median_percent(cur, app, 5.0))
                    peers["gpucheck"].append(stats.rule_mann_whitney(cur, app, p=0.05, min_ratio=1.1))
                    peers["asv"].append(stats.rule_asv(cur, app))
                    raw.append({"suite": suite.name, "target": target, "true_ratio": true_ratio, "rep": rep,
                                "verdict": result.verdict.value, "pairs": result.pairs, "seconds": result.measurement_s,
                                "ratio": result.estimate.ratio if result.estimate else None})
                measured = float(np.median([r["ratio"] for r in raw[-args.reps:] if r["ratio"]]))
                rows.append((suite.name, case.name, f"{base_us:.2f}", "A/A" if target == 0 else f"+{target:.0%}",
                             f"{(true_ratio - 1) * 100:+.2f}%", f"{(measured - 1) * 100:+.2f}%",
                             f"{verdicts.count('regressed') / len(verdicts):.0%}",
                             f"{verdicts.count('inconclusive') / len(verdicts):.0%}",
                             f"{verdicts.count('improved') / len(verdicts):.0%}",
                             f"{int(np.median(pairs))}", f"{np.median(seconds):.2f} / {max(seconds):.2f}",
                             *(f"{sum(v) / len(v):.0%}" for v in peers.values())))
                print(" | ".join(rows[-1]), flush=True)
    header = ("suite", "case", "base µs", "variant", "long-run slowdown", "median of reps", "cudagate regressed",
              "inconclusive", "improved",
              "median rounds", "seconds med / max", "median:5%", "gpucheck MWU", "asv MWU")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nthreshold {args.threshold:.0%}, {args.reps} repetitions per row, budget {args.budget} s per comparison; "
          "'regressed' on the A/A row is the false-alarm rate")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
