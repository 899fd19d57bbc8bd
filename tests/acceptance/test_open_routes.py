"""Routes by which a kernel can still be fast only where the gate times it (docs/hardening.md, "What is
not caught"). Each test says what the gate should answer; each is a strict expected failure, so the day
the route is closed it passes, fails as XPASS, and its mark goes. On the fake worker's simulated GPU,
with the real harness worker, gate and judge."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fake_worker import SCALE_PARAMS, FakeDevice, FakeKernel, FakeWorker, scale_xy
from helpers import SUITE_YAML, changed_after_approval, write_suite
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.latency import Latency
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint

NO_SANITIZER = SUITE_YAML + "checks: {sanitizer: off}\n"
BASE_MS = 0.010


def judge(tmp_path, slow_on):
    """The `scale` kernel approved, then changed into one that is right on every input and 3x slower
    wherever ``slow_on(launch, x)`` says (it runs before the kernel writes its output)."""
    suite, ledger = changed_after_approval(load_suite(write_suite(tmp_path / "scale", yaml_text=NO_SANITIZER)))
    program = suite.kernels[0]
    program.source.write_text(program.source.read_text() + "// attack\n")

    def build(spec: dict) -> FakeKernel:
        attack = "// attack" in spec["source"]
        rng = np.random.default_rng(zlib.crc32(spec["source"].encode()))

        def body(launch) -> None:
            x, y, _ = scale_xy(launch)
            slow = attack and slow_on(launch, x)
            y[:] = 2 * x
            launch.device.clock += BASE_MS * ((3.0 if slow else 1.0) * rng.normal(1, 0.01) - 1)

        return FakeKernel(body, SCALE_PARAMS)

    worker = FakeWorker(build)
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=3), tmp_path / "out")
    return gate.replay(suite, program, suite.case("perf"), ledger)


def memo(launch, x) -> bool:
    """Slow on inputs it has not seen, fast on a repeat: a real workload rarely repeats its inputs."""
    seen = launch.state.setdefault("seen", set())
    first = x.tobytes() not in seen
    seen.add(x.tobytes())
    return first


def poison_absent(launch, x) -> bool:
    """Slow unless the output holds one of the gate's fixed poison patterns when the kernel starts."""
    return int(launch.array("y", np.uint32, 1)[0]) not in (0xFFFFFFFF, 0x7F7F7F7F)


@pytest.mark.xfail(strict=True, reason="open: every timed launch repeats inputs a validation launch showed it")
def test_a_value_keyed_memo_regresses(tmp_path):
    assert judge(tmp_path, memo).latency.verdict is Latency.REGRESSED


@pytest.mark.xfail(strict=True, reason="open: the outputs' poison is a fixed pattern one load can test for")
def test_a_kernel_fast_only_on_poisoned_outputs_regresses(tmp_path):
    assert judge(tmp_path, poison_absent).latency.verdict is Latency.REGRESSED


def test_the_poison_keyed_kernel_is_slow_on_an_output_a_caller_reuses():
    """The control: on an output buffer that holds the last call's result, as a training loop leaves
    it, the same kernel takes its slow path."""
    device = FakeDevice()
    y = device.alloc(16)
    device.upload(y, np.arange(4, dtype=np.float32))

    class Launch:
        array = staticmethod(lambda name, dtype, n: device.view(y, np.dtype(dtype), n))

    assert poison_absent(Launch, None)
    device.fill(y, 0xFF, 16)
    assert not poison_absent(Launch, None)
