"""A kernel that recognises the signed inputs is timed on inputs it cannot know too (checks.fresh_timing):
half of each interleaved comparison's rounds run on a resampled set drawn in the run, both kernels
on the same set, and a kernel slower there than on the signed inputs fails. On the fake worker's
simulated GPU, with the real harness worker, gate and judge."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, scale_xy
from helpers import SUITE_YAML, changed_after_approval, write_suite
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.latency import MIN_SET_ROUNDS, Latency, inputs_check
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.boundary.wire import to_json

NO_SANITIZER = SUITE_YAML + "checks: {sanitizer: off}\n"
BASE_MS = 0.010  # the fake device's time per launch


def kernels(slow_on):
    """The `scale` kernel each build stands for: ``// keyed`` is 3x slower on an input where
    ``slow_on(x)`` says it does not recognise it; every build has 1 % noise of its own."""

    def build(spec: dict) -> FakeKernel:
        keyed = "// keyed" in spec["source"]
        rng = np.random.default_rng(zlib.crc32(spec["source"].encode()))

        def body(launch) -> None:
            x, y, _ = scale_xy(launch)
            y[:] = 2 * x
            slow = keyed and slow_on(x)
            launch.device.clock += BASE_MS * ((3.0 if slow else 1.0) * rng.normal(1, 0.01) - 1)

        return FakeKernel(body, SCALE_PARAMS)

    return build


@pytest.fixture
def judge(tmp_path):
    """The `scale` suite approved, its kernel then changed (``edit`` appended): the perf case's outcome
    and the compare requests the worker got."""

    def run(edit: str, yaml_text: str = NO_SANITIZER, **options):
        suite, ledger = changed_after_approval(load_suite(write_suite(tmp_path / "scale", yaml_text=yaml_text)))
        program = suite.kernels[0]
        program.source.write_text(program.source.read_text() + edit)
        head = np.load(suite.case_dir(suite.case("perf")) / "x.npy").reshape(-1)[:2].tobytes()
        worker = FakeWorker(kernels(lambda x: x[:2].tobytes() != head))  # the committed case's first two elements
        gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=3, **options),
                    tmp_path / "out")
        outcome = gate.replay(suite, program, suite.case("perf"), ledger)
        return outcome, [r for r in worker.requests if "kernels" in r]

    return run


def test_a_kernel_fast_only_on_the_signed_inputs_regresses(judge):
    outcome, (request,) = judge("// keyed\n")
    latency = outcome.latency
    assert outcome.failed and latency.verdict is Latency.REGRESSED
    assert latency.inputs.keyed and latency.inputs.fresh.ratio > 2.5 and 0.97 < latency.inputs.signed.ratio < 1.03
    assert "its speed depends on recognising the inputs it is timed on" in outcome.message
    assert "on inputs drawn in this run" in outcome.message
    # only the resampled set is timed (the adversarial one is for correctness), half of every chunk
    assert request["timing"]["fresh_share"] == 0.5
    assert [spec.get("timed", False) for spec in request["case"]["fresh"]] == [True, False]


def test_an_honest_change_passes_and_says_both_ratios(judge):
    outcome, _ = judge("// a comment\n")
    latency = outcome.latency
    assert not outcome.failed and latency.verdict is Latency.PASS, outcome.message
    assert not latency.inputs.keyed and latency.inputs.fresh.n >= MIN_SET_ROUNDS
    assert "on the signed inputs" in latency.describe() and "on inputs drawn in this run" in latency.describe()


def test_a_kernel_keyed_on_the_signed_values_whatever_their_order_regresses(tmp_path):
    """An input without a distribution is shuffled in a fresh set, and half its values moved by one unit
    in the last place: an order-free fingerprint of the signed values (their XOR and sum) fails there."""
    suite, ledger = changed_after_approval(load_suite(write_suite(tmp_path / "scale", yaml_text=NO_SANITIZER)))
    program = suite.kernels[0]
    program.source.write_text(program.source.read_text() + "// keyed\n")

    def fingerprint(x: np.ndarray) -> tuple[int, int]:
        words = x.reshape(-1).view(np.uint32)
        return int(np.bitwise_xor.reduce(words)), int(words.astype(np.uint64).sum())

    key = fingerprint(np.load(suite.case_dir(suite.case("perf")) / "x.npy"))
    worker = FakeWorker(kernels(lambda x: fingerprint(x) != key))
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=3), tmp_path / "out")
    outcome = gate.replay(suite, program, suite.case("perf"), ledger)
    assert outcome.latency.verdict is Latency.REGRESSED and outcome.latency.inputs.keyed, outcome.message


def test_integer_inputs_a_fresh_set_keeps_are_said(tmp_path):
    """Integer data without a distribution (a sparse kernel's indices) stays as signed in a fresh set:
    the outcome says fresh timing cannot tell a kernel keyed on it."""
    yaml_text = NO_SANITIZER.replace(
        "  - {name: rows, scalar: int32}",
        "  - {name: idx, buffer: int32, intent: in, size: 8}\n  - {name: rows, scalar: int32}")
    folder = write_suite(tmp_path / "scale", yaml_text=yaml_text, data=False).parent
    (folder / "reference.py").write_text(
        "import numpy as np\n\n\ndef scale_rows(x, idx, rows, cols):\n"
        "    return (x.astype(np.float64).reshape(rows, cols) * 2).astype(np.float32)\n")
    generate(load_suite(folder / "cudagate.yaml"))
    suite, ledger = changed_after_approval(load_suite(folder / "cudagate.yaml"))
    params = SCALE_PARAMS[:2] + [{"name": "idx", "kind": "buffer", "dtype": "int32", "intent": "in"}] + SCALE_PARAMS[2:]
    worker = FakeWorker(lambda spec: FakeKernel(lambda launch: honest_scale(launch), params))
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=3), tmp_path / "out")
    outcome = gate.replay(suite, suite.kernels[0], suite.case("perf"), ledger)
    assert not outcome.failed, outcome.message
    assert "fresh timing keeps the signed values of idx (integer data without an `inputs:` distribution)" in \
        outcome.warning


def honest_scale(launch) -> None:
    x, y, _ = scale_xy(launch)
    y[:] = 2 * x


def test_relaxed_fresh_timing_times_the_signed_inputs_only_and_says_so(judge):
    outcome, (request,) = judge("// keyed\n", yaml_text=SUITE_YAML + "checks: {sanitizer: off, fresh_timing: false}\n")
    assert outcome.latency.verdict is Latency.PASS and outcome.latency.inputs is None
    assert "fresh_share" not in request["timing"]
    assert "latency is timed on the signed inputs only" in outcome.warning


def test_the_rounds_on_each_set_are_checked_and_counted_in_the_report(judge):
    outcome, _ = judge("// keyed\n")
    report = to_json(outcome.latency)
    assert report["inputs"]["keyed"] is True and report["inputs"]["shift"]["ratio"] > 2.5


def test_too_few_rounds_on_a_set_make_no_split():
    rng = np.random.default_rng(0)
    approved = list(rng.lognormal(np.log(0.01), 0.02, 40))
    current = list(np.array(approved) * 3)
    few = [i >= 40 - (MIN_SET_ROUNDS - 1) for i in range(40)]
    assert inputs_check(current, approved, few, 0.02, 0.99) is None
    half = [i % 2 == 1 for i in range(40)]
    check = inputs_check(current, approved, half, 0.02, 0.99)
    assert check is not None and not check.keyed  # 3x slower on both sets alike: a regression, not a key
