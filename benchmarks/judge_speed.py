"""The judge's host cost on one machine's CPUs. Prints a markdown table.

    python benchmarks/judge_speed.py [--size 4194304] [--repeats 10]

Euclidean norms of a float64 vector of ``--size`` elements, computed by 1 and by 3 threads at once
(the gate checks a large case's outputs from several threads): numpy's ``np.linalg.norm`` (a BLAS
dot product; OpenBLAS runs it on a pool of one thread per core) against the judge's BLAS-free
``euclidean_norm``. Milliseconds per norm, as each thread sees it.

Needs no GPU. The figures depend on the host's cores and BLAS: run it on the GPU runner.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

from pytest_cudagate.host import cores
from pytest_cudagate.judge.norms import euclidean_norm


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


def norms(size: int, repeats: int) -> list[str]:
    values = np.random.default_rng(0).standard_normal(size)
    lines = [f"### Euclidean norm of {size} float64 values (ms per norm, as each thread sees it)", "",
             "| threads at once | np.linalg.norm (BLAS) | euclidean_norm (no BLAS) |", "|---|---|---|"]
    for threads in (1, 3):
        blas = _per_call_ms(lambda v: float(np.linalg.norm(v)), values, threads, repeats)
        own = _per_call_ms(euclidean_norm, values, threads, repeats)
        lines.append(f"| {threads} | {blas:.2f} | {own:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 22, help="elements (the 2048x2048 matmul output: 4194304)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(f"host: {cores()} usable cores; numpy {np.__version__}; OPENBLAS_NUM_THREADS {blas}\n")
    print("\n".join(norms(args.size, args.repeats)))


if __name__ == "__main__":
    main()
