"""The schemas and the code that writes their documents say the same: the report's objects produce
every field report.schema.json names and no other, and every dtype enum of a schema is the harness
protocol's list."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from cudagate_harness.protocol import DTYPES, FLOAT_DTYPES, LOW_PRECISION
from report_fixtures import build_scenario

from pytest_cudagate import phases
from pytest_cudagate.defences import fresh_inputs
from pytest_cudagate.reports.document import build_report
from pytest_cudagate.reports.locate import from_items
from pytest_cudagate.reports.writer import read_report, write_report
from pytest_cudagate.suite.loader import INT_DTYPES

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


def test_every_schema_enum_of_dtypes_is_the_protocols_list():
    found = {f"{path.name}#{where}": enum for path in sorted(SCHEMAS.glob("*.schema.json"))
             for where, enum in _enums(json.loads(path.read_text(encoding="utf-8")))
             if set(enum) & set(DTYPES)}
    assert len(found) >= 2  # the suite's and the harness request's
    assert {where: enum for where, enum in found.items() if enum != list(DTYPES)} == {}


def test_the_code_s_per_dtype_tables_name_the_protocols_dtypes():
    assert list(INT_DTYPES) == [name for name in DTYPES if name.startswith(("int", "uint"))]
    floating = FLOAT_DTYPES | set(LOW_PRECISION)
    for table in (fresh_inputs.SPREAD_BITS, fresh_inputs.HEADROOM_BITS, fresh_inputs.BOUND_BITS):
        assert set(table) == floating


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
    built.document["extra"] = {"ci": "a plugin's field"}  # as pytest_cudagate_update_report adds it
    write_report(tmp_path / "out", built, clock=clock)
    fields = _Fields(schema)
    fields.walk(schema, read_report(tmp_path / "out"), "report")
    missing = {where: sorted(fields.declared[where] - fields.produced[where]) for where in fields.declared
               if fields.declared[where] - fields.produced[where]}
    extra = {where: sorted(fields.produced[where] - fields.declared[where]) for where in fields.declared
             if fields.produced[where] - fields.declared[where]}
    assert missing == {}, "fields of report.schema.json that the report no longer writes"
    assert extra == {}, "fields the report writes that report.schema.json does not name"
