"""Fixed costs the gate no longer pays twice: a worker compiles an unchanged kernel once."""

from __future__ import annotations

from dataclasses import replace

from cudagate_harness import worker as worker_module
from cudagate_harness.messages import Kernel
from cudagate_harness.worker import Worker

from helpers import KERNEL_CU
from fake_worker import FakeDevice


def test_the_worker_compiles_each_kernel_once_and_says_so(monkeypatch, tmp_path):
    compiles = []
    real = worker_module.compile_kernel

    def counting(*args, **kwargs):
        compiles.append(kwargs["entry"])
        return real(*args, **kwargs)

    monkeypatch.setattr(worker_module, "compile_kernel", counting)
    device = FakeDevice()
    device.load = lambda cubin, name: (object(), f"function {name}")
    lines = []
    worker = Worker(device, lines.append, iter(()))
    spec = Kernel(source=KERNEL_CU, entry="scale2", source_name="scale.cu")
    first = worker.compiled(1, spec, "sm_90")
    again = worker.compiled(2, replace(spec), "sm_90")
    changed = worker.compiled(3, replace(spec, source=KERNEL_CU + "// changed\n"), "sm_90")
    assert first == again == changed == {"scale2": "function scale2"}
    assert compiles == ["scale2", "scale2"]  # the unchanged kernel was not compiled (nor read from disk) again
    assert [line["ok"] for line in lines] == [True, True, True]
    assert lines[1]["cache_hit"] and lines[1]["seconds"] == 0.0 and lines[1]["key"] == lines[0]["key"]
    assert lines[2]["key"] != lines[0]["key"]
