"""The judge's host cost on one machine's CPUs, with BLAS norms and without. Prints markdown tables.

    python benchmarks/judge_speed.py [--size 4194304] [--repeats 10]

1. Three output checks at once, as the gate checks a large case (its signed output on the calling
   thread, two fresh sets' in the judge's threads): ``check_output`` of three right float32 outputs
   of ``--size`` elements, wall milliseconds per round of three, with the judge's Euclidean norm
   (``judge/norms.py``, numpy's own loop) and with numpy's ``np.linalg.norm`` (a BLAS dot product,
   which the judge used before; OpenBLAS runs it on a pool of one thread per core, spinning between
   calls) put in its place. What the spinning pool costs shows here, in the other threads' work.
2. The norm alone of a float64 vector of ``--size`` elements, by 1 and by 3 threads at once, each
   way: milliseconds per norm, as each thread sees it. The BLAS dot itself is the faster one.

Needs no GPU. The figures depend on the host's cores and BLAS: run it on the GPU runner.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pytest_cudagate.host.cpu import cores
from pytest_cudagate.judge import elementwise, output_scale
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.judge.norms import euclidean_norm
from pytest_cudagate.suite.model import Tolerance


def blas_norm(values: np.ndarray) -> float:
    return float(np.linalg.norm(values.reshape(-1)))


NORMS = {"judge's (no BLAS)": euclidean_norm, "np.linalg.norm (BLAS)": blas_norm}


@contextlib.contextmanager
def norm_in_judge(norm):
    """The judge's modules take ``norm`` as their Euclidean norm meanwhile."""
    saved = elementwise.euclidean_norm, output_scale.euclidean_norm
    elementwise.euclidean_norm = output_scale.euclidean_norm = norm
    try:
        yield
    finally:
        elementwise.euclidean_norm, output_scale.euclidean_norm = saved


def three_checks(size: int, repeats: int) -> list[str]:
    rng = np.random.default_rng(0)
    tol = Tolerance(atol=1e-4, rtol=1e-4)
    pairs = []
    for _ in range(3):
        expected = rng.standard_normal(size).astype(np.float32)
        pairs.append((expected + np.float32(1e-6) * rng.standard_normal(size).astype(np.float32), expected))
    lines = [f"### Three checks of {size}-element outputs at once (wall ms per round of three)", "",
             "| norm | median | min | max | verdicts |", "|---|---|---|---|---|"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for label, norm in NORMS.items():
            with norm_in_judge(norm):
                rounds, verdicts = [], set()
                for i in range(repeats + 1):
                    t0 = time.perf_counter()
                    fresh = [pool.submit(check_output, "y", a, e, tol, (size,)) for a, e in pairs[1:]]
                    results = [check_output("y", *pairs[0], tol, (size,)), *(f.result() for f in fresh)]
                    if i:  # the first round warms the pool and the caches
                        rounds.append((time.perf_counter() - t0) * 1e3)
                    verdicts.add(all(r.ok for r in results))
            lines.append(f"| {label} | {statistics.median(rounds):.1f} | {min(rounds):.1f} | {max(rounds):.1f} | "
                         f"{'all pass' if verdicts == {True} else 'NOT ALL PASS'} |")
    return lines


def _per_call_ms(function, values: np.ndarray, threads: int, repeats: int) -> float:
    """Median over threads of each thread's mean time per call, all threads calling at once."""
    function(values)
    start = threading.Barrier(threads)
    seen: list[float] = []

    def work() -> None:
        start.wait()
        t0 = time.perf_counter()
        for _ in range(repeats):
            function(values)
        seen.append((time.perf_counter() - t0) / repeats * 1e3)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return statistics.median(seen)


def norms_alone(size: int, repeats: int) -> list[str]:
    values = np.random.default_rng(1).standard_normal(size)
    lines = [f"### The norm alone of {size} float64 values (ms per norm, as each thread sees it)", "",
             "| threads at once | " + " | ".join(NORMS) + " |", "|---|---|---|"]
    for threads in (1, 3):
        cells = [f"{_per_call_ms(norm, values, threads, repeats):.2f}" for norm in NORMS.values()]
        lines.append(f"| {threads} | {' | '.join(cells)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 22, help="elements (the 2048x2048 matmul output: 4194304)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(f"host: {cores()} usable cores; numpy {np.__version__}; OPENBLAS_NUM_THREADS {blas}\n")
    print("\n".join([*three_checks(args.size, args.repeats), "", *norms_alone(args.size, args.repeats)]))


if __name__ == "__main__":
    main()
