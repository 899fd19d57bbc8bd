"""The protocol's dataclasses and its schemas name the same fields: a field added on one side only fails
here until the other has it; requests read into them and replies written from them are what the schemas
describe."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

import cudagate_schemas
from cudagate_harness import messages
from cudagate_harness.messages import (ABSENT, CaseError, CaseReply, Chunk, CompileReply, CopyStep, Done, ErrorReply,
                                       Hello, Launch, Launches, LaunchStep, LibraryStep, MemsetStep, Request, from_json, to_json)
from cudagate_harness.stopping import Settle
from fake_worker import make_worker, scale_kernels
from helpers import EXAMPLES, write_suite
from pytest_cudagate.boundary import schema
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.requests import run_request

STEP = "#/$defs/operation/oneOf/1/items/oneOf"
# Each message class, and the schema object whose properties are its fields.
SCHEMA_OBJECTS = {
    "Request": ("harness-request", "#"),
    "Kernel": ("harness-request", "#/$defs/kernel"),
    "Param": ("harness-request", "#/properties/signature/items"),
    "Case": ("harness-request", "#/$defs/case"),
    "BufferSpec": ("harness-request", "#/$defs/case/properties/buffers/additionalProperties"),
    "FreshSet": ("harness-request", "#/$defs/case/properties/fresh/items"),
    "Launch": ("harness-request", "#/$defs/launch"),
    "LaunchStep": ("harness-request", "#/$defs/step_launch"),
    "MemsetStep": ("harness-request", f"{STEP}/1"),
    "MemsetFill": ("harness-request", f"{STEP}/1/properties/memset"),
    "CopyStep": ("harness-request", f"{STEP}/2"),
    "CopyRange": ("harness-request", f"{STEP}/2/properties/copy"),
    "LibraryStep": ("harness-request", f"{STEP}/3"),
    "Timing": ("harness-request", "#/properties/timing"),
    "Settle": ("harness-request", "#/$defs/settle"),
    "LibrarySpec": ("harness-request", "#/properties/library"),
    "Checks": ("harness-request", "#/properties/checks"),
    "Kernels": ("harness-request", "#/properties/kernels"),
    "Launches": ("harness-request", "#/properties/launches"),
    "Hello": ("harness-response", "#/oneOf/0"),
    "CompileReply": ("harness-response", "#/oneOf/1"),
    "CaseReply": ("harness-response", "#/oneOf/2"),
    "CaseError": ("harness-response", "#/oneOf/2/properties/error"),
    "Chunk": ("harness-response", "#/oneOf/3"),
    "Done": ("harness-response", "#/oneOf/4"),
    "ErrorReply": ("harness-response", "#/oneOf/5"),
}
CLASSES = {cls.__name__: cls for cls in [*vars(messages).values(), Settle]
           if inspect.isclass(cls) and dataclasses.is_dataclass(cls)}


def resolve(document: dict, pointer: str) -> dict:
    node = document
    for part in pointer.removeprefix("#").strip("/").split("/") if pointer != "#" else ():
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def properties(document: dict, node: dict) -> set[str]:
    """The properties an object lists, those of the objects it extends (allOf, $ref) included."""
    found = set(node.get("properties", {}))
    for part in node.get("allOf", []):
        if "$ref" in part:
            found |= properties(document, resolve(document, part["$ref"]))
    return found


def test_every_message_class_names_its_schema_object():
    assert sorted(CLASSES) == sorted(SCHEMA_OBJECTS)


@pytest.mark.parametrize("name", sorted(SCHEMA_OBJECTS))
def test_a_message_class_has_the_fields_its_schema_object_lists(name):
    """Both ways: a field the schema lacks, and a schema property no field carries."""
    document, pointer = SCHEMA_OBJECTS[name]
    schema_object = resolve(cudagate_schemas.load(document), pointer)
    fields = {field.name.rstrip("_") for field in dataclasses.fields(CLASSES[name])}
    listed = properties(cudagate_schemas.load(document), schema_object)
    assert not fields - listed, f"{name}: fields {sorted(fields - listed)} are not in {document}.schema.json {pointer}"
    assert not listed - fields, f"{name}: {document}.schema.json {pointer} lists {sorted(listed - fields)}, no field of it"


def test_a_request_of_every_kind_of_step_is_read_into_its_classes():
    request = from_json(Request, {
        "op": "run", "kernel": {"name": "k", "entry": "a", "source": "", "entries": ["a"], "options": ["-O3"]},
        "signature": [{"name": "x", "kind": "buffer", "dtype": "float32", "intent": "inout"}],
        "timing": {"warmup": 2, "repeat": 5, "settle": {"quantile": 0.5, "within": 0.02}}, "checks": None,
        "cases": [{"name": "c", "scalars": {}, "buffers": {"x": {"count": 6, "layout": [2, 3, 4]}}, "launch": [
            {"entry": "a", "args": ["x"], "grid": [1, 1, 1], "block": [32, 1, 1]},
            {"memset": {"buffer": "x", "bits": 0}}, {"copy": {"from": "x", "to": "x", "count": 1}},
            {"library": "cublas_gemm", "args": {}, "options": {}}]}]})
    (case,) = request.cases
    assert [type(step) for step in case.launch] == [LaunchStep, MemsetStep, CopyStep, LibraryStep]
    assert case.launch[2].copy.from_ == "x" and case.buffers["x"].padded_count == 8
    assert request.kernel.options == ("-O3",) and request.kernel.source_name == "kernel.cu"
    assert request.timing.settle == Settle(0.5, 0.02) and request.timing.cold and request.checks.guards
    assert from_json(Launches, {"approved": {"grid": [1, 1, 1], "block": [1, 1, 1]},
                                "current": {"grid": [2, 1, 1], "block": [1, 1, 1]}}).current == \
        Launch(grid=(2, 1, 1), block=(1, 1, 1))


@pytest.mark.parametrize("raw, says", [
    ({"op": "run", "cases": 7}, "expected a list, not int"),
    ({"op": "compare", "signature": []}, "a compare request needs kernels, launches, case, timing"),
    ({"op": "run", "kernel": {"entry": "k", "source": ""}}, "a run request needs signature, cases"),
    ({"op": "run", "kernel": "k.cu"}, "Kernel: expected an object, not str"),
    ({"op": "run", "kernel": {"source": ""}}, "entry"),
    ({"op": "run", "cases": [{"name": "c", "scalars": {}, "buffers": {}, "launch": [{"memset": 1}]}]},
     "MemsetFill: expected an object, not int"),
    ({"op": "run", "cases": [{"name": "c", "scalars": {}, "buffers": {}, "launch": [{"fill": 1}]}]},
     "is none of LaunchStep, MemsetStep, CopyStep, LibraryStep"),
])
def test_a_request_of_the_wrong_shape_is_a_type_error(raw, says):
    """What the worker answers as a malformed request, never a traceback."""
    with pytest.raises(TypeError, match=says):
        from_json(Request, raw)


def perf_request(tmp_path, change) -> dict:
    """A run request of the scale suite's performance case, timed, as the gate writes it, then changed."""
    suite = load_suite(write_suite(tmp_path / "scale"))
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("perf")],
                                                output_dir=tmp_path / "out", timing=suite.timing.to_json())))
    change(request)
    return {**request, "id": 1}


def answers(request: dict) -> list[dict]:
    lines: list[dict] = []
    make_worker(scale_kernels(), emit=lines.append).handle(request)
    return lines


@pytest.mark.parametrize("change, says", [
    (lambda r: r["cases"][0].update(buffers=None), "Case.buffers: null, and it has no default"),
    (lambda r: r["timing"].update(settle={"quantile": "0.5", "within": 0.1}), "Settle.quantile: '0.5' is not a number"),
    (lambda r: r["timing"].update(warmup=2.5), "Timing.warmup: 2.5 is not a whole number"),
    (lambda r: r["timing"].update(repeat=True), "Timing.repeat: True is not a whole number"),
], ids=["buffers null", "settle as text", "warmup 2.5", "repeat true"])
def test_a_null_or_mistyped_field_is_one_malformed_line_before_anything_runs(tmp_path, change, says):
    """The request checks let these through (the schema refuses them, and a harness request file is not
    held to the schema): the worker answers one line, and no case, instead of ending with a traceback."""
    lines = answers(perf_request(tmp_path, change))
    assert [line["type"] for line in lines] == ["error"], lines
    assert lines[0]["message"].startswith("malformed run request: TypeError(") and says in lines[0]["message"]


def test_an_empty_timing_is_no_timing_and_a_fresh_set_without_inputs_fails_its_case_alone(tmp_path):
    """What a request always meant: ``timing: {}`` runs the case untimed; a fresh set whose inputs are
    null has no data for the case's input, which that case's line says."""
    lines = answers(perf_request(tmp_path, lambda r: r.update(timing={})))
    (case,) = [line for line in lines if line["type"] == "case"]
    assert case["status"] == "ok" and case.get("timing") is None and lines[-1]["type"] == "done"
    fresh = [{"label": "f", "inputs": None}]
    lines = answers(perf_request(tmp_path / "b", lambda r: r["cases"][0].update(fresh=fresh)))
    (case,) = [line for line in lines if line["type"] == "case"]
    assert case["status"] == "error" and "fresh input set 'f' has no data for 'x'" in case["error"]["message"], case
    assert lines[-1]["type"] == "done"


def test_the_example_suites_requests_are_read_whole(tmp_path):
    suite = load_suite(EXAMPLES / "softmax" / "cudagate.yaml")
    raw = json.loads(json.dumps(run_request(suite, suite.kernels[0], list(suite.cases), output_dir=tmp_path,
                                            timing=suite.timing.to_json())))
    request = from_json(Request, raw)
    assert [case.name for case in request.cases] == [case["name"] for case in raw["cases"]]
    assert request.timing.repeat == raw["timing"]["repeat"] and request.output_dir == str(tmp_path)


REPLIES = [
    Hello(protocol=1, ok=False, pid=7, error="no CUDA device"),
    CompileReply(id=1, ok=False, arch="sm_90", log="k.cu(3): error", lowered_name=None, role="current"),
    CaseReply(id=1, status="error", error=CaseError(kind="fault", code="CUDA_ERROR_ILLEGAL_ADDRESS", message="..."),
              case="small", seconds=0.5),
    Chunk(id="r", approved=[1.0], current=[1.1], first=["current"], wall_s=0.1, state={}, disturbances=[], prior=[]),
    Done(id=3),
    ErrorReply(id=None, message="unknown op 'x'"),
]


@pytest.mark.parametrize("reply", REPLIES, ids=lambda reply: type(reply).__name__)
def test_a_reply_is_a_line_the_response_schema_accepts(reply):
    line = to_json(reply)
    assert list(line)[0] == "type" and schema.problems(json.loads(json.dumps(line)), "harness-response") == []


def test_a_reply_leaves_out_what_is_absent_and_writes_null():
    assert to_json(CompileReply(id=None, ok=False, lowered_name=None)) == {"type": "compile", "id": None, "ok": False,
                                                                          "lowered_name": None}
    assert json.dumps(to_json(CaseReply(status="ok", notes=ABSENT, case="c"))) == \
        '{"type": "case", "id": null, "status": "ok", "case": "c"}'
