"""The one serializer of report objects: a dataclass is written field by field, in the order its
fields are declared, so a new report field is one line in its dataclass (and one in the schema).

Two views of one object, each with its way back:

* :func:`to_json`, the report's (``report.json``, the optimize pack's cases): each field under
  its name unless :func:`json_field` says otherwise (another key, left out, left out at its
  default, converted first), with the values the class marks :func:`derived` (a headline, a status)
  placed after the field they name. Non-finite floats are written as the strings ``"nan"``,
  ``"inf"``, ``"-inf"``: JSON has none, yet a relative norm can be infinite and a wrong output NaN.
  :func:`from_json` reads such a document back into the same dataclasses (fields by key, the text
  floats back to floats, each ``convert`` undone by its ``revert``; a value they cannot hold is a
  :class:`ReadError` naming its path), so that writing it again gives the same JSON. A derived value
  is kept as the file says it, not recomputed: it was worked out from the object's hidden state (raw
  samples, a scale rule, a failure's kind), which the file does not hold, and a report from an older
  cudagate says what that version said; :func:`replace` keeps it through a change. Hidden fields are
  at their defaults (None where there is none), and keys no field names are written back as read.
  :func:`per_run_keys` lists the keys whose fields are declared to differ between two runs.
* :func:`to_wire` / :func:`from_wire`, the object itself, every field by name, for an object that
  crosses a process boundary (a pytest-xdist worker hands its outcomes to the controller, whose
  reports are then built from the very outcomes a ``-n 0`` run holds). Dataclasses are rebuilt from
  their type hints; non-finite floats travel as JSON's NaN/Infinity extension, which json reads back.

Standard library only, in the bottom layer: every package may declare its report fields with it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
import typing
from collections.abc import Callable
from enum import Enum
from functools import lru_cache, wraps
from typing import Any

_SPEC = "cudagate.json"
_DERIVED = "__cudagate_derived__"
_READ = "__cudagate_read__"  # an object read from a file: its derived values and the keys no field names
_order = itertools.count()


@dataclasses.dataclass(frozen=True)
class _Spec:
    key: str | None = None
    hidden: bool = False
    omit_default: bool = False
    convert: Callable[[Any], Any] | None = None
    revert: Callable[[Any], Any] | None = None
    per_run: str | None = None
    first: bool = False


# What two runs of the same code on the same inputs may write differently (benchmarks/report_equality.py
# reads these from the fields' declarations): the whole value (a time), or only the numbers in its words.
TIME = "time"
FIGURES = "figures"


def json_field(*, key: str | None = None, hidden: bool = False, omit_default: bool = False,
               convert: Callable[[Any], Any] | None = None, revert: Callable[[Any], Any] | None = None,
               per_run: str | None = None, first: bool = False, **field: Any) -> Any:
    """A dataclass field (``field`` are :func:`dataclasses.field`'s arguments) as the report writes it:
    under ``key`` (default: its name); not at all (``hidden``: the object's own state); not while it
    holds its default (``omit_default``: reports from before it existed read the same); ``convert``
    applied to the value first, ``revert`` to the value read back (``revert(convert(x)) == x`` as far
    as the report tells); ``per_run``: :data:`TIME` or :data:`FIGURES`, what may differ between two
    runs; ``first``: written before the fields of the classes it extends."""
    return dataclasses.field(metadata={_SPEC: _Spec(key, hidden, omit_default, convert, revert, per_run, first)},
                             **field)


def derived(key: str | None = None, *, after: str | None = None, per_run: str | None = None) -> Callable:
    """Mark a method or property's getter (below ``@property``) as a report value: written under
    ``key`` (default: its name) after the field named ``after`` (default: after the last field);
    ``per_run`` as :func:`json_field`'s. An object read back by :func:`from_json` gives the value read."""
    def mark(function: Callable) -> Callable:
        name = key or function.__name__

        @wraps(function)
        def value(self: Any) -> Any:
            read = self.__dict__.get(_READ)
            return read[0][name] if read is not None and name in read[0] else function(self)

        setattr(value, _DERIVED, (name, after, next(_order), per_run))
        return value
    return mark


@lru_cache(maxsize=None)
def _plan(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """(json key, attribute, how) in writing order; how: a field's _Spec, or "property"/"method"."""
    extra: dict[str | None, list[tuple[int, str, str, str]]] = {}
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            target, how = (member.fget, "property") if isinstance(member, property) else (member, "method")
            mark = getattr(target, _DERIVED, None)
            if mark is not None:
                key, after, order, _ = mark
                extra.setdefault(after, []).append((order, key, name, how))
    plan: list[tuple[str, str, Any]] = []
    fields = dataclasses.fields(cls)
    for f in [f for f in fields if _spec(f).first] + [f for f in fields if not _spec(f).first]:
        spec = _spec(f)
        if not spec.hidden:
            plan.append((spec.key or f.name, f.name, (spec, f)))
        plan += [(key, name, how) for _, key, name, how in sorted(extra.pop(f.name, []))]
    plan += [(key, name, how) for _, key, name, how in sorted(extra.pop(None, []))]
    if extra:
        raise TypeError(f"{cls.__name__}: derived values placed after no field: {sorted(extra)}")
    return tuple(plan)


def _getter(member: Any) -> Any:
    return member.fget if isinstance(member, property) else member


def _spec(f: dataclasses.Field) -> _Spec:
    return f.metadata.get(_SPEC, _Spec())


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return value == f.default
    return f.default_factory is not dataclasses.MISSING and value == f.default_factory()


def to_json(value: Any) -> Any:
    """The report's JSON-safe view of ``value``: dataclasses by their fields' specs, enums by value,
    tuples and sets as lists, numpy scalars as numbers, non-finite floats as text."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Enum):  # before str: a str-valued enum is a str
        return to_json(value.value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {}
        for key, name, how in _plan(type(value)):
            if how == "property":
                data[key] = to_json(getattr(value, name))
            elif how == "method":
                data[key] = to_json(getattr(value, name)())
            else:
                spec, f = how
                member = getattr(value, name)
                if spec.omit_default and _is_default(f, member):
                    continue
                data[key] = to_json(spec.convert(member) if spec.convert is not None else member)
        read = value.__dict__.get(_READ)
        if read is not None:
            data.update(read[1])
        return data
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_json(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return to_json(value.item())
    return str(value)


class ReadError(ValueError):
    """A value of a report that its dataclass cannot hold; ``where``: the field's path (``items[3].latency``)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_json(cls: type, data: Any) -> Any:
    """``data`` (what :func:`to_json` wrote of a ``cls``, e.g. a report.json read with json) as a ``cls``
    again; :func:`to_json` of the result is ``data``. Raises :class:`ReadError` naming the field."""
    return _walk(cls, data, "", _read_object)


def _walk(hint: Any, value: Any, where: str, object_of: Callable[[type, Any, str], Any]) -> Any:
    """``value`` read back as ``hint``, following it into unions, lists, tuples, dicts and enums; a
    dataclass is built by ``object_of(cls, value, where)`` (the report's view, or the wire's)."""
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        if len(options) > 1 and all(dataclasses.is_dataclass(h) for h in options):
            return _walk(_shape(options, value, where), value, where, object_of)
        return _walk(options[0], value, where, object_of) if len(options) == 1 else value
    if hint is float:
        if isinstance(value, str) and value in _FLOATS:
            return _FLOATS[value]
        return value
    if origin in (list, set, frozenset, tuple):
        if not isinstance(value, list):
            raise ReadError(where, f"is {type(value).__name__}, not a list")
        args = typing.get_args(hint)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return tuple(_walk(h, v, f"{where}[{n}]", object_of) for n, (h, v) in enumerate(zip(args, value))) if args else tuple(value)
        item = args[0] if args else Any
        return origin(_walk(item, v, f"{where}[{n}]", object_of) for n, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ReadError(where, f"is {type(value).__name__}, not an object")
        item = (typing.get_args(hint) or (Any, Any))[1]
        return {k: _walk(item, v, f"{where}.{k}", object_of) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            raise ReadError(where, f"{value!r} is not one of {', '.join(repr(m.value) for m in hint)}") from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return object_of(hint, value, where)
    return value


@lru_cache(maxsize=None)  # asked once per item of a report
def _written(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """The keys :func:`to_json` always writes of a ``cls``, and every key it may write."""
    plan = _plan(cls)
    return (frozenset(key for key, _, how in plan if isinstance(how, str) or not how[0].omit_default),
            frozenset(key for key, _, _ in plan))


def _shape(options: list[type], value: Any, where: str) -> type:
    """Which of several dataclasses ``value`` was written from: the first whose keys it has."""
    keys = set(value) if isinstance(value, dict) else set()
    for cls in options:
        always, every = _written(cls)
        if always <= keys <= every:
            return cls
    raise ReadError(where, f"has the fields of no {' or '.join(c.__name__ for c in options)}")


def _read_object(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ReadError(where, f"is {type(data).__name__}, not an object")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    known = set()
    for key, name, how in _plan(cls):
        known.add(key)
        at = f"{where}.{key}" if where else key
        if isinstance(how, str):
            if key in data:
                kept[key] = _walk(_returns(cls, name), data[key], at, _read_object)
            continue
        spec, f = how
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.init:
                raise ReadError(at, "is missing")
            continue
        member = _walk(hints[name], data[key], at, _read_object)
        values[name] = spec.revert(member) if spec.revert is not None else member
    for f in dataclasses.fields(cls):  # the object's own state, which no file holds
        if f.init and f.name not in values and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    try:
        made = cls(**values)
    except (TypeError, ValueError) as exc:
        raise ReadError(where, str(exc)) from None
    object.__setattr__(made, _READ, (kept, {k: v for k, v in data.items() if k not in known}))
    return made


def replace(value: Any, **changes: Any) -> Any:
    """:func:`dataclasses.replace` that keeps what ``value`` was read with (its derived values)."""
    made = dataclasses.replace(value, **changes)
    read = value.__dict__.get(_READ)
    if read is not None:
        object.__setattr__(made, _READ, read)
    return made


def per_run_keys(cls: type) -> dict[str, str]:
    """The keys of ``cls``'s report and of every object it holds that may differ between two runs of the
    same code (json_field's and derived's ``per_run``), each with how: :data:`TIME` or :data:`FIGURES`."""
    found: dict[str, str] = {}
    seen: set[type] = set()

    def visit(hint: Any) -> None:
        for arg in typing.get_args(hint):
            visit(arg)
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)) or hint in seen:
            return
        seen.add(hint)
        for key, name, how in _plan(hint):
            if isinstance(how, str):
                mark = getattr(_getter(getattr(hint, name)), _DERIVED)
                if mark[3]:
                    found[key] = mark[3]
            else:
                if how[0].per_run:
                    found[key] = how[0].per_run
                visit(_hints(hint)[name])

    visit(cls)
    return found


def _wire(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wire(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):  # numpy arrays
        return value.tolist()
    return value


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@lru_cache(maxsize=None)
def _returns(cls: type, name: str) -> Any:
    """The type a derived value ``name`` of ``cls`` returns."""
    return typing.get_type_hints(_getter(getattr(cls, name))).get("return", Any)


def _wire_object(cls: type, data: Any, where: str) -> Any:
    """A ``cls`` from what :func:`to_wire` wrote: every field by its name."""
    if not isinstance(data, dict):
        raise ReadError(where, f"is {type(data).__name__}, not an object")
    hints = _hints(cls)
    return cls(**{f.name: _walk(hints[f.name], data[f.name], f"{where}.{f.name}", _wire_object)
                  for f in dataclasses.fields(cls) if f.init and f.name in data})


def to_wire(value: Any) -> str:
    """``value`` (a dataclass) as JSON text, every field by name: :func:`from_wire` rebuilds it."""
    return json.dumps(_wire(value))


def from_wire(cls: type, text: str) -> Any:
    return _walk(cls, json.loads(text), "", _wire_object)
