"""Timed launches are held until enqueued (the stream waits on a host-released word), so a µs
kernel's time is the GPU's work and not the host's enqueueing; where the driver cannot hold, launches
are timed unheld and the fingerprint says so, so the two ways never share a baseline."""

from __future__ import annotations

import json

import pytest

from fake_worker import FakeDevice, FakeWorker, make_worker, scale_kernels
from helpers import SUITE_YAML, write_suite
from test_timing_repeat import REPEAT, interleaved, scale_suite
from cudagate_harness.driver import CudaError
from cudagate_harness.runner import HELD_LAUNCHES
from pytest_cudagate.boundary import schema
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.worker.requests import run_request


def test_a_kernel_timed_alone_holds_every_timed_launch(tmp_path):
    suite = scale_suite(tmp_path / "scale")
    worker = FakeWorker(scale_kernels())
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=1), tmp_path / "out")
    outcome = gate.replay(suite, suite.kernels[0], suite.case("perf"), Ledger.for_suite(suite))
    assert len(outcome.correctness.samples_ms) == REPEAT
    device = worker.worker.device
    assert device.holds == device.released == REPEAT  # the timed launches only: warm-ups and checks are not timed


def test_both_kernels_of_the_interleaved_comparison_are_held(tmp_path):
    worker, outcome = interleaved(tmp_path)
    device = worker.worker.device
    # each pair's two launches, and at most one checked launch per chunk timed like them
    assert 2 * outcome.latency.pairs <= device.holds == device.released <= 2 * outcome.latency.pairs + 50


def answer(tmp_path, device: FakeDevice) -> tuple[dict, FakeDevice]:
    suite = scale_suite(tmp_path / "scale")
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("perf")], output_dir=tmp_path / "out",
                                                timing=suite.timing.to_json())))
    lines: list[dict] = []
    make_worker(scale_kernels(), device=device, emit=lines.append).handle({**request, "id": 1})
    assert [schema.problems(line, "harness-response") for line in lines] == [[]] * len(lines)
    (body,) = [line for line in lines if line["type"] == "case"]
    return body, device


def test_the_answer_says_its_launches_were_held(tmp_path):
    body, device = answer(tmp_path, FakeDevice())
    assert body["timing"]["held"] is True and device.holds == REPEAT


def test_without_stream_memory_operations_launches_are_timed_unheld(tmp_path):
    unable = FakeDevice()
    unable.holdable = False
    body, device = answer(tmp_path, unable)
    assert body["status"] == "ok" and len(body["timing"]["samples_ms"]) == REPEAT
    assert body["timing"]["held"] is False and device.holds == 0


def test_held_and_unheld_timings_are_different_hardware():
    hello = FakeWorker(scale_kernels()).start()
    held, unheld = Fingerprint.from_hello(hello), Fingerprint.from_hello({**hello, "timing_hold": False})
    assert held.key() != unheld.key()
    assert held.describe().endswith("launches held") and unheld.describe().endswith("launches unheld")


def hot_batch_answer(tmp_path, device: FakeDevice, batch: int = 1024) -> dict:
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + "timing: {warmup: 1, repeat: 3, cache: hot, "
                                                                                f"batch: {batch}}}\n"))
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("perf")], output_dir=tmp_path / "out",
                                                timing=suite.timing.to_json())))
    lines: list[dict] = []
    make_worker(scale_kernels(), device=device, emit=lines.append).handle({**request, "id": 1})
    (body,) = [line for line in lines if line["type"] == "case"]
    return body


def test_a_long_hot_batch_is_timed_in_held_groups_that_the_drivers_queue_takes(tmp_path):
    """1024 launches behind one hold blocked the host on an H200 for ever (the stream waited for it):
    a batch is timed in groups of HELD_LAUNCHES, each held between its own event pair, its time their sum."""
    device = FakeDevice()
    body = hot_batch_answer(tmp_path, device)
    assert body["status"] == "ok" and body["timing"]["samples_ms"] == pytest.approx([0.01] * 3)  # each fake launch 0.01 ms
    assert device.holds == device.released == 3 * 1024 // HELD_LAUNCHES and device.most_behind_hold == HELD_LAUNCHES


@pytest.mark.parametrize("failing", [10, 100])
def test_a_failed_enqueue_releases_its_hold_once(tmp_path, failing):
    """The 10th or the 100th launch of the first timed batch fails to enqueue: the group it is in is
    released (a stream left waiting would hang the worker), and no hold is released twice."""
    device = FakeDevice()
    launch, timed = device.launch, [0]

    def refusing(function, grid, block, shared_bytes, params):
        if device.holding:
            timed[0] += 1
            if timed[0] == failing:
                raise CudaError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuLaunchKernel")
        launch(function, grid, block, shared_bytes, params)

    device.launch = refusing
    body = hot_batch_answer(tmp_path, device)
    assert body["status"] == "error" and "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in json.dumps(body["error"])
    assert device.holds == device.released == (failing - 1) // HELD_LAUNCHES + 1 and not device.holding
