"""Derived scalars (issue 44): `derived: {n: rows*cols}` at the suite level, evaluated per case and
used in sizes, launches and kernel arguments, given to the reference only where it names them,
and signed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import SUITE_YAML, replace_once, write_suite
from trust_project import clean_env, make_project  # noqa: F401 - clean_env is an autouse fixture
from pytest_cudagate.cli import main

pytest_plugins = ["pytester"]

# `scale` with y = scale * x over n = rows*cols elements: the kernel takes n (int32) and scale
# (float32), both derived; the launch reads `blocks`, derived and in no signature.
DERIVED_YAML = replace_once(replace_once(replace_once(replace_once(
    SUITE_YAML,
    "  - {name: cols, scalar: int32}\n",
    "  - {name: cols, scalar: int32}\n  - {name: n, scalar: int32}\n  - {name: scale, scalar: float32}\n"),
    "launch: {grid: [rows], block: [128]}", "launch: {grid: [blocks], block: [128]}"),
    "size: rows*cols, shape: [rows, cols]}\n  - {name: y", "size: n, shape: [rows, cols]}\n  - {name: y"),
    "cases:\n", "derived: {blocks: 'cdiv(n, 128)', n: rows*cols, scale: '0.5**(rows*100) + rows/32'}\ncases:\n")

# Names `scale` but not `n` nor `blocks`: it gets the case's scalars and the derived one it names.
REFERENCE_PY = """\
import numpy as np
import pytest


def scale_rows(x, rows, cols, scale):
    return (x.astype(np.float64).reshape(rows, cols) * scale).astype(np.float32)
"""

KERNEL_CU = """\
extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int n,
                                  float scale)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = scale * x[i];
}
"""

# The fake GPU's kernel: it reads n and scale from its arguments and checks its grid.
CONFTEST = """
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, {tests!r})
from fake_worker import FakeKernel, FakeWorker, SCALE_PARAMS, use_client  # noqa: E402

PARAMS = SCALE_PARAMS + [{{"name": "n", "kind": "scalar", "dtype": "int32"}},
                         {{"name": "scale", "kind": "scalar", "dtype": "float32"}}]


def body(launch):
    n = launch.args["n"]
    assert launch.grid[0] == -(-n // 128), launch.grid
    launch.array("y", np.float32, n)[:] = launch.array("x", np.float32, n) * np.float32(launch.args["scale"])


use_client(lambda **options: FakeWorker({{"scale2": FakeKernel(body, PARAMS)}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


def derived_suite(folder: Path) -> Path:
    path = write_suite(folder, yaml_text=DERIVED_YAML, kernel_source=KERNEL_CU, data=False)
    (folder / "reference.py").write_text(REFERENCE_PY, encoding="utf-8")
    return path


def test_cases_generate_and_check_evaluate_derived_scalars(tmp_path, capsys):
    path = derived_suite(tmp_path / "scale")
    assert main(["cases", "generate", str(path)]) == 0, capsys.readouterr()
    assert main(["check", "--allow-unsigned", str(path)]) == 0, capsys.readouterr()
    x = np.load(tmp_path / "scale" / "cases" / "perf" / "x.npy")
    y = np.load(tmp_path / "scale" / "cases" / "perf" / "expected" / "y.npy")
    assert x.shape == (64, 256)  # the size n = rows*cols
    # scale = 0.5**6400 + 64/32: a power of a base within ±1 takes an exponent past 64 (a bias correction)
    np.testing.assert_array_equal(y, (x.astype(np.float64) * np.float64(np.float32(2.0))).astype(np.float32))


def test_a_reference_that_does_not_name_a_derived_scalar_is_called_as_before(tmp_path, capsys):
    path = derived_suite(tmp_path / "scale")
    path.write_text(replace_once(DERIVED_YAML, "scale: '0.5**(rows*100) + rows/32'", "scale: '2.0'"), encoding="utf-8")
    (tmp_path / "scale" / "reference.py").write_text(REFERENCE_PY.replace("cols, scale)", "cols)")
                                                     .replace("* scale)", "* 2)"), encoding="utf-8")
    assert main(["cases", "generate", str(path)]) == 0, capsys.readouterr()


def test_the_fake_gpu_gets_derived_scalars_as_arguments_and_in_launches(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    path = derived_suite(pytester.path / "scale")
    assert main(["cases", "generate", str(path)]) == 0
    (pytester.path / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           timeout=300)
    result.assert_outcomes(passed=3)  # the compile item and both cases


def test_derived_scalars_are_signed(tmp_path):
    project = make_project(tmp_path)
    project.edit(lambda raw: raw.update(derived={"half": "cdiv(rows, 2)"}))
    project.sign()
    assert project.verify().ok
    project.edit(lambda raw: raw.update(derived={"half": "rows // 2"}))
    result = project.verify()
    assert not result.ok
    assert any("derived" in problem and "half" in problem for problem in result.problems), result.problems


# -- device facts ---------------------------------------------------------------------------------
FACTS_YAML = replace_once(SUITE_YAML, "launch: {grid: [rows], block: [128]}",
                          "launch: {grid: ['sm_count * 2'], block: ['warp_size * 4'], shared_bytes: SHARED}")

# The fake GPU (4 SMs, warps of 32) checks its grid and block, then scales each row.
FACTS_CONFTEST = """
import os
import sys

import numpy as np

sys.path.insert(0, {tests!r})
from fake_worker import FakeKernel, FakeWorker, SCALE_PARAMS, use_client  # noqa: E402


def body(launch):
    assert (launch.grid, launch.block, launch.shared) == ((8, 1, 1), (128, 1, 1), 232448 // 2), \\
        (launch.grid, launch.block, launch.shared)
    n = launch.args["rows"] * launch.args["cols"]
    launch.array("y", np.float32, n)[:] = 2 * launch.array("x", np.float32, n)


use_client(lambda **options: FakeWorker({{"scale2": FakeKernel(body, SCALE_PARAMS)}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


@pytest.mark.slow
def test_launches_read_the_fake_gpus_facts_and_the_report_records_them(pytester, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    write_suite(pytester.path / "scale", yaml_text=FACTS_YAML.replace("SHARED", "'max_shared_per_block // 2'"))
    (pytester.path / "conftest.py").write_text(FACTS_CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-report", "out",
                                           "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=3)  # the compile item and both cases: 8 blocks on 4 SMs, not the stand-in's 264
    fields = json.loads((pytester.path / "out" / "report.json").read_text())["runs"][0]["fingerprint"]["fields"]
    assert (fields["sm_count"], fields["max_shared_per_block"], fields["warp_size"]) == (4, 232448, 32)


def test_check_resolves_device_facts_with_the_stated_stand_in(tmp_path, capsys):
    path = write_suite(tmp_path / "scale", yaml_text=FACTS_YAML.replace("SHARED", "'max_shared_per_block // 2'"))
    assert main(["check", "--allow-unsigned", str(path)]) == 0, capsys.readouterr()
    path.write_text(FACTS_YAML.replace("SHARED", "'max_shared_per_block * 2'"), encoding="utf-8")
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("cases[0]: scale2 launch in case 'small': shared_bytes = 464896 is outside 0..233472 (228 KiB) (without "
            "a GPU, device facts are an H100 SXM's: sm_count = 132, max_shared_per_block = 232448, warp_size = 32)"
            ) in err, err


@pytest.mark.slow
def test_a_launch_that_fails_on_this_gpus_facts_fails_its_cases_in_one_line(pytester, monkeypatch):
    """`cudagate check` works the launch out with the stand-in's 132 SMs; the fake GPU has 4, where
    `cdiv(rows, sm_count - 4)` divides by zero: each case fails saying so, with no traceback."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    yaml_text = FACTS_YAML.replace("['sm_count * 2']", "['cdiv(rows, sm_count - 4)']").replace("SHARED", "0")
    write_suite(pytester.path / "scale", yaml_text=yaml_text)
    (pytester.path / "conftest.py").write_text(FACTS_CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           timeout=300)
    result.assert_outcomes(passed=1, failed=2)  # the compile item; both cases
    out = result.stdout.str()
    assert "Traceback" not in out, out
    result.stdout.fnmatch_lines(["*kernel scale2, case small: its launch cannot be worked out on this GPU: *division*"])
