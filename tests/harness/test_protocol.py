"""The worker protocol on the host side: kernel argument packing, poison detection, case-data
loading, and the JSON Schemas that are the formal contract."""

from __future__ import annotations

import ctypes
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest

import cudagate_schemas
from cudagate_harness.compiler import compile_kernel
from cudagate_harness.messages import Case, Param, from_json
from cudagate_harness.protocol import DTYPES, POISON_FIRST, POISON_SECOND, numpy_dtype, unwritten_mask
from cudagate_harness.runner import CaseInputError, load_buffers, pack_arguments
from helpers import EXAMPLES, KERNEL_CU
from pytest_cudagate.boundary import schema
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.errors import FileError

SCHEMAS = Path(cudagate_schemas.__file__).parent


# -- pack_arguments -------------------------------------------------------------------------------

def read(address: int, dtype: str):
    dt = numpy_dtype(dtype)
    return np.frombuffer(ctypes.string_at(address, dt.itemsize), dtype=dt)[0]


def device_buffer(address: int):
    """A stand-in for runner.Buffer after allocation: pack_arguments reads only its device address."""
    return SimpleNamespace(ptr=address, ptrs=[address])


def test_pack_arguments_points_at_each_parameters_bytes():
    signature = [
        {"name": "x", "kind": "buffer", "dtype": "float32", "intent": "in"},
        {"name": "n", "kind": "scalar", "dtype": "int32"},
        {"name": "big", "kind": "scalar", "dtype": "int64"},
        {"name": "y", "kind": "buffer", "dtype": "float64", "intent": "out"},
        {"name": "mask", "kind": "scalar", "dtype": "uint32"},
        {"name": "alpha", "kind": "scalar", "dtype": "float32"},
        {"name": "beta", "kind": "scalar", "dtype": "float64"},
    ]
    buffers = {"x": device_buffer(0x7F00_DEAD_BEE0), "y": device_buffer(0xFFFF_FFFF_FFFF_FF00)}
    scalars = {"n": -123456, "big": 2**40 + 3, "mask": 0xFFFF_FFFF, "alpha": 1.5, "beta": np.pi}
    params, storage = pack_arguments(tuple(Param(**p) for p in signature), buffers, scalars)
    assert params.dtype == np.uint64
    assert params.shape == (len(signature),)
    assert len(storage) == len(signature)
    addresses = [int(a) for a in params]
    assert len(set(addresses)) == len(addresses)
    assert read(addresses[0], "uint64") == 0x7F00_DEAD_BEE0
    assert read(addresses[1], "int32") == -123456
    assert read(addresses[2], "int64") == 2**40 + 3
    assert read(addresses[3], "uint64") == 0xFFFF_FFFF_FFFF_FF00
    assert read(addresses[4], "uint32") == 0xFFFF_FFFF
    assert read(addresses[5], "float32") == np.float32(1.5)
    assert read(addresses[6], "float64") == np.pi
    # the scalar storage has exactly the parameter's width (what the kernel reads)
    assert [s.dtype.itemsize for s in storage] == [8, 4, 8, 8, 4, 4, 8]


def test_pack_arguments_with_no_parameters():
    params, storage = pack_arguments((), {}, {})
    assert params.size == 0 and storage == []


def test_every_signature_dtype_has_a_little_endian_numpy_type_and_a_c_spelling():
    for name, (code, c_type) in DTYPES.items():
        assert numpy_dtype(name).byteorder in ("<", "|", "=")
        assert numpy_dtype(name).itemsize in (1, 2, 4, 8)
        assert c_type


# -- unwritten_mask --------------------------------------------------------------------------------

def poisoned(n: int, dtype, byte: int) -> np.ndarray:
    return np.frombuffer(bytes([byte]) * (n * np.dtype(dtype).itemsize), dtype=dtype).copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8, np.float16])
def test_an_element_poisoned_in_both_launches_is_unwritten(dtype):
    first, second = poisoned(5, dtype, POISON_FIRST), poisoned(5, dtype, POISON_SECOND)
    first[[0, 3]] = 1
    second[[0, 3]] = 1
    assert unwritten_mask(first, second).tolist() == [False, True, True, False, True]


def test_a_legitimate_minus_one_is_not_unwritten():
    first = np.array([-1, -1, 5], dtype=np.int32)  # -1 is the first poison pattern bytewise
    second = np.array([-1, 0x7F7F7F7F, 5], dtype=np.int32)  # launch 2 writes the same -1 ...
    # ... except element 1, which is poison in both launches: the only unwritten one.
    assert unwritten_mask(first, second).tolist() == [False, True, False]


def test_a_legitimate_nan_is_not_unwritten():
    nan_ff = np.frombuffer(b"\xff" * 4, dtype=np.float32)[0]  # the poison pattern is a NaN
    first = np.array([nan_ff, np.nan], dtype=np.float32)
    second = np.array([nan_ff, np.nan], dtype=np.float32)  # the kernel wrote NaN both times
    assert not unwritten_mask(first, second).any()


def test_an_element_poisoned_only_in_launch_two_is_not_unwritten():
    first = np.array([1.0, 2.0], dtype=np.float32)
    second = poisoned(2, np.float32, POISON_SECOND)
    assert not unwritten_mask(first, second).any()


def test_partly_poisoned_bytes_are_not_unwritten():
    first = poisoned(1, np.int32, POISON_FIRST)
    second = poisoned(1, np.int32, POISON_SECOND)
    second.view(np.uint8)[0] = 0  # the kernel wrote one byte of it
    assert not unwritten_mask(first, second).any()


def test_unwritten_mask_of_a_multi_dimensional_array():
    first = poisoned(6, np.float32, POISON_FIRST).reshape(2, 3)
    second = poisoned(6, np.float32, POISON_SECOND).reshape(2, 3)
    assert unwritten_mask(first, second).sum() == 6


# -- load_buffers ----------------------------------------------------------------------------------

SIGNATURE = (
    Param(name="x", kind="buffer", dtype="float32", intent="in"),
    Param(name="acc", kind="buffer", dtype="int32", intent="inout"),
    Param(name="y", kind="buffer", dtype="float32", intent="out"),
    Param(name="n", kind="scalar", dtype="int32"),
)


def case_with(tmp_path, x=None, acc=None, count=6):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32) if x is None else x)
    np.save(tmp_path / "acc.npy", np.arange(6, dtype=np.int32).reshape(2, 3) if acc is None else acc)
    return from_json(Case, {"name": "c1", "scalars": {"n": 6}, "launch": {"grid": [1, 1, 1], "block": [1, 1, 1]},
                            "buffers": {"x": {"count": count, "input": "x.npy"}, "acc": {"count": count, "input": "acc.npy"},
                                        "y": {"count": count}}})


def test_load_buffers(tmp_path):
    buffers = load_buffers(SIGNATURE, case_with(tmp_path), tmp_path)
    assert list(buffers) == ["x", "acc", "y"]
    assert buffers["x"].host.tolist() == [0, 1, 2, 3, 4, 5]
    assert buffers["acc"].host.shape == (6,)  # flattened
    assert buffers["acc"].host.flags.c_contiguous
    assert buffers["y"].host is None
    assert buffers["y"].nbytes == 24 and buffers["y"].intent == "out"


def test_load_buffers_missing_file(tmp_path):
    case = case_with(tmp_path)
    (tmp_path / "x.npy").unlink()
    with pytest.raises(CaseInputError) as excinfo:
        load_buffers(SIGNATURE, case, tmp_path)
    message = str(excinfo.value)
    assert "case 'c1'" in message and "cannot read" in message and str(tmp_path / "x.npy") in message


def test_load_buffers_wrong_dtype(tmp_path):
    case = case_with(tmp_path, x=np.arange(6, dtype=np.float64))
    with pytest.raises(CaseInputError) as excinfo:
        load_buffers(SIGNATURE, case, tmp_path)
    assert "holds float64, signature says float32" in str(excinfo.value)
    assert "x.npy" in str(excinfo.value)


def test_load_buffers_wrong_count(tmp_path):
    case = case_with(tmp_path, x=np.arange(5, dtype=np.float32), acc=np.arange(5, dtype=np.int32))
    with pytest.raises(CaseInputError) as excinfo:
        load_buffers(SIGNATURE, case, tmp_path)
    assert "x.npy holds 5 elements, the size expression gives 6" in str(excinfo.value)


def test_load_buffers_not_an_npy(tmp_path):
    case = case_with(tmp_path)
    (tmp_path / "acc.npy").write_bytes(b"garbage")
    with pytest.raises(CaseInputError, match="cannot read"):
        load_buffers(SIGNATURE, case, tmp_path)


def test_load_buffers_empty_file(tmp_path):
    case = case_with(tmp_path)
    (tmp_path / "x.npy").write_bytes(b"")
    with pytest.raises(CaseInputError):
        load_buffers(SIGNATURE, case, tmp_path)


def test_load_buffers_no_size_and_no_file(tmp_path):
    case = case_with(tmp_path)
    del case.buffers["y"]
    with pytest.raises(CaseInputError, match="gives no size for buffer 'y'"):
        load_buffers(SIGNATURE, case, tmp_path)
    case = case_with(tmp_path)
    case.buffers["x"] = replace(case.buffers["x"], input=None)
    with pytest.raises(CaseInputError, match="input buffer 'x' has no data file"):
        load_buffers(SIGNATURE, case, tmp_path)


# -- JSON Schemas ----------------------------------------------------------------------------------

SCHEMA_FILES = sorted(SCHEMAS.glob("*.schema.json"))


def test_the_schemas_are_there():
    names = {p.name for p in SCHEMA_FILES}
    assert {"suite.schema.json", "harness-request.schema.json", "harness-response.schema.json"} <= names


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: p.name)
def test_every_schema_is_a_valid_json_schema(path):
    document = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(document)
    cls.check_schema(document)
    assert document["$schema"].startswith("https://json-schema.org/")
    name = path.name.removesuffix(".schema.json")
    assert cudagate_schemas.load(name) == document


def request_problems(document) -> list[str]:
    return schema.problems(document, "harness-request")


def response_problems(document) -> list[str]:
    return schema.problems(document, "harness-response")


@pytest.mark.parametrize("name", ["softmax", "matmul"])
@pytest.mark.parametrize("expected", [False, True])
def test_requests_built_from_the_examples_validate(name, expected, tmp_path):
    suite = load_suite(EXAMPLES / name / "cudagate.yaml")
    programs = list(suite.kernels) + ([suite.reference.program] if suite.reference.program else [])
    for program in programs:
        request = run_request(suite, program, list(suite.cases), output_dir=tmp_path,
                              timing=suite.timing.to_json(), expected=expected)
        request = json.loads(json.dumps(request))  # what goes over the wire
        assert request_problems(request) == []
        assert [c["name"] for c in request["cases"]] == [c.name for c in suite.cases]
        for case in request["cases"]:
            assert all(v >= 1 for v in case["launch"]["grid"] + case["launch"]["block"])
            if suite.case(case["name"]).generated:  # its arrays exist once the gate has rebuilt them
                continue
            for spec in case["buffers"].values():
                if "input" in spec:
                    assert Path(spec["input"]).is_file()
            if expected:
                assert all(Path(p).is_file() for p in case["expected"].values())


def test_a_request_without_timing_validates(tmp_path):
    suite = load_suite(EXAMPLES / "softmax" / "cudagate.yaml")
    request = run_request(suite, suite.kernels[0], [suite.cases[0]], output_dir=tmp_path)
    assert request["timing"] is None
    assert request_problems(request) == []


def test_a_compile_request_validates():
    assert request_problems({"op": "compile", "kernel": {"name": "k", "entry": "k", "source": "..."},
                             "arch": "sm_90a"}) == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda r: r.pop("kernel"), "'kernel' is a required property"),
        (lambda r: r.update(op="launch"), "op"),
        (lambda r: r.pop("cases"), "'cases' is a required property"),
        (lambda r: r["cases"][0]["launch"].update(grid=[0, 1, 1]), "grid"),
        (lambda r: r["cases"][0]["launch"].update(block=[256]), "block"),
        (lambda r: r["cases"][0]["buffers"]["x"].update(count=-1), "count"),
        (lambda r: r.update(arch="compute_90"), "arch"),
        (lambda r: r["kernel"].pop("source"), "'source' is a required property"),
        (lambda r: r.update(protocol=2), "protocol"),
        (lambda r: r.update(timing={"warmup": 1, "repeat": 0}), "timing"),
    ],
)
def test_bad_requests_do_not_validate(change, fragment, tmp_path):
    suite = load_suite(EXAMPLES / "softmax" / "cudagate.yaml")
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.cases[0]], output_dir=tmp_path)))
    change(request)
    problems = request_problems(request)
    assert problems and any(fragment in p for p in problems), problems


def real_compile_line() -> dict:
    result = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90", source_name="scale.cu")
    assert result.ok
    return {"type": "compile", "id": 1, **result.to_json()}


GOOD_RESPONSES = {
    "hello ok": {"type": "hello", "protocol": 1, "ok": True, "pid": 42,
                 "device": {"name": "NVIDIA H200", "arch": "sm_90"}, "nvrtc_version": "12.8"},
    "hello no device": {"type": "hello", "protocol": 1, "ok": False, "pid": 42, "error": "no CUDA device: none"},
    "compile failed": {"type": "compile", "id": 1, "ok": False, "arch": "sm_90", "log": "k.cu(3): error: ..."},
    "case ok": {"type": "case", "id": 1, "case": "small", "status": "ok", "seconds": 0.1,
                "outputs": {"y": {"path": "/tmp/y.npy", "unwritten": 0, "differing_second_launch": 0}},
                "inputs_modified": {},
                "timing": {"samples_ms": [0.01, 0.02], "warmup": 10, "repeat": 2, "cache": "cold"}},
    "case ok, nondeterministic": {"type": "case", "case": "small", "status": "ok",
                                  "outputs": {"y": {"path": "/tmp/y.npy", "second_path": "/tmp/y2.npy",
                                                    "unwritten": 3, "differing_second_launch": 5}}},
    "case error": {"type": "case", "id": 1, "case": "small", "status": "error", "seconds": 0.0,
                   "error": {"kind": "fault", "code": "CUDA_ERROR_ILLEGAL_ADDRESS", "message": "cuCtxSynchronize: ..."}},
    "done": {"type": "done", "id": 1},
    "error": {"type": "error", "id": None, "message": "unknown op 'x'"},
}


@pytest.mark.parametrize("line", GOOD_RESPONSES.values(), ids=GOOD_RESPONSES.keys())
def test_good_response_lines_validate(line):
    assert response_problems(line) == []


def test_a_real_compile_line_validates():
    line = real_compile_line()
    assert line["resources"]["registers"] > 0
    assert response_problems(json.loads(json.dumps(line))) == []


BAD_RESPONSES = {
    "no type": {"ok": True},
    "unknown type": {"type": "progress"},
    "hello without ok": {"type": "hello", "protocol": 1},
    "hello wrong protocol": {"type": "hello", "protocol": 2, "ok": True},
    "compile without ok": {"type": "compile", "log": ""},
    "compile non-integer resource": {"type": "compile", "ok": True, "resources": {"registers": "32"}},
    "case without status": {"type": "case", "case": "small"},
    "case bad status": {"type": "case", "case": "small", "status": "passed"},
    "case unknown error kind": {"type": "case", "case": "small", "status": "error",
                                "error": {"kind": "segfault", "message": "x"}},
    "case error without message": {"type": "case", "case": "small", "status": "error", "error": {"kind": "fault"}},
    "case negative unwritten": {"type": "case", "case": "small", "status": "ok",
                                "outputs": {"y": {"path": "p", "unwritten": -1, "differing_second_launch": 0}}},
    "case output without path": {"type": "case", "case": "small", "status": "ok",
                                 "outputs": {"y": {"unwritten": 0, "differing_second_launch": 0}}},
    "case negative sample": {"type": "case", "case": "small", "status": "ok", "timing": {"samples_ms": [-1.0]}},
    "error without message": {"type": "error", "id": 1},
}


@pytest.mark.parametrize("line", BAD_RESPONSES.values(), ids=BAD_RESPONSES.keys())
def test_bad_response_lines_do_not_validate(line):
    assert response_problems(line) != []


def test_validate_names_the_file(tmp_path):
    with pytest.raises(FileError) as excinfo:
        schema.validate({"type": "case"}, "harness-response", tmp_path / "lines.json")
    assert str(excinfo.value).startswith(str(tmp_path / "lines.json"))
