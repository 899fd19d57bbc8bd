"""Every low-precision buffer type (bfloat16, float8_e4m3fn, float8_e5m2: protocol.LOW_PRECISION, so a
type added to DTYPES is taken through here too), end to end on the simulated GPU (no CUDA).

A suite of y = 2 * x in each type is generated, signed and verified, then replayed through the gate
with planted kernels (tests/fake_worker.py runs the real harness worker): the honest kernel passes,
one that writes nothing and one that writes only half of each bfloat16 element's bytes are rejected.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fake_worker import FakeKernel, FakeWorker
from helpers import replace_once

from cudagate_harness.protocol import LOW_PRECISION, encode, numpy_dtype, value_type, values
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.defences.fresh_inputs import prepare
from pytest_cudagate.defences.reference import ReferenceFailure, ReferenceRunner
from pytest_cudagate.errors import FileError
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.output_scale import flag_cases
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.cases import check_case_data
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import load_trusted_keys, sign_suite, verify_suite



def span(dtype: str) -> float:
    """The inputs' range ±span: 4, or less where 2x would pass the type's largest value (4 for a name
    that is no type: the loader's refusal is the test)."""
    return min(4.0, float(ml_dtypes.finfo(value_type(dtype)).max) / 4) if dtype in LOW_PRECISION else 4.0


SUITE = """\
suite: double_{dtype}
signature:
  - {{name: x, buffer: {dtype}, intent: in, size: n}}
  - {{name: y, buffer: {dtype}, intent: out, size: n}}
  - {{name: n, scalar: int32}}
reference:
  python: reference.py:double
tolerance:
  y: {{}}
inputs:
  x: {{distribution: uniform, low: -{span}, high: {span}}}
kernels:
  - name: double
    source: double.cu
    launch: {{grid: ["cdiv(n, 128)"], block: [128]}}
cases:
  - {{name: small, kind: correctness, scalars: {{n: 300}}}}
  - {{name: perf, kind: performance, scalars: {{n: 4096}}}}
checks: {{sanitizer: off}}
"""

# What the reference is handed and returns is recorded, so a test can see the calling convention.
REFERENCE = """\
import json, os
import numpy as np


def double(x, n):
    record = os.environ.get("LOWP_RECORD")
    if record:
        with open(record, "w") as f:
            json.dump({"x": str(x.dtype)}, f)
    return x * np.float32(2)
"""

KERNEL = 'extern "C" __global__ void double_it(const void* x, void* y, int n) {}\n'


def write(folder: Path, dtype: str, yaml_text: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cudagate.yaml"
    path.write_text(yaml_text or SUITE.format(dtype=dtype, span=span(dtype)))
    (folder / "reference.py").write_text(REFERENCE)
    (folder / "double.cu").write_text(KERNEL)
    return path


def kernels(suite) -> dict[str, FakeKernel]:
    dtype = suite.signature[0].dtype
    value, bits = value_type(dtype), numpy_dtype(dtype)
    params = [p.protocol() for p in suite.signature]

    def xy(launch):
        n = launch.args["n"]
        return launch.array("x", bits, n).view(value), launch.array("y", bits, n).view(value), n

    def honest(launch):  # float32 arithmetic, rounded to the output's type: what the reference does
        x, y, _ = xy(launch)
        y[:] = (x.astype(np.float32) * 2).astype(value)

    def nothing(launch):
        pass

    def high_bytes(launch):  # bfloat16: writes only the upper byte of each element (sign and exponent)
        x, _, n = xy(launch)
        right = (x.astype(np.float32) * 2).astype(value).view(np.uint8)
        launch.array("y", np.uint8, 2 * n)[1::2] = right[1::2]

    def low_bytes(launch):
        x, _, n = xy(launch)
        right = (x.astype(np.float32) * 2).astype(value).view(np.uint8)
        launch.array("y", np.uint8, 2 * n)[0::2] = right[0::2]

    return {name: FakeKernel(body, params) for name, body in
            {"honest": honest, "nothing": nothing, "high_bytes": high_bytes, "low_bytes": low_bytes}.items()}


class Fingerprint:
    def key(self) -> str:
        return "fake0000"

    def describe(self) -> str:
        return "a simulated GPU"


def signed_suite(folder: Path, dtype: str):
    path = write(folder, dtype)
    generate(load_suite(path))
    key = Ed25519PrivateKey.generate()
    keys = folder / ".cudagate" / "trusted_keys"
    keys.mkdir(parents=True)
    (keys / "test.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    sign_suite(load_suite(path), key)
    suite = load_suite(path)
    result = verify_suite(suite, load_trusted_keys(folder))
    assert result.ok, result.problems
    return suite


@pytest.fixture(scope="module", params=list(LOW_PRECISION))
def replayed(request, tmp_path_factory):
    suite = signed_suite(tmp_path_factory.mktemp(request.param) / "suite", request.param)
    gate = Gate(FakeWorker(kernels(suite)), Fingerprint(), GateOptions(fresh_seed=11), tmp_path_factory.mktemp("out"))
    ledger = Ledger.for_suite(suite)
    names = ["honest", "nothing"] + (["high_bytes", "low_bytes"] if request.param == "bfloat16" else [])
    outcomes = {}
    for name in names:
        program = dataclasses.replace(suite.kernels[0], name=name, entry=name)
        for case in suite.cases:
            outcomes[name, case.name] = gate.replay(suite, program, case, ledger)
    return suite, outcomes


def test_cases_generate_writes_the_bits_under_the_types_own_header_and_they_sign(replayed):
    suite, _ = replayed
    dtype = suite.signature[0].dtype
    case = suite.case("small")
    x = np.load(suite.input_path(case, suite.signature[0]), allow_pickle=False)
    y = np.load(suite.expected_path(case, suite.signature[1]), allow_pickle=False)
    assert x.dtype == y.dtype == numpy_dtype(dtype) and x.dtype.names == (dtype,)
    # the expected output is the float32 result rounded to the type, and within the type's range
    assert np.array_equal(values(y), (values(x) * 2).astype(value_type(dtype)).astype(np.float32))
    assert np.all(np.abs(values(x)) <= span(dtype)) and len(np.unique(values(x))) > 4
    assert check_case_data(suite, case) == []


def test_the_tolerance_defaults_to_four_units_of_roundoff(replayed):
    suite, _ = replayed
    u = 2.0 ** -(ml_dtypes.finfo(value_type(suite.signature[0].dtype)).nmant + 1)  # p significant bits: 2^-p
    assert suite.tolerance["y"].rtol == 4 * u and suite.tolerance["y"].atol == 0.0


def test_the_honest_kernel_passes_every_defence(replayed):
    _, outcomes = replayed
    for case in ("small", "perf"):
        outcome = outcomes["honest", case]
        assert not outcome.failed, outcome.message
        assert outcome.correctness.passed and not outcome.correctness.problems


def test_a_kernel_that_writes_nothing_fails(replayed):
    _, outcomes = replayed
    for case, n in (("small", 300), ("perf", 4096)):
        outcome = outcomes["nothing", case]
        assert outcome.failed
        assert f"output 'y': {n} of {n} elements outside tolerance" in outcome.message, outcome.message
        assert f"{n} elements were never written by the kernel" in outcome.message


@pytest.mark.parametrize("kernel", ["high_bytes", "low_bytes"])
def test_a_bfloat16_kernel_writing_half_of_each_elements_bytes_is_rejected(replayed, kernel):
    suite, outcomes = replayed
    if suite.signature[0].dtype != "bfloat16":
        pytest.skip("a bfloat16 cheat")
    for case in ("small", "perf"):
        outcome = outcomes[kernel, case]
        assert outcome.failed, outcome.warning
        assert "elements outside tolerance" in outcome.message, outcome.message


def test_fresh_inputs_stay_in_range_and_the_reference_gets_float32(replayed, tmp_path, monkeypatch):
    suite, _ = replayed
    dtype = suite.signature[0].dtype
    record = tmp_path / "record.json"
    monkeypatch.setenv("LOWP_RECORD", str(record))
    sets, notes = prepare(suite, suite.case("perf"), count=2, adversarial=True, seed=5, root=tmp_path / "fresh").finish()
    assert [s.label for s in sets] == ["resampled", "adversarial"], notes
    assert json.loads(record.read_text()) == {"x": "float32"}
    largest = float(ml_dtypes.finfo(value_type(dtype)).max)
    for fresh in sets:
        x = np.load(fresh.root / "perf" / "x.npy", allow_pickle=False)
        y = np.load(fresh.root / "perf" / "expected" / "y.npy", allow_pickle=False)
        assert x.dtype == y.dtype == numpy_dtype(dtype)
        assert np.all(np.isfinite(values(x))) and np.all(np.isfinite(values(y)))
        assert np.max(np.abs(values(y))) <= largest
    adversarial = values(np.load(sets[1].root / "perf" / "x.npy", allow_pickle=False))
    assert np.count_nonzero(adversarial == 0) > 0
    # scaled up, wherever the type leaves room above y = 2x (an FP6 type's ±7.5 leaves none over ±1.875)
    assert np.max(np.abs(adversarial)) > span(dtype) or 4 * span(dtype) >= largest


def test_the_reference_output_is_rounded_to_the_type_and_an_integer_one_is_refused(tmp_path):
    suite = load_suite(write(tmp_path / "s", "bfloat16"))
    case = suite.case("small")
    runner = ReferenceRunner(suite)
    out = runner.checked(case, {"y": np.full(300, 1 + 2.0**-8 + 2.0**-12, np.float64)}, "ref")["y"]
    assert out.dtype == numpy_dtype("bfloat16") and np.all(values(out) == 1 + 2.0**-7)  # to nearest
    with pytest.raises(ReferenceFailure, match="returned int32 for 'y'.*return its values as floats"):
        runner.checked(case, {"y": np.ones(300, np.int32)}, "ref")
    with pytest.raises(ReferenceFailure, match="once rounded to bfloat16"):
        runner.checked(case, {"y": np.full(300, 1e39)}, "ref")


def test_an_e4m3_output_past_448_becomes_nan_and_is_refused(tmp_path):
    suite = load_suite(write(tmp_path / "s", "float8_e4m3fn"))
    with pytest.raises(ReferenceFailure, match=r"300 NaN/Inf value\(s\).*once rounded to float8_e4m3fn.*±448"):
        ReferenceRunner(suite).checked(suite.case("small"), {"y": np.full(300, 500.0, np.float32)}, "ref")


# -- bad input ---------------------------------------------------------------------------------------
def test_an_unknown_dtype_is_refused_naming_the_line_and_the_known_ones(tmp_path):
    path = write(tmp_path / "s", "bf16")
    with pytest.raises(FileError) as info:
        load_suite(path)
    text = str(info.value)
    assert "line 3" in text and "signature[0].buffer" in text and "bfloat16" in text and "float8_e5m2" in text, text


def test_a_low_precision_scalar_is_refused(tmp_path):
    text = replace_once(SUITE.format(dtype="bfloat16", span=4.0), "{name: n, scalar: int32}", "{name: n, scalar: bfloat16}")
    with pytest.raises(FileError, match=r"line 5: signature\[2\]\.scalar: bfloat16 is for buffers only"):
        load_suite(write(tmp_path / "s", "bfloat16", text))


@pytest.mark.parametrize("kind", ["input", "expected"])
def test_a_bf16_case_file_whose_header_says_float32_is_refused(tmp_path, kind):
    suite = load_suite(write(tmp_path / "s", "bfloat16"))
    generate(suite)
    case = suite.case("small")
    path = suite.input_path(case, suite.signature[0]) if kind == "input" else suite.expected_path(case, suite.signature[1])
    np.save(path, values(np.load(path, allow_pickle=False)))  # the same values, as float32
    problems = check_case_data(suite, case)
    assert len(problems) == 1 and path.name in problems[0]
    assert problems[0].endswith(f"holds float32, but the signature says {path.stem} is bfloat16"), problems
    np.save(path, np.zeros(300, np.uint16))  # bits without the type's header are not bfloat16 either
    assert check_case_data(suite, case)[0].endswith(f"holds uint16, but the signature says {path.stem} is bfloat16")


def test_a_distribution_beyond_the_types_range_is_refused(tmp_path):
    text = replace_once(SUITE.format(dtype="float8_e4m3fn", span=4.0), "low: -4.0, high: 4.0", "low: -4.0, high: 500.0")
    with pytest.raises(FileError, match=r"line 11: inputs\.x\.high: 500 is beyond float8_e4m3fn's largest value 448"):
        load_suite(write(tmp_path / "a", "float8_e4m3fn", text))
    text = replace_once(SUITE.format(dtype="float8_e4m3fn", span=4.0), "distribution: uniform, low: -4.0, high: 4.0",
                        "distribution: normal, mean: 0.0, std: 100.0")
    with pytest.raises(FileError, match=r"inputs\.x: mean ± 6 std reaches 600, beyond float8_e4m3fn's largest value"):
        load_suite(write(tmp_path / "b", "float8_e4m3fn", text))


def test_a_normal_draw_past_the_range_is_clipped_not_nan(tmp_path):
    text = replace_once(SUITE.format(dtype="float8_e4m3fn", span=4.0), "distribution: uniform, low: -4.0, high: 4.0",
                        "distribution: normal, mean: 0.0, std: 70.0")  # 6 std = 420: the tail passes 448
    text = replace_once(text, "y: {}", "y: {nan: equal}")  # 2x overflows the type: not what is tested here
    suite = load_suite(write(tmp_path / "s", "float8_e4m3fn", text))
    generate(suite)
    x = values(np.load(suite.input_path(suite.case("perf"), suite.signature[0]), allow_pickle=False))
    assert np.all(np.isfinite(x)) and np.max(np.abs(x)) <= 448


@pytest.mark.parametrize("tolerance, words", [
    ("{atol: 1.0e-6, rtol: 1.0e-5}", ["rtol=1e-05 is tighter than the reference's own rounding to bfloat16",
                                      "wherever |expected| > atol/0.0078125"]),
    ("{rtol: 1.5}", ["looser than bfloat16 can express: rtol=1.5 lets an output of zeros pass"]),
    ("{atol: 3.5e+38}", ["looser than bfloat16 can express: atol=3.5e+38 is at least bfloat16's largest value"]),
])
def test_a_tolerance_the_type_makes_meaningless_is_warned_about(tmp_path, tolerance, words):
    text = replace_once(SUITE.format(dtype="bfloat16", span=4.0), "y: {}", f"y: {tolerance}")
    suite = load_suite(write(tmp_path / "s", "bfloat16", text))
    generate(suite)
    flags = flag_cases(suite)
    assert flags and flags[0].startswith("tolerance.y: "), flags
    for word in words:
        assert word in flags[0], flags[0]


def test_the_default_and_an_exact_tolerance_are_not_warned_about(tmp_path):
    for name, tolerance in (("d", "{}"), ("e", "{atol: 0, rtol: 0}")):
        text = replace_once(SUITE.format(dtype="bfloat16", span=4.0), "y: {}", f"y: {tolerance}")
        suite = load_suite(write(tmp_path / name, "bfloat16", text))
        generate(suite)
        assert not [f for f in flag_cases(suite) if f.startswith("tolerance.")]


def test_encode_rounds_to_nearest_and_overflows_as_the_type_does():
    assert values(encode(np.array([1 + 2.0**-8 + 2.0**-10], np.float32), "bfloat16"))[0] == 1 + 2.0**-7
    assert np.isnan(values(encode(np.array([480.0]), "float8_e4m3fn")))[0]  # e4m3fn has no infinity
    assert np.isinf(values(encode(np.array([65536.0]), "float8_e5m2")))[0]
