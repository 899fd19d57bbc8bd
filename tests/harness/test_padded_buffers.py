"""Strided, padded buffers (issue 44, item 6): `ld:` on a 2-D buffer puts row i at element i*ld on the
device; the elements after each row's end are padding the worker fills with a known pattern and checks
after every phase, as it checks guard zones. Case files, the reference and the judge see the logical
[rows, cols] view. Through `pytest --cuda-gate` on the fake GPU and `cudagate check`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import SUITE_YAML, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.requests import run_request

PADDED_YAML = """\
suite: padded
description: y = 2 * x over rows that sit ld elements apart
signature:
  - {name: x, buffer: float32, intent: in, size: rows*cols, shape: [rows, cols], ld: ldx}
  - {name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols], ld: ldy}
  - {name: rows, scalar: int32}
  - {name: cols, scalar: int32}
  - {name: ldx, scalar: int32}
  - {name: ldy, scalar: int32}
derived: {ldx: cols + 3, ldy: "cdiv(cols, 32) * 32"}
reference:
  python: reference.py:scale_rows
tolerance:
  y: {atol: 1.0e-6, rtol: 1.0e-5}
kernels:
  - name: honest
    source: scale.cu
    launch: {grid: [rows], block: [128]}
  - name: spills
    source: scale.cu
    launch: {grid: [rows], block: [128]}
cases:
  - {name: small, kind: correctness, scalars: {rows: 3, cols: 50}}
  - {name: perf, kind: performance, scalars: {rows: 64, cols: 250}}
"""
PADDED_CU = "".join(f"""
extern "C" __global__ void {name}(const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int ldx,
                                  int ldy)
{{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < {bound}; c += blockDim.x)
        y[r * ldy + c] = 2.0f * x[r * ldx + c];
}}
""" for name, bound in (("honest", "cols"), ("spills", "cols + 1")))
# The fake GPU runs the same: `spills` also writes the first padding element of every row of y.
PADDED_CONFTEST = """
import os
import sys

import numpy as np

sys.path.insert(0, {tests!r})
from fake_worker import FakeKernel, FakeWorker, use_client  # noqa: E402

PARAMS = [{{"name": "x", "kind": "buffer", "dtype": "float32", "intent": "in"}},
          {{"name": "y", "kind": "buffer", "dtype": "float32", "intent": "out"}}] + [
          {{"name": n, "kind": "scalar", "dtype": "int32"}} for n in ("rows", "cols", "ldx", "ldy")]


def rows_of(extra):
    def body(launch):
        rows, cols, ldx, ldy = (launch.args[n] for n in ("rows", "cols", "ldx", "ldy"))
        x = launch.array("x", np.float32, rows * ldx).reshape(rows, ldx)
        y = launch.array("y", np.float32, rows * ldy)
        for r in range(rows):
            y[r * ldy:r * ldy + cols + extra] = 2 * x[r, :cols + extra]
    return FakeKernel(body, PARAMS)


use_client(lambda **options: FakeWorker({{"honest": rows_of(0), "spills": rows_of(1)}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


def padded_suite(folder: Path, text: str = PADDED_YAML, data: bool = True) -> Path:
    return write_suite(folder, yaml_text=text, kernel_source=PADDED_CU, data=data)


def test_a_kernel_that_keeps_to_its_rows_passes_and_one_writing_padding_fails(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    padded_suite(pytester.path / "padded")
    (pytester.path / "conftest.py").write_text(PADDED_CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", timeout=180)
    result.stdout.fnmatch_lines_random([
        "*cudagate.yaml::honest::small PASSED*", "*cudagate.yaml::honest::perf PASSED*",
        "*cudagate.yaml::spills::small FAILED*",
        "*the kernel wrote into the padding of buffer 'y': row 0, column 50 (3 padding element(s) changed, found "
        "after validation launch 1); only columns below the row length may be written*",
    ])


def test_the_case_files_and_the_worker_request_hold_the_logical_rows(tmp_path):
    suite = load_suite(padded_suite(tmp_path / "padded"))
    small = suite.case("small")
    assert np.load(suite.input_path(small, suite.signature[0])).shape == (3, 50)
    request = run_request(suite, suite.kernel("honest"), [small], output_dir=tmp_path / "out")
    assert request["cases"][0]["buffers"]["x"]["layout"] == [3, 50, 53]
    assert request["cases"][0]["buffers"]["y"] == {"count": 150, "layout": [3, 50, 64]}


@pytest.mark.parametrize("old, new, message", [
    ('ldy: "cdiv(cols, 32) * 32"', "ldy: cols - 1",
     "line 5: signature[1].ld: ld = ldy gives 49 in case 'small', less than the row length 50 of buffer 'y': its "
     "rows would overlap; make ld at least cols"),
    ("size: rows*cols, shape: [rows, cols], ld: ldx}", "size: rows*cols, ld: ldx}",
     "line 4: signature[0].ld: 'x' has no 2-D shape; `ld` is the distance between the rows of a [rows, cols] buffer: "
     "give it `shape: [ROWS, COLS]`, or remove `ld`"),
    ("ld: ldx}", "ld: width}",
     "line 4: signature[0].ld: 'width' uses width, which is not a scalar parameter (scalars: cols, ldx, ldy, rows)"),
])
def test_a_bad_leading_dimension_is_one_line(tmp_path, capsys, old, new, message):
    path = padded_suite(tmp_path / "padded", PADDED_YAML.replace(old, new), data=False)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n  - ") == 1 and "Traceback" not in err


def test_a_suite_without_ld_signs_as_before(tmp_path):
    from pytest_cudagate.trust.manifest import collect_manifest

    manifest, _ = collect_manifest(load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML, data=False)))
    assert all("ld" not in p for p in manifest["signature"])
    assert all("ulp" not in t for t in manifest["tolerance"].values())
