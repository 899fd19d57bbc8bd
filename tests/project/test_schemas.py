"""The schemas and the code that writes their documents say the same: the report's objects produce
every field report.schema.json names and no other; and the harness protocol's DTYPES is the one list
of element types (no schema lists them, the code and the docs' table follow it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from cudagate_harness.protocol import DTYPES, FLOAT_DTYPES, LOW_PRECISION
from cudagate_harness.request_checks import request_problems
from helpers import SUITE_YAML, line_of, replace_once, write_suite
from report_fixtures import build_scenario

from pytest_cudagate import phases
from pytest_cudagate.boundary import schema
from pytest_cudagate.errors import FileError
from pytest_cudagate.reports.document import build_report
from pytest_cudagate.reports.locate import from_items
from pytest_cudagate.reports.writer import read_report, write_report
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import INT_DTYPES

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _enums(node, where: str = ""):
    if isinstance(node, dict):
        if isinstance(node.get("enum"), list):
            yield where, node["enum"]
        for key, value in node.items():
            yield from _enums(value, f"{where}/{key}")
    elif isinstance(node, list):
        for n, value in enumerate(node):
            yield from _enums(value, f"{where}/{n}")


def test_no_schema_lists_the_dtypes():
    """DTYPES is the one list: a schema takes any name, so a new type is not spelled again there."""
    found = {f"{path.name}#{where}": enum for path in sorted(SCHEMAS.glob("*.schema.json"))
             for where, enum in _enums(json.loads(path.read_text(encoding="utf-8")))
             if set(enum) & set(DTYPES)}
    assert found == {}


def test_a_name_not_in_dtypes_is_refused_naming_the_list(tmp_path):
    """What the schema no longer refuses, the loader and the request checks do, each listing DTYPES."""
    listed = f"'float17' is not a dtype cudagate knows; write one of {', '.join(DTYPES)}"
    text = replace_once(SUITE_YAML, "buffer: float32, intent: in,", "buffer: float17, intent: in,")
    with pytest.raises(FileError) as refused:
        load_suite(write_suite(tmp_path / "s", yaml_text=text, data=False))
    assert f"line {line_of(text, 'float17')}: signature[0].buffer: {listed}" in refused.value.problems
    request = {"op": "run", "kernel": {"name": "k", "entry": "k", "source": ""}, "cases": [],
               "signature": [{"name": "x", "kind": "buffer", "dtype": "float17", "intent": "inout"}]}
    assert schema.problems(request, "harness-request") == []
    assert f"signature[0].dtype: {listed}" in request_problems(request, (tmp_path,))


def test_the_code_s_per_dtype_facts_come_from_the_protocols_list():
    assert list(INT_DTYPES) == [name for name in DTYPES if name.startswith(("int", "uint"))]
    assert FLOAT_DTYPES == {"float16", "float32", "float64"}
    assert LOW_PRECISION == tuple(name for name in DTYPES if name not in FLOAT_DTYPES | set(INT_DTYPES))


def test_the_docs_data_types_table_names_every_dtype():
    """docs/suite-format.md's table is the users' list: a type added to DTYPES gets its row there."""
    text = (SCHEMAS.parent / "docs" / "suite-format.md").read_text(encoding="utf-8")
    table = text.split("### Data types", 1)[1].split("\n\n", 2)[1]
    documented = [name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])]
    assert documented == list(DTYPES), ("docs/suite-format.md, Data types: give each type of DTYPES a row, in its "
                                        f"order (missing: {[n for n in DTYPES if n not in documented]})")
    spelled = {row.split("|")[1].strip(): row.split("|")[2] for row in table.splitlines()[2:]}
    for name in LOW_PRECISION:  # a name only numpy's extensions know: its C type is the one to use
        assert f"`{DTYPES[name][1]}`" in spelled[f"`{name}`"], name


class _Fields:
    """Each object schema of report.schema.json (by its $defs name, or its place) -> the fields it
    declares and the fields the written documents gave it."""

    def __init__(self, schema: dict):
        self.schema = schema
        self.declared: dict[str, set[str]] = {}
        self.produced: dict[str, set[str]] = {}

    def walk(self, node: dict, value, where: str) -> None:
        while "$ref" in node:
            where = node["$ref"].rsplit("/", 1)[-1]
            node = self.schema["$defs"][where]
        for key in ("oneOf", "anyOf"):
            for branch in node.get(key, []):
                if jsonschema.Draft202012Validator({**branch, "$defs": self.schema["$defs"]}).is_valid(value):
                    self.walk(branch, value, where)
        if isinstance(value, dict) and "properties" in node:
            self.declared[where] = set(node["properties"])
            self.produced.setdefault(where, set()).update(value)
            for name, item in value.items():
                if name in node["properties"]:
                    self.walk(node["properties"][name], item, f"{where}.{name}")
        elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
            for name, item in value.items():
                self.walk(node["additionalProperties"], item, f"{where}.*")
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for item in value:
                self.walk(node["items"], item, f"{where}[]")


def test_the_report_produces_every_field_of_its_schema_and_no_other(tmp_path):
    """Read from report.json as a whole run writes it: every phase clocked, a class selection, a trust
    root's ref and pull request, pytest's counts, a plugin's extra field."""
    schema = json.loads((SCHEMAS / "report.schema.json").read_text(encoding="utf-8"))
    scenario = build_scenario(tmp_path / "scale")
    for outcome in scenario.outcomes:
        for phase in phases.PHASES:
            phases.add(outcome, phase, 0.001)
    built = build_report(scenario.outcomes, scenario.skipped, index=from_items(scenario.items()),
                         fingerprint=scenario.fingerprint, options=scenario.options, trust=scenario.trust,
                         root=scenario.suite.root.parent, exitstatus=1, report_dir=str(tmp_path / "out"),
                         selection={"classes": ["default"], "deselected_by_class": []}, trusted_ref="0" * 40,
                         pull_request=7, tested={"failed": 1, "passed": 2, "skipped": 1})
    clock = phases.RunClock()
    for phase in phases.RUN_PHASES:
        clock.add(phase, 0.001)
    clock.worker(0.5, 0.25)
    clock.case_ran(0.0, 1.0)
    built.document.extra = {"ci": "a plugin's field"}  # as pytest_cudagate_update_report adds it
    write_report(tmp_path / "out", built, clock=clock)
    fields = _Fields(schema)
    fields.walk(schema, read_report(tmp_path / "out"), "report")
    missing = {where: sorted(fields.declared[where] - fields.produced[where]) for where in fields.declared
               if fields.declared[where] - fields.produced[where]}
    extra = {where: sorted(fields.produced[where] - fields.declared[where]) for where in fields.declared
             if fields.produced[where] - fields.declared[where]}
    assert missing == {}, "fields of report.schema.json that the report no longer writes"
    assert extra == {}, "fields the report writes that report.schema.json does not name"
