"""`pytest --cuda-gate -n 2` against `-n 0`, on the simulated GPU of fake_worker (no CUDA):
the controller's report holds every item with the verdicts a single process gives, a kernel's items
stay on one worker, and `--cuda-gate-durations` lists each case's phases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import REFERENCE_PY
from pytest_cudagate.cli import main
from pytest_cudagate.boundary.schema import problems
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.loader import load_suite

pytest_plugins = ["pytester"]

CASES = [("small", "correctness", 3, 50), ("edge", "correctness", 2, 7), ("wide", "correctness", 4, 300),
         ("odd", "correctness", 5, 33), ("perf", "performance", 64, 256), ("perf_tall", "performance", 128, 32)]
SUITE = """\
suite: {name}
signature:
  - {{name: x, buffer: float32, intent: in, size: rows*cols, shape: [rows, cols]}}
  - {{name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}}
  - {{name: rows, scalar: int32}}
  - {{name: cols, scalar: int32}}
reference:
  python: reference.py:scale_rows
tolerance:
  y: {{atol: 1.0e-6, rtol: 1.0e-5}}
checks: {{sanitizer: off}}
timing: {{warmup: 2, warmup_ms: 0, repeat: 20}}
kernels:
  - {{name: scale2, source: scale.cu, launch: {{grid: [rows], block: [128]}}}}
  - {{name: halfrow, source: scale.cu, launch: {{grid: [rows], block: [128]}}}}
cases:
""" + "".join(f"  - {{{{name: {n}, kind: {k}, scalars: {{{{rows: {r}, cols: {c}}}}}}}}}\n" for n, k, r, c in CASES)
KERNELS_CU = """\
extern "C" __global__ void scale2(const float* x, float* y, int rows, int cols)
{
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = 2.0f * x[blockIdx.x * cols + c];
}
extern "C" __global__ void halfrow(const float* x, float* y, int rows, int cols)
{
    for (int c = threadIdx.x; c < cols / 2; c += blockDim.x) y[blockIdx.x * cols + c] = 2.0f * x[blockIdx.x * cols + c];
}
"""
# The harness worker of every pytest process (controller or xdist worker) is the in-process fake.
CONFTEST = """
import os
import sys

import numpy as np

sys.path.insert(0, {tests!r})
from fake_worker import FakeKernel, FakeWorker  # noqa: E402

from fake_worker import use_client  # noqa: E402


def _xy(launch):
    n = launch.args["rows"] * launch.args["cols"]
    return launch.array("x", np.float32, n), launch.array("y", np.float32, n), n


def honest(launch):
    x, y, _ = _xy(launch)
    y[:] = 2 * x


def halfrow(launch):
    x, y, n = _xy(launch)
    y[: n // 2] = 2 * x[: n // 2]


PARAMS = [{{"name": "x", "kind": "buffer", "dtype": "float32", "intent": "in"}},
          {{"name": "y", "kind": "buffer", "dtype": "float32", "intent": "out"}},
          {{"name": "rows", "kind": "scalar", "dtype": "int32"}}, {{"name": "cols", "kind": "scalar", "dtype": "int32"}}]
KERNELS = {{"scale2": FakeKernel(honest, PARAMS), "halfrow": FakeKernel(halfrow, PARAMS)}}

# Every worker this process starts (controller or xdist worker) is the in-process fake; GPU locks stay here.
use_client(lambda **options: FakeWorker(KERNELS, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), "locks")
"""


def _project(root: Path) -> None:
    for name in ("alpha", "beta"):
        folder = root / name
        folder.mkdir()
        (folder / "cudagate.yaml").write_text(SUITE.format(name=name))
        (folder / "scale.cu").write_text(KERNELS_CU)
        (folder / "reference.py").write_text(REFERENCE_PY)
        generate(load_suite(folder / "cudagate.yaml"))
    (root / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).parents[1])))


def _run(pytester, workers: str, report: str, *extra: str):
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "--cuda-gate-fresh-seed", "7", "--cuda-gate-report", report, "-n", workers,
                                           "-v", *extra, timeout=300)
    document = json.loads((pytester.path / report / "report.json").read_text())
    assert problems(document, "report") == []
    return result, document


def _verdicts(document: dict) -> dict[str, tuple]:
    return {i["nodeid"]: (i["status"], i["category"], i["headline"], i["message"], (i["latency"] or {}).get("verdict"),
                          i["samples_ms"], i["requests"], i["inputs"], i["suite_path"], i["source"])
            for i in document["items"]}


def _table(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if re.match(r"=+ cudagate =+", line))
    return lines[start + 1:start + 2 + 2 * len(CASES) * 2 + 1]


@pytest.mark.slow
def test_two_workers_report_what_one_process_reports(pytester):
    _project(pytester.path)
    single, one = _run(pytester, "0", "out0")
    spread, two = _run(pytester, "2", "out2", "--cuda-gate-durations", "0")
    assert len(one["items"]) == len(two["items"]) == 2 * 2 * len(CASES)
    assert _verdicts(two) == _verdicts(one)
    assert one["counts"] == two["counts"] and one["verdict"] == two["verdict"] == "fail"
    # the workers' compile items are counted, and their builds reach the controller's report
    def builds(document):
        return sorted(json.dumps({k: v for k, v in f.items() if k != "compile_s"}, sort_keys=True)
                      for f in document["runs"][0]["compiles"])
    assert builds(one) == builds(two) and len(builds(one)) == 4  # 2 suites of 2 kernels
    assert one["counts"]["total"] == len(one["items"]) + 4 == sum(two["runs"][0]["pytest_counts"].values())
    assert {k: v for k, v in two["runs"][0]["fingerprint"].items() if k != "fields"} == \
        {k: v for k, v in one["runs"][0]["fingerprint"].items() if k != "fields"}
    assert two["suites"] == one["suites"]
    assert _table(spread.outlines) == _table(single.outlines)
    # The requests written beside each report are the same files.
    names = sorted(p.name for p in (pytester.path / "out0" / "requests").iterdir())
    assert names == sorted(p.name for p in (pytester.path / "out2" / "requests").iterdir()) and names
    # One kernel's compile item and cases ran on one worker, and both workers had work.
    placed: dict[str, set[str]] = {}
    for line in spread.outlines:
        found = re.match(r"\[(gw\d+)\] .*?(\w+/cudagate\.yaml::\w+)::\w+", line)
        if found:
            placed.setdefault(found.group(2), set()).add(found.group(1))
    assert len(placed) == 4 and all(len(workers) == 1 for workers in placed.values())
    assert len(set().union(*placed.values())) == 2
    # Every case's phases are recorded, and the durations table lists them all.
    for item in two["items"]:
        assert item["phases"]["timing"] > 0 if item["kind"] == "performance" else "timing" not in item["phases"]
        assert {"checks", "ipc", "other"} <= set(item["phases"])
    durations = spread.outlines.index("cudagate durations: all cases, seconds by phase")
    assert len([line for line in spread.outlines[durations:] if "/cudagate.yaml::" in line or "::" in line]) >= 24


@pytest.mark.slow
def test_durations_lists_the_slowest_cases_with_their_phases(pytester):
    _project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "--cuda-gate-durations", "3", timeout=300)
    lines = result.outlines
    start = lines.index("cudagate durations: slowest 3 of 24 cases, seconds by phase")
    header = lines[start + 2].split()
    # only the phases these rows spent time in are columns (timing: the slowest may all be untimed cases)
    assert header[0] == "total" and "checks" in header and header[-1] == "case"
    rows = lines[start + 3:start + 6]
    totals = [float(row.split()[0]) for row in rows]
    assert totals == sorted(totals, reverse=True)
    assert all(re.search(r" (alpha|beta)::(scale2|halfrow)::\w+$", row) for row in rows)
    for row in rows:  # the phases add up to the total (rounded to the millisecond)
        cells = [float(c) for c in row.split()[:-1]]
        assert abs(sum(cells[1:]) - cells[0]) < 0.0005 * len(cells) + 1e-9


@pytest.mark.parametrize("gpus, workers", [("", None), ("0,1", 2)])
def test_auto_is_one_worker_per_visible_gpu(monkeypatch, gpus, workers):
    from pytest_cudagate import xdist_hooks

    class Nvml:
        @staticmethod
        def nvmlInit():
            pass

        @staticmethod
        def nvmlDeviceGetCount():
            return 8

    monkeypatch.setitem(__import__("sys").modules, "pynvml", Nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    assert (xdist_hooks.gpu_count() or None) == workers


def test_report_merge_keeps_runs_of_two_machines(pytester, tmp_path):
    """Reports of two hosts (different fingerprints) merge into one, each item pointing at its run."""
    _project(pytester.path)
    _run(pytester, "0", "h200")
    other = pytester.path / "h100"
    other.mkdir()
    document = json.loads((pytester.path / "h200" / "report.json").read_text())
    document["runs"][0]["fingerprint"] = {**document["runs"][0]["fingerprint"], "key": "0123456789abcdef",
                                          "description": "NVIDIA H100 80GB HBM3, sm_90"}
    document["runs"][0]["host"] = "runner-h100"
    (other / "report.json").write_text(json.dumps(document))
    (other / "requests").symlink_to(pytester.path / "h200" / "requests")
    out = tmp_path / "merged"
    assert main(["report", "merge", str(out), str(pytester.path / "h200"), str(other)]) == 0
    merged = json.loads((out / "report.json").read_text())
    assert problems(merged, "report") == []
    keys = [run["fingerprint"]["key"] for run in merged["runs"]]
    assert keys[1] == "0123456789abcdef" != keys[0] and merged["runs"][1]["host"] == "runner-h100"
    assert len(merged["items"]) == 2 * len(document["items"])
    assert sorted(i["run"] for i in merged["items"]) == [0] * len(document["items"]) + [1] * len(document["items"])
    assert merged["counts"]["failed"] == 2 * document["counts"]["failed"] and merged["verdict"] == "fail"


@pytest.mark.slow
def test_an_unknown_class_under_xdist_runs_every_case_instead_of_an_internal_error(pytester):
    # A usage error raised in a worker's collection would end the run as INTERNALERROR (exit 3).
    _project(pytester.path)
    result, document = _run(pytester, "2", "report", "--cuda-gate-class", "nope")
    assert result.ret in (0, 1), result.stdout.str()
    assert len(document["items"]) == 2 * 2 * len(CASES)  # two suites of two kernels, nothing deselected
    assert "--cuda-gate-class nope: no collected performance case has that class" in result.stdout.str()
