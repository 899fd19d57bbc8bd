"""Timed launches are held until enqueued (the stream waits on a host-released word), so a µs
kernel's time is the GPU's work and not the host's enqueueing; where the driver cannot hold, launches
are timed unheld and the fingerprint says so, so the two ways never share a baseline."""

from __future__ import annotations

import json

from fake_worker import FakeDevice, FakeWorker, make_worker, scale_kernels
from helpers import SUITE_YAML, write_suite
from test_timing_repeat import REPEAT, interleaved, scale_suite
from cudagate_harness.runner import HELD_LAUNCHES
from pytest_cudagate import schema
from pytest_cudagate.approvals import Ledger
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


def test_a_long_hot_batch_is_released_before_the_drivers_queue_fills(tmp_path):
    """A 1024-launch batch behind one hold blocked the host on an H200 for ever (the stream waited for
    it): the hold covers the batch's first launches, the rest are enqueued while the GPU runs them."""
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + "timing: {warmup: 1, repeat: 3, cache: hot, "
                                                                                "batch: 1024}\n"))
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("perf")], output_dir=tmp_path / "out",
                                                timing=suite.timing.to_json())))
    device, lines = FakeDevice(), []
    make_worker(scale_kernels(), device=device, emit=lines.append).handle({**request, "id": 1})
    (body,) = [line for line in lines if line["type"] == "case"]
    assert body["status"] == "ok" and len(body["timing"]["samples_ms"]) == 3
    assert device.holds == device.released == 3 and device.most_behind_hold == HELD_LAUNCHES
