"""Steps beyond launches on a real GPU (issue 44): the driver's memsets for every element width, the cuBLAS
GEMM step in float32, bfloat16 and float16, row- and column-major with alpha and beta against numpy, and
whole operations through the gate: a memset before a kernel, a copy before a kernel, and
examples/attention (cuBLAS -> memset -> two kernels -> cuBLAS).
cuBLAS comes from pip's wheels (torch brings them) or $CUDAGATE_CUBLAS, as the library baseline's does."""

from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu_support import EXAMPLES, gate, unavailable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import SUITE_YAML, write_suite  # noqa: E402
from test_library_steps import COPY_YAML, expected_gemm  # noqa: E402

from cudagate_harness import library  # noqa: E402
from cudagate_harness.protocol import encode, numpy_dtype, values  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device():
    from cudagate_harness.driver import Device

    return Device(0)


@pytest.fixture
def cublas(pytestconfig):
    path, how = library.find_cublas()
    if path is None:
        unavailable(pytestconfig, f"cuBLAS not found ({how}): {library.CUBLAS_HINT}")


def upload(device, array: np.ndarray) -> int:
    ptr = device.alloc(array.nbytes)
    device.upload(ptr, array)
    return ptr


@pytest.mark.parametrize("dtype, value, bits", [
    ("float32", -np.inf, 0xFF800000), ("bfloat16", 1.0, 0x3F80), ("float16", -2.0, 0xC000), ("int8", -3, 0xFD),
    ("float64", -np.inf, 0xFFF0000000000000), ("float64", 0.0, 0), ("int64", 7, 7)])
def test_set_elements_writes_every_element_and_nothing_past_it(device, dtype, value, bits):
    count = 1001
    itemsize = numpy_dtype(dtype).itemsize
    ptr = upload(device, np.full((count + 16) * itemsize, 0xA5, np.uint8))
    try:
        device.set_elements(ptr, bits, itemsize, count)
        device.synchronize()
        raw = device.download(ptr, np.empty((count + 16) * itemsize, np.uint8))
    finally:
        device.free(ptr)
    got = values(raw[:count * itemsize].view(numpy_dtype(dtype)))
    assert np.all(got == value), got[:8]
    assert np.all(raw[count * itemsize:] == 0xA5)


def stored(data: np.ndarray, dtype: str) -> np.ndarray:
    return encode(data, dtype) if dtype == "bfloat16" else data.astype(numpy_dtype(dtype))


@pytest.mark.parametrize("dtype, out, layout, trans_a, trans_b, batch", [
    *((d, d, layout, ta, tb, 1) for d, layout, ta, tb in itertools.product(
        ["float32", "bfloat16", "float16"], ["row", "col"], [False, True], [False, True])),
    ("bfloat16", "float32", "row", False, True, 3), ("float16", "float32", "col", True, False, 2),
    ("float32", "float32", "row", False, True, 4)])
def test_the_cublas_gemm_step_computes_what_the_docs_say(device, cublas, dtype, out, layout, trans_a, trans_b, batch):
    options = library._gemm_complete({"m": 67, "n": 45, "k": 33, "layout": layout, "trans_a": trans_a,
                                      "trans_b": trans_b, "alpha": 0.5, "beta": -1.5, "batch": batch})
    counts = {role: batch * options[f"stride_{role}"] for role in "abc"}
    assert library._gemm_fits(counts, options) is None
    rng = np.random.default_rng(3)
    # Small integers and halves: exact in every type, so the only error is float32 accumulation's.
    host = {role: rng.integers(-8, 9, counts[role]).astype(np.float64) / 2 for role in "abc"}
    types = {"a": dtype, "b": dtype, "c": out}
    pointers = {role: upload(device, stored(host[role], types[role])) for role in "abc"}
    try:
        gemm = library.CublasGemm(device)
        gemm.enqueue(pointers, types, options)
        device.synchronize()
        got = values(device.download(pointers["c"], np.empty(counts["c"], numpy_dtype(out)))).astype(np.float64)
    finally:
        for ptr in pointers.values():
            device.free(ptr)
    want = expected_gemm(host["a"], host["b"], host["c"], options)
    # float32 results are exact here (small integers); a 16-bit output rounds once to its type.
    tolerance = 0 if out == "float32" else 2.0 ** -7 * np.abs(want)
    assert np.all(np.abs(got - want) <= tolerance), np.max(np.abs(got - want))


MEMSET_CU = """\
extern "C" __global__ void accumulate(const float* x, float* y, int rows, int cols)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] += 2.0f * x[i];
}
"""
MEMSET_YAML = SUITE_YAML.replace(
    "    launch: {grid: [rows], block: [128]}\n",
    "    steps:\n      - memset: {buffer: y, value: 0}\n      - entry: accumulate\n        args: [x, y, rows, cols]\n"
    "        launch: {grid: [\"cdiv(rows*cols, 128)\"], block: [128]}\n")
@pytest.mark.parametrize("yaml_text, source", [(MEMSET_YAML, MEMSET_CU), (COPY_YAML, None)], ids=["memset", "copy"])
def test_an_operation_with_a_memset_or_a_copy_passes_the_gate(tmp_path, yaml_text, source):
    path = write_suite(tmp_path / "scale", yaml_text=yaml_text, **({"kernel_source": source} if source else {}))
    result = gate(path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "PASSED" in output and "perf" in output, output


def test_the_attention_example_passes_the_gate(tmp_path, cublas):
    """The whole example, its generated performance cases too (a copy carries no project keys: unsigned)."""
    folder = tmp_path / "attention"
    shutil.copytree(EXAMPLES / "attention", folder, ignore=shutil.ignore_patterns("approved", "cudagate.approvals.json"))
    result = gate(folder / "cudagate.yaml")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    passed = [line for line in output.splitlines() if line.startswith("PASSED")]
    for case in ("correct_2x37x16", "correct_3x300x64", "perf_8x512x64", "perf_16x1024x64", "holdout_4x700x32"):
        assert any(line.endswith(f"::attention_causal::{case}") for line in passed), output
