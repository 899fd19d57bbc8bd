"""`cudagate optimize` honours a kernel's `requires:` and `outputs:` (issue 44): its candidates are run
and judged only on the cases its preconditions meet, only on the outputs it names, and the winner's
gate (holdout cases included) keeps to the same rule; through the command with the real harness layer
on the fake worker."""

from __future__ import annotations

import zlib

import numpy as np

from fake_worker import FakeKernel, FakeWorker
from helpers import SUITE_YAML, replace_once, write_suite
from optimize_fakes import write_proposals
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.optimize.evaluator import HarnessEvaluator
from pytest_cudagate.optimize.cli import EXIT_WINNER, run_optimize
from pytest_cudagate.optimize.prompt import system_prompt
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint
from test_loop import parse

# scale2 needs cols % 4 == 0 and is judged on y only: `small` (cols 50) and the holdout `hidden_odd`
# (cols 301) are not its cases, and z is another version's output.
YAML = replace_once(replace_once(replace_once(replace_once(
    SUITE_YAML,
    "  - {name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}\n",
    "  - {name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}\n"
    "  - {name: z, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}\n"),
    "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n", "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n  z: {atol: 1.0e-6, rtol: 1.0e-5}\n"),
    "    launch: {grid: [rows], block: [128]}\n",
    '    requires: ["cols % 4 == 0"]\n    outputs: [y]\n    launch: {grid: [rows], block: [128]}\n'),
    "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n",
    "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n"
    "  - {name: small4, kind: correctness, scalars: {rows: 3, cols: 52}}\n"
    "  - {name: hidden_77x300, kind: performance, holdout: true, scalars: {rows: 77, cols: 300}}\n"
    "  - {name: hidden_odd, kind: performance, holdout: true, scalars: {rows: 5, cols: 301}}\n")
KERNEL = """\
extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ z,
                                  int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[r * cols + c] = 2.0f * x[r * cols + c];
}
"""
REFERENCE = """\
import numpy as np


def scale_rows(x, rows, cols):
    x = x.astype(np.float64).reshape(rows, cols)
    return (x * 2).astype(np.float32), (x + 1).astype(np.float32)
"""
PARAMS = [{"name": n, "kind": "buffer", "dtype": "float32", "intent": i} for n, i in (("x", "in"), ("y", "out"), ("z", "out"))] \
    + [{"name": n, "kind": "scalar", "dtype": "int32"} for n in ("rows", "cols")]


def kernel(spec: dict) -> FakeKernel:
    """Right on y where cols % 4 == 0 (its precondition), wrong elsewhere; never writes z. A candidate
    whose source says ``latency=0.010`` takes 10 µs a launch, the initial kernel 20."""
    latency = 0.010 if "latency=0.010" in spec["source"] else 0.020
    rng = np.random.default_rng(zlib.crc32(spec["source"].encode()))

    def body(launch) -> None:
        n = launch.args["rows"] * launch.args["cols"]
        x, y = launch.array("x", np.float32, n), launch.array("y", np.float32, n)
        y[:] = 2 * x if launch.args["cols"] % 4 == 0 else -1
        launch.device.clock += latency * rng.normal(1, 0.01) - 0.01

    return FakeKernel(body, PARAMS)


def test_optimize_runs_and_judges_a_kernel_on_its_cases_and_outputs_only(tmp_path):
    from pytest_cudagate.defences.expected import generate

    path = write_suite(tmp_path / "scale", yaml_text=YAML, kernel_source=KERNEL, data=False)
    (path.parent / "reference.py").write_text(REFERENCE, encoding="utf-8")
    generate(load_suite(path))
    props = write_proposals(tmp_path / "props", [{"source": "// fake: latency=0.010\n" + KERNEL, "label": "fast"}])
    clients = []

    def evaluator(suite, program, ledger):
        clients.append(FakeWorker(kernel))
        return HarnessEvaluator(suite, program, ledger, clients[-1], Fingerprint.from_hello(clients[-1].start()),
                                gate_options=GateOptions(budget_s=0.5, fresh_seed=7), work_dir=tmp_path / "work")

    results = tmp_path / "results"
    code = run_optimize(parse(path, "scale2", "--allow-unsigned", "--results", results, "--quiet", "--proposer",
                              f"replay:{props}"), evaluator_factory=evaluator)
    ran = {c["name"] for r in clients[0].requests for c in r.get("cases", [])} | \
          {r["case"]["name"] for r in clients[0].requests if "case" in r}
    assert code == EXIT_WINNER
    assert ran == {"small4", "perf", "hidden_77x300"}  # never small or hidden_odd, which its requires leave out


def test_the_prompt_shows_the_preconditions_and_the_judged_outputs_tolerance(tmp_path):
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=YAML.replace(
        "  y: {atol: 1.0e-6, rtol: 1.0e-5}\n", "  y: {ulp: 4}\n"), kernel_source=KERNEL, data=False))
    text = system_prompt(suite, suite.kernel("scale2"), "a GPU", [])
    assert "Only cases where cols % 4 == 0 are run (its preconditions)." in text
    assert "Tolerance (the outputs judged): y: |actual - expected| <= 0 + 0·|expected|, or within 4 ulp of expected " \
           "in float32." in text
