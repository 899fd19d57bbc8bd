"""What is refused before a kernel runs (no GPU needed): options that open the door to device-side
launches, through Gate.replay on the fake worker; launches no device can run, by the suite loader
(the worker checks the device's own limits again before each launch)."""

from __future__ import annotations

import pytest

from fake_worker import FakeWorker, scale_kernels
from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.errors import FileError
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint

KERNEL = "  - name: scale2\n    source: scale.cu\n    launch: {grid: [rows], block: [128]}\n"
PLANTED = {
    "rdc": "    options: [-rdc=true]\n", "dc": "    options: [-dc]\n", "dlto": "    options: [-dlto]\n",
    "ewp": "    options: [-ewp]\n",
}
OVERSIZED = {
    "big_block": "    launch_overrides: {small: {grid: [rows], block: [2048]}}\n",
    "big_smem": "    launch_overrides: {small: {grid: [rows], block: [128], shared_bytes: 300000}}\n",
}


def planted_suite(folder, planted: dict[str, str]):
    kernels = "".join(f"  - name: {name}\n    source: scale.cu\n    entry: scale2\n    launch: {{grid: [rows], block: [128]}}\n"
                      f"{extra}" for name, extra in planted.items())
    return write_suite(folder / "scale", yaml_text=replace_once(SUITE_YAML, KERNEL, KERNEL + kernels))


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Each planted kernel's outcome on the `small` case."""
    folder = tmp_path_factory.mktemp("refusals")
    suite = load_suite(planted_suite(folder, PLANTED))
    worker = FakeWorker(scale_kernels())
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=1), folder / "out")
    ledger = Ledger.for_suite(suite)
    return {name: gate.replay(suite, suite.kernel(name), suite.case("small"), ledger) for name in ["scale2", *PLANTED]}


@pytest.mark.parametrize("kernel, reasons", [
    ("rdc", ["does not compile", "option '-rdc=true' is not allowed: relocatable device code (and with it "
                                 "device-side launches) is refused"]),
    ("dc", ["does not compile", "option '-dc' is not allowed: relocatable device code"]),
    ("dlto", ["does not compile", "option '-dlto' is not allowed: link-time optimisation needs relocatable code"]),
    ("ewp", ["does not compile", "option '-ewp' is not allowed: extensible whole-program mode allows device-side "
                                 "launches"]),
])
def test_the_gate_refuses_with_the_reason(refused, kernel, reasons):
    assert not refused["scale2"].failed, refused["scale2"].message
    outcome = refused[kernel]
    assert outcome.failed
    for reason in reasons:
        assert reason in outcome.message, outcome.message


def test_launches_no_device_can_run_are_refused_when_the_suite_loads(tmp_path):
    with pytest.raises(FileError) as refused:
        load_suite(planted_suite(tmp_path, OVERSIZED))
    text = str(refused.value)
    assert "big_block launch in case 'small': block [2048, 1, 1] has 2048 threads, over the 1024 a block may hold" in text
    assert "big_smem launch in case 'small': shared_bytes = 300000 is outside 0..233472 (228 KiB)" in text
