"""Every timed launch's outputs checked, on a real GPU (issue 28, route 9): the CUDA digest equals its
numpy definition, and kernels wrong on one launch in 64 or in 256 are rejected by the interleaved gate
while the honest kernel passes (tests/gpu/test_latency_gate_gpu.py's A/A run covers false alarms too)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpu_support import cli, copy_suite, gate

from cudagate_harness import digest
from cudagate_harness.compiler import compile_kernel
from cudagate_harness.driver import Device

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).resolve().parents[1] / "adversarial" / "kernels"


def test_the_cuda_digest_equals_its_numpy_definition():
    device = Device(0)
    result = compile_kernel(digest.SOURCE, entry=digest.ENTRY, arch=device.arch)
    assert result.ok, result.log
    _, function = device.load(result.cubin, result.lowered_name)
    digester = digest.Digester(device, function, int(device.describe()["sm_count"]))
    rng = np.random.default_rng(7)
    out = device.alloc(8)
    for nbytes in (1, 7, 8, 9, 4096, 4099, (1 << 22) + 5):
        data = rng.integers(0, 256, nbytes, dtype=np.uint8)
        ptr = device.alloc(nbytes)
        try:
            device.upload(ptr, data)
            key = int(rng.integers(0, 2**63)) * 2 + 1
            device.fill(out, 0, 8)
            digester.add(ptr, nbytes, key, out)
            device.synchronize()
            got = int(device.download(out, np.zeros(1, np.uint64))[0])
            assert got == digest.digest(data, key), nbytes
        finally:
            device.free(ptr)
    device.free(out)


def plant(root: Path, every: int) -> None:
    """The suite's kernel replaced by one that writes zeros on one launch in ``every`` of each block."""
    shutil.copy(KERNELS / "common.cuh", root / "common.cuh")
    text = (KERNELS / "rare_wrong.cu").read_text().replace("rare_wrong(", "softmax_rows(")
    (root / "softmax.cu").write_text(f"#define EVERY {every}\n{text}")


@pytest.mark.parametrize("every", [64, 256])
def test_a_kernel_wrong_on_one_launch_in_n_is_rejected_by_the_interleaved_gate(tmp_path: Path, every: int):
    root = copy_suite("softmax", tmp_path)
    approved = cli("approve", str(root / "cudagate.yaml"), "--approved-by", "gpu-test", cwd=root)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    plant(root, every)
    report = tmp_path / "report"
    result = gate(root / "cudagate.yaml", "--cuda-gate-report", str(report))
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    items = {i["case"]: i for i in json.loads((report / "report.json").read_text())["items"]
             if i.get("kernel") == "softmax_rows" and i["kind"] == "performance"}
    assert items, out
    if os.environ.get("OUT"):  # the messages, for the record (docs/hardening.md quotes them)
        record = Path(os.environ["OUT"]) / "adversarial"
        record.mkdir(parents=True, exist_ok=True)
        (record / f"one_in_{every}.txt").write_text("\n\n".join(f"{case}: {i['message']}" for case, i in items.items()))
    for case, item in items.items():
        text = json.dumps(item)
        assert not item["passed"], f"{case}: {text[:2000]}"
        assert "differ bitwise from validation launch 1 on the same inputs" in text, f"{case}: {text[:2000]}"
