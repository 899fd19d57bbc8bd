"""The gate's defences against kernels that game it, end to end on a simulated GPU (no CUDA).

Each planted kernel (Python, on :mod:`fake_worker`'s FakeDevice) is one class of the
catalogue in docs/hardening.md; the real harness worker, the gate and the judge run unchanged, and
each must reject it with the reason a reviewer needs. The honest kernel must pass every defence.
The same classes, as CUDA kernels, run on a real GPU in tests/adversarial/.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from helpers import SUITE_YAML, replace_once, write_suite
from fake_worker import FakeDevice, FakeKernel, FakeWorker, Launch, honest, make_worker, scale_xy

from cudagate_harness.runner import Launchable, LaunchRefused, check_launch
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.worker.requests import kernel_spec, case_spec, run_request
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.trust import sign_suite
from pytest_cudagate.judge.correctness import judge_case

NO_SANITIZER = "checks: {sanitizer: off}\n"


class Fingerprint:
    def key(self) -> str:
        return "fake0000"

    def describe(self) -> str:
        return "a simulated GPU"


# -- planted kernels for the `scale` suite (y = 2 * x, rows × cols float32) -------------------------
def nothing(launch):  # class 1: relies on whatever the buffer held
    pass


def first_row(launch):  # class 2: computes part of the output
    x, y, _ = scale_xy(launch)
    cols = launch.args["cols"]
    y[:cols] = 2 * x[:cols]


def counts_calls(launch):  # classes 4 and 9: right twice, then does half the work
    x, y, n = scale_xy(launch)
    launch.state["calls"] = launch.state.get("calls", 0) + 1
    if launch.state["calls"] <= 2:
        y[:] = 2 * x
    else:
        y[: n // 2] = 2 * x[: n // 2]


def pointer_cache(launch):  # class 4: keyed by the input's address
    x, y, _ = scale_xy(launch)
    if launch.state.get("key") == launch.args["x"]:
        y[:] = launch.state["cache"]
        return
    y[:] = 2 * x
    launch.state.update(key=launch.args["x"], cache=y.copy())


def writes_past_end(launch):  # class 5
    x, y, n = scale_xy(launch)
    y[:] = 2 * x
    launch.at("y", np.float32, n, 3)[:] = 7.0


def writes_input(launch):  # class 5
    x, y, _ = scale_xy(launch)
    y[:] = 2 * x
    x[0] = 0.0


def nondeterministic(launch):  # classes 6 and 8: a different last bit now and then
    x, y, n = scale_xy(launch)
    y[:] = 2 * x
    launch.state["calls"] = launch.state.get("calls", 0) + 1
    i = launch.state["calls"] % n
    y[i] = np.nextafter(y[i], np.float32(np.inf))


def uninitialised_shared(launch):  # class 7: adds what shared memory held (benign zeros unless scrubbed)
    x, y, _ = scale_xy(launch)
    leftover = np.array([launch.device.shared_word], dtype=np.uint32).view(np.float32)[0]
    with np.errstate(all="ignore"):
        y[:] = 2 * x + leftover


def detects_timing(launch):  # class 9: does half the work when an L2 flush came before it
    x, y, n = scale_xy(launch)
    timed = launch.device.flushed
    y[: n // 2 if timed else n] = (2 * x)[: n // 2 if timed else n]


def wrong_on_new_values(launch):  # class 12: right only where x matches what it memorised
    x, y, n = scale_xy(launch)
    memory = launch.state.setdefault("memory", {})
    key = x.tobytes()[:64]
    if not memory:
        memory[key] = 2 * x
    y[:] = memory.get(key, np.zeros(n, np.float32))[:n] if len(memory.get(key, ())) == n else 0.0


def fragile(launch):  # class 13: right on small values, overflows on large ones
    # exp of the raw input in float32, as a softmax that skips subtracting the row maximum: inf past 88,
    # well within what the adversarial sets reach (a square, overflowing only past 2^64, is what a correct
    # one-pass variance computes too, and the sets stay below it: test_one_pass_norms.py)
    x, y, _ = scale_xy(launch)
    with np.errstate(all="ignore"):
        y[:] = 2 * np.log(np.exp(x))


PLANTED = {name: globals()[name] for name in (
    "honest", "nothing", "first_row", "counts_calls", "pointer_cache", "writes_past_end", "writes_input",
    "nondeterministic", "uninitialised_shared", "detects_timing", "wrong_on_new_values", "fragile")}


def kernels_for(suite) -> dict[str, FakeKernel]:
    params = [p.protocol() for p in suite.signature]
    return {"scale2": FakeKernel(honest, params), **{name: FakeKernel(body, params) for name, body in PLANTED.items()}}


def replay_all(suite, names, tmp_path: Path, fresh_seed: int = 1234) -> dict[tuple[str, str], object]:
    client = FakeWorker(kernels_for(suite))
    gate = Gate(client, Fingerprint(), GateOptions(fresh_seed=fresh_seed), tmp_path / "out")
    ledger = Ledger.for_suite(suite)
    outcomes = {}
    for name in names:
        program = dataclasses.replace(suite.kernels[0], name=name, entry=name)
        for case in suite.cases:
            outcomes[name, case.name] = gate.replay(suite, program, case, ledger)
    return outcomes


@pytest.fixture(scope="module")
def scale_suite(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hardening") / "scale"
    return load_suite(write_suite(folder, yaml_text=SUITE_YAML + NO_SANITIZER))


@pytest.fixture(scope="module")
def outcomes(scale_suite, tmp_path_factory):
    return replay_all(scale_suite, list(PLANTED), tmp_path_factory.mktemp("runs"))


def message(outcomes, kernel, case) -> str:
    outcome = outcomes[kernel, case]
    return outcome.message + "\n" + (outcome.warning or "")


def test_the_honest_kernel_passes_every_defence(outcomes):
    for case in ("small", "perf"):
        outcome = outcomes["honest", case]
        assert not outcome.failed, outcome.message
        assert outcome.correctness.passed and not outcome.correctness.problems


@pytest.mark.parametrize("kernel, case, reasons", [
    ("nothing", "small", ["150 elements were never written by the kernel", "is wrong on the fresh inputs too"]),
    ("first_row", "small", ["100 elements were never written by the kernel"]),
    ("counts_calls", "small", ["wrong on fresh inputs (resampled"]),
    ("counts_calls", "perf", ["8192 elements were never written by the kernel"]),  # still counting: cheats from launch 1
    ("pointer_cache", "small", ["wrong on fresh inputs", "bit for bit its output on the signed inputs",
                                "returned a cached result"]),
    ("writes_past_end", "small", ["the kernel wrote past the end of buffer 'y'", "12 canary bytes",
                                  "the nearest 0 bytes after its end", "validation launch 1"]),
    ("writes_input", "perf", ["the kernel wrote into input buffer 'x'"]),
    ("nondeterministic", "small", ["is not deterministic"]),
    ("uninitialised_shared", "small", ["outside tolerance"]),
    ("detects_timing", "perf", ["were not written by the timed launches", "the kernel does less work when timed"]),
    ("fragile", "small", ["wrong on fresh inputs (adversarial: magnitudes spread over 2^±16"]),
    ("fragile", "perf", ["wrong on fresh inputs (adversarial"]),
])
def test_each_planted_kernel_is_rejected_with_its_reason(outcomes, kernel, case, reasons):
    outcome = outcomes[kernel, case]
    assert outcome.failed, f"{kernel} × {case} passed:\n{outcome.warning}"
    for reason in reasons:
        assert reason in outcome.message, outcome.message


def test_a_kernel_wrong_on_the_signed_inputs_leads_with_that(outcomes):
    text = outcomes["nothing", "small"].message
    lines = text.splitlines()
    assert lines[1].startswith("output 'y': 150 of 150 elements outside tolerance"), text
    assert "returned a cached result" not in text and "wrong after the timed launches" not in text
    assert "wrong on fresh inputs (" not in text  # one line says the fresh inputs fail too


def test_an_input_write_explains_why_the_second_launch_differs(outcomes):
    text = outcomes["writes_input", "small"].message
    assert "wrong on a second launch on the same inputs: it had written into its input 'x'" in text, text
    assert "after the timed launches" not in text  # a correctness case has none


def test_the_worker_reports_time_per_step(outcomes):
    steps = outcomes["honest", "perf"].correctness.step_seconds
    assert {"validation", "scrub", "warm_up", "timing", "guard_zones", "input_check", "timed_output_check",
            "fresh_inputs"} <= set(steps), steps


def test_the_timing_detector_passes_the_validation_launches(outcomes):
    """Only the check of what the timed launches wrote catches it: launch 2 (no flush before it) is right."""
    text = outcomes["detects_timing", "perf"].message
    assert "right on the first launch but wrong after" not in text
    assert not outcomes["detects_timing", "small"].failed  # no timed launches on a correctness case


def test_a_failure_on_fresh_inputs_says_how_to_draw_them_again(outcomes):
    assert "CUDAGATE_FRESH_SEED=1234 draws them again" in outcomes["pointer_cache", "small"].message


def test_the_recorded_request_leaves_out_the_fresh_inputs(outcomes):
    (request,) = outcomes["honest", "small"].requests
    assert request["checks"] == {"guards": True, "scrub_shared": True, "timed_outputs": True}
    assert "fresh" not in request["cases"][0]


# -- class 3: zeros or a constant where the expected outputs are tiny ------------------------------------
TINY_YAML = replace_once(replace_once(SUITE_YAML, "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {atol: 1.0e-4, rtol: 1.0e-4}"),
                         "python: reference.py:scale_rows", "python: reference.py:tiny") + NO_SANITIZER
TINY_REFERENCE = """
import numpy as np


def tiny(x, rows, cols):
    return (x.astype(np.float64).reshape(rows, cols) * 1e-6).astype(np.float32)
"""


def tiny_kernels(suite):
    params = [p.protocol() for p in suite.signature]

    def scaled(launch):
        x, y, _ = scale_xy(launch)
        y[:] = x * np.float32(1e-6)

    def zeros(launch):
        _, y, _ = scale_xy(launch)
        y[:] = 0.0

    def constant(launch):
        x, y, _ = scale_xy(launch)
        y[:] = np.float32(1e-7)

    return {"scale2": FakeKernel(scaled, params), "zeros": FakeKernel(zeros, params),
            "constant": FakeKernel(constant, params)}


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "scale"
    folder.mkdir(parents=True)
    (folder / "reference.py").write_text(TINY_REFERENCE)
    path = write_suite(folder, yaml_text=TINY_YAML, data=False)
    (folder / "reference.py").write_text(TINY_REFERENCE)  # write_suite wrote the default one

    generate(load_suite(path))
    return load_suite(path)


def test_zeros_and_constants_fail_where_the_tolerance_is_loose_for_the_output_scale(tiny_suite, tmp_path):
    client = FakeWorker(tiny_kernels(tiny_suite))
    gate = Gate(client, Fingerprint(), GateOptions(fresh_seed=7), tmp_path)
    ledger = Ledger.for_suite(tiny_suite)
    for name in ("scale2", "zeros", "constant"):
        program = dataclasses.replace(tiny_suite.kernels[0], name=name, entry=name)
        outcome = gate.replay(tiny_suite, program, tiny_suite.case("perf"), ledger)
        if name == "scale2":
            assert not outcome.failed, outcome.message
            continue
        assert outcome.failed, name
        assert "would pass its tolerance on this case" in outcome.message
        assert "judged against the output's own scale" in outcome.message
        assert ("the kernel wrote all zeros" if name == "zeros" else "the kernel wrote the constant 1e-07") in outcome.message


def test_the_relaxed_scale_check_lets_zeros_through_and_says_so(tiny_suite, tmp_path):
    path = tiny_suite.path
    relaxed = path.read_text().replace(NO_SANITIZER, "checks: {sanitizer: off, output_scale: false}\n")
    path.write_text(relaxed)
    try:
        suite = load_suite(path)
        gate = Gate(FakeWorker(tiny_kernels(suite)), Fingerprint(), GateOptions(fresh_seed=7), tmp_path)
        program = dataclasses.replace(suite.kernels[0], name="zeros", entry="zeros")
        outcome = gate.replay(suite, program, suite.case("perf"), Ledger.for_suite(suite))
        assert not outcome.failed, outcome.message
        assert "checks.output_scale: false" in outcome.warning
    finally:
        path.write_text(TINY_YAML)


# -- relaxations: explicit, said in every outcome, and signed ------------------------------------------------
def suite_with(tmp_path: Path, checks: str):
    path = write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + checks)
    return load_suite(path)


def test_relaxed_determinism_passes_nondeterminism_within_tolerance_and_says_so(tmp_path):
    suite = suite_with(tmp_path, "checks: {sanitizer: off, determinism: tolerance}\n")
    outcomes = replay_all(suite, ["nondeterministic"], tmp_path)
    for case in ("small", "perf"):
        outcome = outcomes["nondeterministic", case]
        assert not outcome.failed, outcome.message
        assert "checks.determinism: tolerance" in outcome.warning
        assert "differed bitwise between two launches" in outcome.warning or "timed launches differed" in outcome.warning
        assert "the suite is unsigned" in outcome.warning


def test_without_fresh_inputs_the_pointer_cache_passes_and_the_outcome_says_fresh_inputs_are_off(tmp_path):
    suite = suite_with(tmp_path, "checks: {sanitizer: off, fresh_inputs: 0}\n")
    outcome = replay_all(suite, ["pointer_cache"], tmp_path)["pointer_cache", "small"]
    assert not outcome.failed
    assert "checks.fresh_inputs: 0" in outcome.warning and "no fresh inputs are checked" in outcome.warning


def test_without_the_scrub_uninitialised_shared_memory_goes_unseen(tmp_path):
    suite = suite_with(tmp_path, "checks: {sanitizer: off, scrub_shared: false}\n")
    outcome = replay_all(suite, ["uninitialised_shared"], tmp_path)["uninitialised_shared", "small"]
    assert not outcome.failed  # the simulated leftovers are zeros: benign, as on many real runs
    assert "checks.scrub_shared: false" in outcome.warning


def test_without_guard_zones_a_write_past_the_end_is_not_reported(tmp_path):
    suite = suite_with(tmp_path, "checks: {sanitizer: off, guard_zones: false}\n")
    outcome = replay_all(suite, ["writes_past_end"], tmp_path)["writes_past_end", "small"]
    assert "canary bytes" not in outcome.message
    assert "checks.guard_zones: false" in (outcome.warning or outcome.message)


def test_a_relaxation_the_signature_does_not_cover_is_ignored(tmp_path):
    key = Ed25519PrivateKey.generate()
    sign_suite(suite_with(tmp_path, "checks: {sanitizer: off}\n"), key)  # signed before the relaxation
    relaxed = "checks: {sanitizer: off, determinism: tolerance}\n"
    (tmp_path / "scale" / "cudagate.yaml").write_text(SUITE_YAML + relaxed)
    suite = load_suite(tmp_path / "scale" / "cudagate.yaml")
    outcome = replay_all(suite, ["nondeterministic"], tmp_path)["nondeterministic", "small"]
    assert outcome.failed and "is not deterministic" in outcome.message
    assert "does not cover that, so every check applies" in outcome.message
    sign_suite(suite, key)  # now the signature covers it
    outcome = replay_all(suite, ["nondeterministic"], tmp_path / "again")["nondeterministic", "small"]
    assert not outcome.failed, outcome.message


# -- the worker: compare mode, launch limits, error phases -----------------------------------------------------
def compare_request(suite, current: str, tmp_path: Path) -> dict:
    case = suite.case("perf")
    program = suite.kernels[0]
    launch = program.launch_for(case.name).resolve(case.scalars)
    return {"protocol": 1, "op": "compare", "kernels": {"approved": kernel_spec(program),
                                                        "current": {**kernel_spec(program), "entry": current}},
            "launches": {"approved": launch, "current": launch}, "signature": [p.protocol() for p in suite.signature],
            "case": case_spec(suite, program, case), "timing": {**suite.timing.to_json(), "chunk": 30, "warmup_ms": 0},
            "output_dir": str(tmp_path)}


@pytest.mark.parametrize("current, reason", [
    ("scale2", None),
    ("detects_timing", "were not written by the timed launches"),
    ("writes_input", "the kernel wrote into input buffer 'x'"),
])
def test_compare_checks_the_current_kernels_timed_outputs(scale_suite, tmp_path, current, reason):
    client = FakeWorker(kernels_for(scale_suite))
    request = compare_request(scale_suite, current, tmp_path)
    result = client.compare(request, lambda chunk: 0)
    body = result.body
    assert body["status"] == "ok", body
    assert body["timed"]["checked"] >= 1
    case = scale_suite.case("perf")
    expected = scale_suite.resolved(case).expected_outputs()
    verdict = judge_case(current, "perf", body, expected, scale_suite.tolerance)
    approved = judge_case("approved", "perf", {"status": "ok", **body["approved"]}, expected, scale_suite.tolerance)
    if reason is None:
        assert verdict.passed, verdict.describe()
    else:
        assert not verdict.passed and reason in verdict.describe(), verdict.describe()
    if current != "writes_input":  # an input written during interleaved timing cannot be pinned on one kernel
        assert approved.passed, approved.describe()


def test_a_launch_the_device_cannot_run_is_refused_with_the_limit_it_breaks():
    device = FakeDevice()
    kernel = FakeKernel(honest, [], static_shared=1024, max_threads=256, registers=128)

    def refused(grid, block, shared=0) -> str:
        with pytest.raises(LaunchRefused) as info:
            check_launch(device, Launchable(kernel, grid, block, shared))
        return str(info.value)

    assert "has 2048 threads; this device allows at most 1024 per block" in refused((1, 1, 1), (2048, 1, 1))
    assert "uses 128 registers per thread, so at most 256 of its threads fit" in refused((1, 1, 1), (512, 1, 1))
    assert "is 128 threads along z; this device allows at most 64" in refused((1, 1, 1), (1, 1, 128))
    assert "asks for 300000 bytes of dynamic shared memory per block (plus 1024 bytes static)" in refused(
        (1, 1, 1), (32, 1, 1), 300000)
    assert "is 70000 blocks along y" in refused((1, 70000, 1), (32, 1, 1))
    check_launch(device, Launchable(kernel, (1, 1, 1), (256, 1, 1), 1000))  # fits


def test_a_fault_in_the_timed_launches_is_attributed_to_them(scale_suite, tmp_path):
    def faults_when_timed(launch):
        x, y, n = scale_xy(launch)
        launch.state["calls"] = launch.state.get("calls", 0) + 1
        if launch.state["calls"] > 40:
            launch.at("y", np.float32, 1 << 30, 1)[:] = 0.0  # far past any allocation
        y[:] = 2 * x

    kernels = kernels_for(scale_suite)
    kernels["faulty"] = FakeKernel(faults_when_timed, [p.protocol() for p in scale_suite.signature])
    client = FakeWorker(kernels)
    program = dataclasses.replace(scale_suite.kernels[0], name="faulty", entry="faulty")
    request = run_request(scale_suite, program, [scale_suite.case("perf")], output_dir=tmp_path,
                          timing={**scale_suite.timing.to_json(), "warmup": 2, "warmup_ms": 0})
    body = client.run(request).cases["perf"]
    assert body["error"]["kind"] == "fault" and body["error"]["phase"].startswith("the timed launches (rounds")
    verdict = judge_case("faulty", "perf", body, {}, {})
    assert "the kernel faulted during the timed launches (rounds" in verdict.describe()
    assert client.restarts == 1  # the worker exits after a sticky fault, as a real one does


def test_the_sanitizer_case_is_a_launch_without_poison_guards_or_scrub(scale_suite, tmp_path):
    seen = {}

    def records(launch):
        x, y, n = scale_xy(launch)
        seen["y_before"] = y.copy()
        seen["shared"] = launch.device.shared_word
        y[:] = 2 * x

    kernels = kernels_for(scale_suite)
    kernels["records"] = FakeKernel(records, [p.protocol() for p in scale_suite.signature])
    device = FakeDevice()
    lines = []
    worker = make_worker(kernels, device, lines.append)
    program = dataclasses.replace(scale_suite.kernels[0], name="records", entry="records")
    request = run_request(scale_suite, program, [scale_suite.case("small")], output_dir=tmp_path)
    request["cases"][0]["sanitize"] = True
    request["checks"] = {"guards": False, "scrub_shared": False, "timed_outputs": False}  # as sanitizer.run_tools sends
    worker.handle(request)
    body = next(line for line in lines if line["type"] == "case")
    assert body["status"] == "ok" and "fresh" not in body and "guards" not in body
    assert np.all(seen["y_before"].view(np.uint32) == 0x3C3C3C3C)  # as allocated: initcheck sees unwritten reads
    assert seen["shared"] == 0  # not scrubbed
    assert device.launches == 1
