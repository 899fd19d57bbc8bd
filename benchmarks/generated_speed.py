"""Host-side cost of a generated case on CPU: its rebuild, its fresh input sets and the judging.

    python benchmarks/generated_speed.py [--size 2048] [--repeats 3]

A suite shaped like the matmul example's 2048³ case (two float32 inputs and one float32 output of
SIZE × SIZE elements) but elementwise (c = a·b) with a numpy reference, so the reference itself
costs little and what is left is the gate's own work: drawing, hashing, .npy files, the fresh sets
and the checks. The worker's output is stood in for by the expected arrays (a correct kernel). The
same suite with a CUDA reference (as the matmul example's) times the host side of its fresh sets,
and the part of it the gate cannot draw ahead of the case's turn: a stand-in worker computes the
reference's outputs with numpy, and its own time is left out. The per-user cache lives in a
temporary folder (CUDAGATE_CACHE_DIR). Three host steps of the same size that this suite does not
reach are timed beside it: the harness worker's checks of one output (it runs them in its own
process), the wait for a CUDA reference run's folder to go (five adversarial candidates, as for the
matmul case), and the schema check of an approvals ledger (the fir example's, thousands of timing
samples, as report.json holds). Prints one markdown table of medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import unwritten_mask
from cudagate_harness.runner import _changed
from pytest_cudagate.boundary import schema
from pytest_cudagate.host import trash
from pytest_cudagate.cli import main as cudagate
from pytest_cudagate.defences.fresh_inputs import prepare
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.defences.expected import materialise
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.client import RunResult

SUITE = """\
suite: mul
description: c = a * b elementwise, as large as the matmul example's generated case
signature:
  - {{name: a, buffer: float32, intent: in, size: m*n, shape: [m, n]}}
  - {{name: b, buffer: float32, intent: in, size: m*n, shape: [m, n]}}
  - {{name: c, buffer: float32, intent: out, size: m*n, shape: [m, n]}}
  - {{name: m, scalar: int32}}
  - {{name: n, scalar: int32}}
reference:
  python: reference.py:mul
inputs:
  a: {{distribution: uniform, low: -1, high: 1}}
  b: {{distribution: uniform, low: -1, high: 1}}
tolerance:
  c: {{atol: 1.0e-6, rtol: 1.0e-5, nan: fail}}
kernels:
  - name: mul
    source: mul.cu
    launch: {{grid: ["cdiv(m*n, 256)"], block: [256]}}
cases:
  - {{name: large, kind: performance, class: large, generated: true, scalars: {{m: {size}, n: {size}}}}}
"""
REFERENCE = "import numpy as np\n\n\ndef mul(a, b, m, n):\n    return (a.astype(np.float64) * b).astype(np.float32)\n"
CUDA_REFERENCE = "  source: mul.cu\n  entry: mul\n  launch: {grid: [\"cdiv(m*n, 256)\"], block: [256]}\n"
KERNEL = ('extern "C" __global__ void mul(const float* a, const float* b, float* c, int m, int n)\n'
          '{ const long i = blockIdx.x * 256L + threadIdx.x; if (i < (long)m * n) c[i] = a[i] * b[i]; }\n')


class StandInWorker:
    """The worker's side of a CUDA reference run (c = a * b), in this process, its time counted apart."""

    device = {"arch": "sm_90"}

    def __init__(self):
        self.seconds = 0.0

    def run(self, request: dict) -> RunResult:
        start = time.perf_counter()
        cases = {}
        for spec in request["cases"]:
            a, b = (np.load(spec["buffers"][name]["input"]) for name in ("a", "b"))
            folder = Path(request["output_dir"]) / spec["name"]
            folder.mkdir(parents=True)
            np.save(folder / "c.npy", (a * b).reshape(-1))
            cases[spec["name"]] = {"status": "ok", "outputs": {"c": {"path": str(folder / "c.npy")}}}
        self.seconds += time.perf_counter() - start
        return RunResult(compile={"ok": True}, cases=cases)


def write_suite(folder: Path, size: int, worker: StandInWorker | None = None) -> Path:
    """The suite, its case generated; with ``worker``, its reference is a CUDA kernel run there."""
    folder.mkdir(parents=True)
    text = SUITE.format(size=size)
    (folder / "cudagate.yaml").write_text(text.replace("  python: reference.py:mul\n", CUDA_REFERENCE)
                                          if worker else text)
    (folder / "reference.py").write_text(REFERENCE)
    (folder / "mul.cu").write_text(KERNEL)
    if worker:
        generate(load_suite(folder / "cudagate.yaml"), client=worker)
    elif cudagate(["cases", "generate", str(folder / "cudagate.yaml")]) != 0:
        raise SystemExit("cudagate cases generate failed")
    return folder / "cudagate.yaml"


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value


def one_run(path: Path, work: Path, seed: int) -> dict[str, float]:
    """One gate run's host work on the generated case, in a new run folder (as a new pytest run has)."""
    suite = load_suite(path)
    case = suite.case("large")
    seconds = {}
    seconds["rebuild"], _ = timed(lambda: materialise(suite, case, client=None, root=work / "generated"))
    seconds["fresh"], (sets, notes) = timed(lambda: prepare(suite, case, count=2, adversarial=True, seed=seed,
                                                            root=work / "fresh").finish())
    assert len(sets) == 2, notes
    resolved = suite.resolved(case)
    expected = resolved.expected_outputs()
    body = {"status": "ok", "outputs": {"c": {"path": str(resolved.expected["c"])}},
            "fresh": [{**s.spec(suite, case), "outputs": {"c": {"path": s.spec(suite, case)["expected"]["c"]}}}
                      for s in sets]}
    seconds["checks"], verdict = timed(lambda: judge_case("mul", "large", body, expected, suite.tolerance,
                                                          resolved.shapes, checks=suite.checks))
    assert verdict.passed, verdict.describe()
    seconds.update(side_steps(work, resolved.expected_outputs()["c"], resolved.inputs["a"]))
    return seconds


def cuda_reference_run(path: Path, work: Path, seed: int, worker: StandInWorker) -> dict[str, float]:
    """The fresh sets of the same case with a CUDA reference: the gate's own time, not the worker's."""
    suite = load_suite(path)
    case = suite.case("large")
    materialise(suite, case, client=worker, root=work / "generated")
    worker.seconds = 0.0
    drawn, prepared = timed(lambda: prepare(suite, case, count=2, adversarial=True, seed=seed, root=work / "fresh"))
    finished, (sets, notes) = timed(lambda: prepared.finish(worker))
    assert len(sets) == 2, notes
    return {"fresh_cuda": drawn + finished - worker.seconds, "fresh_cuda_turn": finished - worker.seconds}


def side_steps(work: Path, output: np.ndarray, input_path: Path) -> dict[str, float]:
    """The host steps beside the suite's own flow, on arrays of its size."""
    seconds = {}
    first, second, host = output.reshape(-1), output.reshape(-1).copy(), np.load(input_path).reshape(-1)

    def worker_checks():  # what CaseRun.outputs does for one output and one input after launches 1 and 2
        _changed(host, host.copy()), _changed(host, host.copy())
        unwritten_mask(first, second), _changed(first, second)
        np.save(work / "c.npy", first)

    seconds["worker"], _ = timed(worker_checks)
    folder = work / "reference-run"
    for i in range(5):
        (folder / f"c{i}" / "large").mkdir(parents=True)
        for name in ("a", "b"):
            np.save(folder / f"c{i}" / "large" / f"{name}.npy", host)
        (folder / "out" / f"large.{i}").mkdir(parents=True)
        np.save(folder / "out" / f"large.{i}" / "c.npy", first)
    seconds["discard"], _ = timed(lambda: trash.discard(folder))
    trash.wait()
    ledger = json.loads((Path(__file__).parent.parent / "examples" / "fir" / "cudagate.approvals.json").read_text())
    seconds["schema"], found = timed(lambda: schema.problems(ledger, "approvals"))
    assert not found, found
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="rows and columns of each array (default 2048)")
    parser.add_argument("--repeats", type=int, default=3, help="warm runs measured (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cudagate-bench-") as tmp:
        root = Path(tmp)
        os.environ["CUDAGATE_CACHE_DIR"] = str(root / "cache")
        path = write_suite(root / "suite", args.size)
        first = one_run(path, root / "run-0", seed=0)
        warm = [one_run(path, root / f"run-{i + 1}", seed=i + 1) for i in range(args.repeats)]
        worker = StandInWorker()
        cuda_path = write_suite(root / "cuda-suite", args.size, worker)
        first.update(cuda_reference_run(cuda_path, root / "cuda-run-0", 0, worker))
        for i, run in enumerate(warm):
            run.update(cuda_reference_run(cuda_path, root / f"cuda-run-{i + 1}", i + 1, worker))
    mb = 3 * args.size * args.size * 4 / 1e6
    print(f"\n{args.size}×{args.size} float32, two inputs and one output ({mb:.0f} MB per set), numpy "
          f"{np.__version__}, {os.cpu_count()} CPUs; warm: median of {args.repeats}\n")
    print("| step | first run | warm run |")
    print("|---|---|---|")
    labels = {"rebuild": "the generated case: rebuilt (first run) or from the cache, verified (warm)",
              "fresh": "2 fresh input sets (resampled, adversarial) and their reference",
              "checks": "judging: the signed output and 2 fresh sets",
              "fresh_cuda": "2 fresh input sets with a CUDA reference: the gate's side (the worker's left out)",
              "fresh_cuda_turn": "… of which left in the case's own turn when drawn ahead (the reference's run)",
              "worker": "the harness worker's checks of one output and one input after launches 1 and 2, and its .npy",
              "discard": "the gate's wait for a CUDA reference run's folder (5 candidate sets and outputs) to go",
              "schema": "schema check of an approvals ledger (examples/fir, 7035 timing samples)"}
    flow = ("rebuild", "fresh", "checks")
    for key, label in labels.items():
        if key == "fresh_cuda":  # the suite's own flow ends here; the side steps follow the total
            total = statistics.median(sum(w[k] for k in flow) for w in warm)
            print(f"| **total** | **{sum(first[k] for k in flow):.3f} s** | **{total:.3f} s** |")
        print(f"| {label} | {first[key]:.3f} s | {statistics.median(w[key] for w in warm):.3f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
