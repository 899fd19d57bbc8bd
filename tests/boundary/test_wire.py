"""The one serializer of report objects: a dataclass's fields, in order, as its field specs say."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest

from pytest_cudagate.boundary.wire import derived, from_wire, json_field, to_json, to_wire
from pytest_cudagate.judge.latency import Latency, LatencyResult
from pytest_cudagate.judge.outcome import CaseOutcome
from report_fixtures import build_scenario


@dataclass
class Reading:
    name: str
    label: str = json_field(key="class", default="default")
    secret: str = json_field(hidden=True, default="")
    extra: int | None = json_field(default=None, omit_default=True)
    tags: list[str] = json_field(default_factory=list, convert=sorted)
    level: float = 0.0

    @property
    @derived(after="label")
    def shout(self) -> str:
        return self.name.upper()

    @derived("last")
    def summary(self) -> str:
        return f"{self.name} at {self.level}"


def test_fields_are_written_in_order_under_their_keys_with_derived_values_where_they_are_placed():
    assert list(to_json(Reading("a", tags=["z", "b"], secret="s")).items()) == [
        ("name", "a"), ("class", "default"), ("shout", "A"), ("tags", ["b", "z"]), ("level", 0.0),
        ("last", "a at 0.0")]
    assert to_json(Reading("a", extra=3))["extra"] == 3  # left out only at its default


def test_a_new_report_field_is_one_line_in_the_outcome_s_dataclass():
    @dataclass
    class Outcome(CaseOutcome):
        worker_pid: int | None = None

    plain = to_json(CaseOutcome("s", "k", "c", "correctness", notes=["x", "x"], head_start_s=0.12345678))
    added = to_json(Outcome("s", "k", "c", "correctness", notes=["x", "x"], head_start_s=0.12345678, worker_pid=7))
    assert added == {**plain, "worker_pid": 7} and list(added)[-1] == "worker_pid"
    assert plain["notes"] == ["x"] and plain["head_start_s"] == 0.123457 and "failed" not in plain


def test_enums_even_str_valued_ones_are_written_as_plain_values_and_non_finite_floats_as_text():
    data = to_json(LatencyResult(Latency.REGRESSED, 0.02, telemetry=[{"ratio": math.inf, "low": -math.inf,
                                                                      "drift": math.nan}]))
    assert type(data["verdict"]) is str and data["verdict"] == "regressed"
    assert data["telemetry"] == [{"ratio": "inf", "low": "-inf", "drift": "nan"}]
    json.dumps(data, allow_nan=False)


def test_a_value_placed_after_no_field_is_refused():
    @dataclass
    class Broken:
        a: int = 0

        @derived(after="b")
        def c(self) -> int:
            return 1

    with pytest.raises(TypeError, match="Broken: derived values placed after no field: \\['b'\\]"):
        to_json(Broken())


def test_the_wire_rebuilds_every_outcome_field_for_field(tmp_path):
    for outcome in build_scenario(tmp_path / "scale").outcomes:
        back = from_wire(CaseOutcome, to_wire(outcome))
        assert repr(back) == repr(outcome) and to_json(back) == to_json(outcome)  # repr: NaN is not NaN


@dataclass
class Plain:
    values: dict[str, list[float]] = field(default_factory=dict)


def test_a_dataclass_without_specs_is_every_field_by_name():
    assert to_json(Plain({"a": [1.0, math.nan]})) == {"values": {"a": [1.0, "nan"]}}
