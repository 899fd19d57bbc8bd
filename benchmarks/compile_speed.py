"""Cold and cached compile time of the same kernels under nvcc and NVRTC, on this machine (no GPU).

    python benchmarks/compile_speed.py [--runs 5] [--arch sm_90] [--json OUT.json]

Each cold compile runs into an empty compile cache (a fresh ``CUDAGATE_CACHE_DIR``); the cached one
reads back what it wrote, and must return the same cubin. Both compilers run as the gate runs them
(``cudagate_harness.compiler.compile_kernel``: the confined child, the caps, the cache). The kernels:
examples/softmax (device code only, so both compilers take it) and the cuda-samples reduction of
tests/public (host code beside its kernels: nvcc only). Prints a markdown table of medians and minima.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from cudagate_harness import compiler  # noqa: E402
from evidence_header import with_header  # noqa: E402

KERNELS = (
    # label, source file, entry, the compilers that take it
    ("softmax (device code only)", "examples/softmax/softmax.cu", "softmax_rows", ("nvrtc", "nvcc")),
    ("cuda-samples reduce6 (host code in the file)", "tests/public/cuda_samples/reduce_grid_stride/reduction_kernel.cu",
     "reduce6<float, 256u, false>", ("nvcc",)),
)


def compile_once(source: str, name: str, entry: str, arch: str, which: str, cache: Path) -> compiler.CompileResult:
    os.environ["CUDAGATE_CACHE_DIR"] = str(cache)
    return compiler.compile_kernel(source, entry=entry, arch=arch, source_name=name, compiler=which)


def measure(runs: int, arch: str) -> list[dict]:
    rows = []
    for label, path, entry, compilers in KERNELS:
        file = ROOT / path
        source = file.read_text()
        for which in compilers:
            cold, cached, name = [], [], None
            for _ in range(runs):
                with tempfile.TemporaryDirectory(prefix="cudagate-compile-speed-") as folder:
                    first = compile_once(source, file.name, entry, arch, which, Path(folder))
                    if not first.ok:
                        raise SystemExit(f"compile_speed: {path} ({entry}) does not compile with {which}:\n{first.log}")
                    again = compile_once(source, file.name, entry, arch, which, Path(folder))
                    if not again.cache_hit or again.cubin != first.cubin:
                        raise SystemExit(f"compile_speed: {path} with {which}: the second compile did not read the "
                                         "first one's cubin back from the cache")
                    cold.append(first.seconds)
                    cached.append(again.seconds)
                    name = first.compiler
            rows.append({"kernel": label, "source": path, "entry": entry, "compiler": name, "runs": runs,
                         "cold_s": cold, "cached_s": cached})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| kernel | compiler | cold median (min) | cached median (min) |", "|---|---|---|---|"]
    for row in rows:
        cold, cached = row["cold_s"], row["cached_s"]
        lines.append(f"| {row['kernel']} | {row['compiler']} | {statistics.median(cold) * 1e3:.0f} ms "
                     f"({min(cold) * 1e3:.0f}) | {statistics.median(cached) * 1e3:.1f} ms ({min(cached) * 1e3:.1f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="cold compiles per kernel and compiler (default 5)")
    parser.add_argument("--arch", default="sm_90", help="the cubin's architecture (default sm_90)")
    parser.add_argument("--json", type=Path, help="also write the timings here")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error(f"--runs {args.runs}: give 1 to 100 compiles")
    rows = measure(args.runs, args.arch)
    host = f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    print(f"{args.arch} cubins on {host}; {args.runs} cold compiles each\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(with_header({"host": host, "rows": rows}, __file__, argv,
                                                    card=f"no GPU: {host}"), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
