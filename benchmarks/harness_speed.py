"""Fixed costs of the gate around the kernels it times. Prints one table.

    python benchmarks/harness_speed.py

Measures: an NVRTC compile cold and from the on-disk cache; the report's timing plot of one case; fir's largest fresh inputs; the worker's start; a worker restart
after a faulting kernel; and `pytest --cuda-gate examples` with the compile cache warm, split into
the kernel time of its timed launches and everything else. Needs a GPU for all but the compiles.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from cudagate_harness.compiler import compile_kernel
from pytest_cudagate.worker.client import HarnessClient, WorkerUnavailable
from pytest_cudagate.items import PLUGIN_NAME
from pytest_cudagate.reports.plots import timing_svg
from pytest_cudagate.defences.fresh_inputs import prepare
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.suite.loader import load_suite

ROOT = Path(__file__).resolve().parents[1]
ILLEGAL = 'extern "C" __global__ void illegal(const float* a, const float* b, float* c, int m, int n, int k) { c[(size_t)1 << 40] = a[0]; }'


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def compile_costs(rows):
    source = (ROOT / "examples/matmul/matmul.cu").read_text()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["CUDAGATE_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        compile_kernel(source, entry="matmul_f32", arch="sm_90")
        cold = time.perf_counter() - t0
        hits = []
        for _ in range(50):
            t0 = time.perf_counter()
            result = compile_kernel(source, entry="matmul_f32", arch="sm_90")
            hits.append(time.perf_counter() - t0)
        assert result.cache_hit
        del os.environ["CUDAGATE_CACHE_DIR"]
    rows.append(("NVRTC compile, cold (matmul, sm_90)", ms(cold), ""))
    rows.append(("compile-cache hit (median of 50)", ms(statistics.median(hits)), "target < 5 ms"))


def worker_costs(rows) -> bool:
    suite = load_suite(ROOT / "examples/matmul/cudagate.yaml")
    program, case = suite.kernels[0], suite.case("correct_31x37x29")
    out = Path(tempfile.mkdtemp())
    with HarnessClient() as client:
        t0 = time.perf_counter()
        try:
            client.start()
        except WorkerUnavailable as exc:
            rows.append(("worker start", "n/a", str(exc)[:60]))
            return False
        rows.append(("worker start (cuInit, context, hello)", ms(time.perf_counter() - t0), ""))
        request = run_request(suite, program, [case], output_dir=out)
        client.run(request)
        normal = []
        for _ in range(10):
            t0 = time.perf_counter()
            client.run(request)
            normal.append(time.perf_counter() - t0)
        rows.append(("one correctness replay, warm worker", ms(statistics.median(normal)), ""))
        bad = run_request(suite, program, [case], output_dir=out)
        bad["kernel"].update(name="illegal", entry="illegal", source=ILLEGAL)
        restarts = []
        for _ in range(3):
            client.run(bad)
            t0 = time.perf_counter()
            client.run(request)  # pays for the fresh worker
            restarts.append(time.perf_counter() - t0 - statistics.median(normal))
        rows.append(("worker restart after an illegal-address fault", ms(statistics.median(restarts)), "target < 1 s"))
    return True


class _Capture:
    def __init__(self):
        self.runtime = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        self.runtime = config.pluginmanager.get_plugin(PLUGIN_NAME)


def report_costs(rows):
    """The HTML report's timing plot of one case: two series of 1000 launches (CPU)."""
    rng = np.random.default_rng(7)
    samples = {"approved": list(rng.gamma(50, 0.0002, 1000) + 0.010), "current": list(rng.gamma(50, 0.0002, 1000) + 0.0106)}
    times = []
    for k in range(20):
        t0 = time.perf_counter()
        timing_svg(samples, f"case{k}", 0.02)
        times.append(time.perf_counter() - t0)
    rows.append(("report timing plot, one case of 2 × 1000 launches (median of 20)", ms(statistics.median(times)), ""))


def fresh_input_costs(rows):
    """The largest fresh-input cost of the examples: fir's 131072 x 32768 case, both sets with their
    reference outputs (CPU)."""
    suite = load_suite(ROOT / "examples/fir/cudagate.yaml")
    case = suite.case("perf_131072x32768")
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(3):
            t0 = time.perf_counter()
            prepare(suite, case, count=2, adversarial=True, seed=k, root=Path(tmp) / str(k)).finish()
            times.append(time.perf_counter() - t0)
    rows.append(("fresh inputs of fir perf_131072x32768, 2 sets with the reference (median of 3)",
                 ms(statistics.median(times)), ""))


def gate_costs(rows):
    args = ["--cuda-gate", str(ROOT / "examples"), "-q", "-p", "no:cacheprovider", "--cuda-gate-require-gpu"]
    pytest.main(args + ["--co"])  # fill the compile cache through the compile items' path
    capture = _Capture()
    t0 = time.perf_counter()
    code = pytest.main(args, plugins=[capture])
    wall = time.perf_counter() - t0
    kernel, measuring = 0.0, 0.0
    worker = sum(o.worker_s for o in capture.runtime.outcomes)
    for outcome in capture.runtime.outcomes:
        if outcome.latency is not None and outcome.latency.samples:
            kernel += sum(outcome.latency.samples["current"]) + sum(outcome.latency.samples["approved"])
            measuring += outcome.latency.measurement_s
        elif outcome.correctness is not None and outcome.correctness.samples_ms:
            kernel += sum(outcome.correctness.samples_ms)
    kernel /= 1000
    rows.append(("`pytest --cuda-gate examples` wall (in-process, warm cache)", f"{wall:.2f} s", f"exit {code}"))
    rows.append(("  kernel time inside the timing events", f"{kernel:.3f} s", ""))
    rows.append(("  interleaved measurement loops", f"{measuring:.2f} s", ""))
    rows.append(("  GPU work in the worker (flushes, warm-ups, validation, timing)", f"{worker:.2f} s", ""))
    rows.append(("  beyond the GPU work (pytest, worker start, IPC, checks)", f"{wall - worker:.2f} s", "target ≤ 1 s"))


def main() -> int:
    rows = []
    compile_costs(rows)
    report_costs(rows)
    fresh_input_costs(rows)
    if worker_costs(rows):
        gate_costs(rows)
    width = max(len(r[0]) for r in rows)
    print(f"\n| {'what'.ljust(width)} | time | note |\n|{'-' * (width + 2)}|---|---|")
    for what, value, note in rows:
        print(f"| {what.ljust(width)} | {value} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
