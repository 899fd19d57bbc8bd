"""`ulp:` tolerances (issue 44, item 6): an element passes within n units in the last place of the
expected value in the output's own type, or within atol + rtol*|expected|; every float type of the
signature measured alike; NaN and infinities judged as without it; integer outputs refuse it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cudagate_harness.protocol import encode, numpy_dtype, value_type
from helpers import KERNEL_CU, SUITE_YAML, replace_once, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.suite.model import Tolerance

inf, nan = float("inf"), float("nan")
# Values of every binade the small types hold, both signs, a value at the top of its binade, and zero.
WANT = [1.0, -1.0, 0.5, 3.0, -0.375, 0.0]


def stored(numbers, dtype: str) -> np.ndarray:
    """``numbers`` as a ``dtype`` output holds them (a low-precision type's bits)."""
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return encode(np.asarray(numbers, np.float32), dtype)
    return np.asarray(numbers, dtype=numpy_dtype(dtype))


def stepped(want: np.ndarray, steps: int) -> np.ndarray:
    """``want`` moved ``steps`` representable values away from zero (the bit pattern's magnitude + steps)."""
    words = want.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]).copy()
    words += words.dtype.type(steps)  # the sign bit is the top one: the magnitude grows either way
    return words.view(want.dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_n_ulps_pass_and_one_more_fails_in_each_float_type(dtype):
    want = stored(WANT, dtype)
    got = stepped(want, 2)
    passed = check_output("y", got, want, Tolerance(ulp=2), output_scale=False)
    assert passed.ok, passed.describe()
    failed = check_output("y", got, want, Tolerance(ulp=1), output_scale=False)
    assert not failed.ok and failed.mismatches == len(WANT)
    assert failed.worst_ulp == 2.0
    assert "(2 ulp) > allowed" in failed.describe()
    assert "outside tolerance (atol=0, rtol=0, ulp=1, nan=fail)" in failed.describe()


def test_a_ulp_is_the_spacing_of_the_expected_value_in_the_outputs_type():
    want = np.array([1.0, 2.0 ** -130, 0.0, 1e30], np.float32)  # a subnormal and zero: the least spacing
    assert check_output("y", want + np.spacing(want) * 3, want, Tolerance(ulp=3), output_scale=False).ok
    result = check_output("y", want + np.spacing(want) * 4, want, Tolerance(ulp=3), output_scale=False)
    assert result.mismatches == 4 and result.worst_ulp == 4.0
    # bfloat16 has float32's exponents but 8 significant bits: 1 + 2^-7 is one ulp of 1.0.
    one = encode(np.array([1.0], np.float32), "bfloat16")
    assert check_output("y", encode(np.array([1 + 2 ** -7], np.float32), "bfloat16"), one, Tolerance(ulp=1)).ok


def test_ulp_or_atol_whichever_allows_more():
    want = np.array([1000.0, 1e-9], np.float32)
    got = np.array([np.nextafter(np.float32(1000), np.float32(2000)), 1e-7], np.float32)
    assert not check_output("y", got, want, Tolerance(ulp=4), output_scale=False).ok  # 1e-7 is far from 1e-9 in ulps
    assert not check_output("y", got, want, Tolerance(atol=1e-6), output_scale=False).ok  # 1000 + 1 ulp is beyond atol
    assert check_output("y", got, want, Tolerance(atol=1e-6, ulp=4), output_scale=False).ok


@pytest.mark.parametrize("got, want, nan_rule, ok", [
    ([inf], [inf], "fail", True),
    ([-inf], [inf], "fail", False),
    ([inf], [3.0e38], "fail", False),  # an overflow is no number of ulps away
    ([nan], [1.0], "fail", False),
    ([nan], [nan], "fail", False),
    ([nan], [nan], "equal", True),
    ([-0.0], [0.0], "fail", True),
])
def test_nan_and_infinities_are_judged_as_without_ulp(got, want, nan_rule, ok):
    result = check_output("y", np.array(got, np.float32), np.array(want, np.float32), Tolerance(ulp=1000, nan=nan_rule))
    assert result.ok is ok
    if not ok:
        assert result.worst_ulp is None and "ulp)" not in result.describe()


def test_value_type_of_each_low_precision_type_is_measured_by_its_own_limits():
    # FP8 e4m3's largest finite value is 448: one ulp below it is 416, 32 apart (3 mantissa bits).
    want = encode(np.array([448.0], np.float32), "float8_e4m3fn")
    got = encode(np.array([416.0], np.float32), "float8_e4m3fn")
    assert float(want.view(value_type("float8_e4m3fn"))[0]) == 448.0
    assert check_output("y", got, want, Tolerance(ulp=1), output_scale=False).ok
    assert not check_output("y", got, want, Tolerance(ulp=0), output_scale=False).ok


# -- through the gate: a suite whose output is judged in ulps ----------------------------------------

ULP_YAML = replace_once(replace_once(SUITE_YAML, "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {ulp: 4}"), "cases:\n", """\
  - name: near
    source: scale.cu
    entry: near
    launch: {grid: [rows], block: [128]}
  - name: far
    source: scale.cu
    entry: far
    launch: {grid: [rows], block: [128]}
cases:
""")
ULP_CU = KERNEL_CU + "".join(f"""
extern "C" __global__ void {name}(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {{
        int bits = __float_as_int(2.0f * x[r * cols + c]) + {steps};
        y[r * cols + c] = __int_as_float(bits);
    }}
}}
""" for name, steps in (("near", 2), ("far", 16)))
# The fake GPU runs the same: y = 2x moved 2 (near) or 16 (far) float32 values away from zero.
ULP_CONFTEST = """
import os
import sys

import numpy as np

sys.path.insert(0, {tests!r})
from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, scale_kernels, scale_xy, use_client  # noqa: E402


def off_by(steps):
    def body(launch):
        x, y, _ = scale_xy(launch)
        y.view(np.uint32)[:] = (2 * x).view(np.uint32) + np.uint32(steps)
    return FakeKernel(body, SCALE_PARAMS)


use_client(lambda **options: FakeWorker({{**scale_kernels(), "near": off_by(2), "far": off_by(16)}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


def test_the_gate_judges_an_output_in_ulps(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale", yaml_text=ULP_YAML, kernel_source=ULP_CU)
    (pytester.path / "conftest.py").write_text(ULP_CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "--cuda-gate-report", "report", "-v", timeout=180)
    tolerances = {item["kernel"]: item["correctness"]["comparisons"][0]["tolerance"]
                  for item in json.loads((pytester.path / "report" / "report.json").read_text())["items"]
                  if item.get("correctness")}
    assert tolerances["far"]["ulp"] == 4, tolerances
    result.stdout.fnmatch_lines_random([
        "*cudagate.yaml::scale2::small PASSED*", "*cudagate.yaml::near::small PASSED*",
        "*cudagate.yaml::far::small FAILED*", "*cudagate.yaml::far::perf FAILED*",
        "*output 'y': 150 of 150 elements outside tolerance (atol=0, rtol=0, ulp=4, nan=fail)*",
        "*worst at index *|diff| * (1? ulp) > allowed *",
    ])


def test_ulp_on_an_integer_output_is_refused_in_one_line(tmp_path, capsys):
    text = SUITE_YAML.replace("{name: y, buffer: float32", "{name: y, buffer: int32").replace(
        "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {atol: 0, ulp: 2}")
    path = write_suite(tmp_path / "s", yaml_text=text, data=False)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("line 11: tolerance.y.ulp: the output is int32: units in the last place belong to float outputs; remove "
            "`ulp` and use atol (0 for exact integers)") in err
    assert err.count("\n  - ") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_a_report_names_ulp_only_where_the_suite_gives_it(pytester, monkeypatch):
    """A suite without `ulp` reads in report.json as before ulp existed (benchmarks/report_equality.py)."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale")
    (pytester.path / "conftest.py").write_text(ULP_CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                  "--cuda-gate-report", "report", timeout=180)
    items = json.loads((pytester.path / "report" / "report.json").read_text())["items"]
    tolerances = [c["tolerance"] for item in items if item.get("correctness") for c in item["correctness"]["comparisons"]]
    assert tolerances and all(t is not None and "ulp" not in t for t in tolerances), tolerances
