"""Padded buffers and `ulp:` tolerances on a real GPU (issue 44, item 6): a kernel that keeps to its rows
passes, one that writes one element past each row into the padding fails with the one-line message,
and a kernel whose float32 rounding differs from the reference's by a unit or two passes `ulp: 4`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpu_support import cli, gate

pytestmark = pytest.mark.gpu

SUITE = """\
suite: padded
description: y = 2 * x over rows that sit ld elements apart
signature:
  - {name: x, buffer: float32, intent: in, size: rows*cols, shape: [rows, cols], ld: ldx}
  - {name: y, buffer: float32, intent: out, size: rows*cols, shape: [rows, cols], ld: ldy}
  - {name: rows, scalar: int32}
  - {name: cols, scalar: int32}
  - {name: ldx, scalar: int32}
  - {name: ldy, scalar: int32}
derived: {ldx: cols + 3, ldy: "cdiv(cols, 32) * 32 + 32"}
reference:
  python: reference.py:scale_rows
tolerance:
  y: {ulp: 4}
kernels:
  - {name: honest, source: padded.cu, launch: {grid: [rows], block: [128]}}
  - {name: rounds, source: padded.cu, launch: {grid: [rows], block: [128]}}
  - {name: spills, source: padded.cu, launch: {grid: [rows], block: [128]}}
cases:
  - {name: small, kind: correctness, scalars: {rows: 3, cols: 50}}
  - {name: wide, kind: correctness, scalars: {rows: 40, cols: 1000}}
  - {name: perf, kind: performance, scalars: {rows: 512, cols: 1000}}
"""
REFERENCE = """\
import numpy as np


def scale_rows(x, rows, cols):
    return (x.astype(np.float64).reshape(rows, cols) * 2).astype(np.float32)
"""
KERNELS = "".join(f"""
extern "C" __global__ void {name}(const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int ldx,
                                  int ldy)
{{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < {bound}; c += blockDim.x)
        y[r * ldy + c] = {value};
}}
""" for name, bound, value in (("honest", "cols", "2.0f * x[r * ldx + c]"),
                               ("rounds", "cols", "__fdiv_rn(__fmul_rn(x[r * ldx + c], 3.0f), 1.5f)"),
                               ("spills", "cols + 1", "2.0f * x[r * ldx + c]")))


def test_padded_rows_and_ulp_tolerance_on_the_gpu(tmp_path: Path):
    root = tmp_path / "padded"
    root.mkdir()
    (root / "cudagate.yaml").write_text(SUITE)
    (root / "reference.py").write_text(REFERENCE)
    (root / "padded.cu").write_text(KERNELS)
    generated = cli("cases", "generate", str(root / "cudagate.yaml"), cwd=root)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    report = tmp_path / "report"
    result = gate(root / "cudagate.yaml", "--cuda-gate-report", str(report))
    out = result.stdout + result.stderr
    items = {(i["kernel"], i["case"]): i for i in json.loads((report / "report.json").read_text())["items"]
             if i.get("case")}
    if os.environ.get("OUT"):  # the messages, for the record
        (Path(os.environ["OUT"]) / "padded_ulp.txt").write_text(
            "\n\n".join(f"{k}: {i.get('message')}" for k, i in sorted(items.items())))
    for case in ("small", "wide", "perf"):
        assert items[("honest", case)]["passed"], out[-4000:]
        assert items[("rounds", case)]["passed"], out[-4000:]
        spilled = items[("spills", case)]
        assert not spilled["passed"], out[-4000:]
        assert ("the kernel wrote into the padding of buffer 'y': row 0, column "
                f"{50 if case == 'small' else 1000}") in json.dumps(spilled), json.dumps(spilled)[:3000]
