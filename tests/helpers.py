"""Small, valid cudagate suites written into a temporary folder, for the CPU test suite.

The suite ``scale`` doubles a ``rows × cols`` float32 matrix. Its reference is Python (numpy), so
its case data is generated without a GPU; its kernel compiles with the NVRTC from PyPI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudagate.defences.expected import generate
from pytest_cudagate.errors import FileError
from pytest_cudagate.suite.loader import load_suite

SUITE_YAML = """\
suite: scale
description: y = 2 * x, row by row
signature:
  - {name: x, buffer: float32, intent: in, size: rows*cols, shape: [rows, cols]}
  - {name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols]}
  - {name: rows, scalar: int32}
  - {name: cols, scalar: int32}
reference:
  python: reference.py:scale_rows
tolerance:
  y: {atol: 1.0e-6, rtol: 1.0e-5}
kernels:
  - name: scale2
    source: scale.cu
    launch: {grid: [rows], block: [128]}
cases:
  - {name: small, kind: correctness, scalars: {rows: 3, cols: 50}}
  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}
"""

REFERENCE_PY = """\
import numpy as np


def scale_rows(x, rows, cols):
    return (x.astype(np.float64).reshape(rows, cols) * 2).astype(np.float32)
"""

KERNEL_CU = """\
extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[r * cols + c] = 2.0f * x[r * cols + c];
}
"""

# Line 3 uses an undefined name: NVRTC reports "scale.cu(3): error: ...".
BROKEN_CU = """\
extern "C" __global__ void scale2(const float* x, float* y, int rows, int cols)
{
    y[0] = undefined_value_here;
}
"""


def write_suite(folder: Path, *, yaml_text: str = SUITE_YAML, kernel_source: str = KERNEL_CU,
                data: bool = True) -> Path:
    """Write the suite (yaml, .cu, reference.py) into ``folder``; generate its case data if asked."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cudagate.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    (folder / "scale.cu").write_text(kernel_source, encoding="utf-8")
    (folder / "reference.py").write_text(REFERENCE_PY, encoding="utf-8")
    if data:
        generate(load_suite(path))
    return path


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must occur exactly once) replaced by ``new``."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    """1-based number of the first line of ``text`` that contains ``needle``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in the text")


def load_text(tmp_path: Path, text: str):
    """Write the scale suite's files with ``text`` as its yaml (no case data) and load it."""
    path = write_suite(tmp_path / "s", yaml_text=text, data=False)
    return load_suite(path)


def problems_of(tmp_path: Path, text: str) -> tuple[FileError, str]:
    """The error loading ``text`` (as :func:`load_text`) raises, and its message, which names the file first."""
    with pytest.raises(FileError) as excinfo:
        load_text(tmp_path, text)
    error = excinfo.value
    assert error.path.endswith("cudagate.yaml")
    assert str(error).startswith(error.path + ":\n")
    return error, str(error)


TESTS = Path(__file__).resolve().parent  # the support modules (fake_worker, stub_worker, ...) and data folders
REPO = TESTS.parent
EXAMPLES = REPO / "examples"


def changed_after_approval(suite):
    """``suite``'s kernel approved as it is, then its source changed: (the reloaded suite, its ledger),
    so every performance case is timed interleaved against the approved version."""
    from pytest_cudagate.trust.approvals import Ledger, approval_for

    ledger = Ledger.for_suite(suite)
    program = suite.kernels[0]
    ledger.approvals[program.name] = approval_for(ledger, program, approved_by="a", approved_at="now", git={},
                                                  tool_version="test")
    ledger.save()
    program.source.write_text(program.source.read_text() + "// changed\n")
    return load_suite(suite.path), ledger


def fake_compute_sanitizer(folder: Path, body: str) -> Path:
    """A stand-in ``compute-sanitizer`` in ``folder`` that notes each tool it is started for in
    ``calls.txt``, then runs ``body`` (Python with ``tool``, ``log`` and ``here`` defined)."""
    import stat
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "compute-sanitizer"
    script.write_text(f"""#!{sys.executable}
import json, subprocess, sys, time
from pathlib import Path
args = sys.argv[1:]
tool, log = args[args.index("--tool") + 1], args[args.index("--log-file") + 1]
here = Path(__file__).parent
with open(here / "calls.txt", "a") as f:
    f.write(tool + "\\n")
{body}
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script
