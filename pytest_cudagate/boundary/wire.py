"""The one serializer of report objects: a dataclass is written field by field, in the order its
fields are declared, so a new report field is one line in its dataclass (and one in the schema).

Two views of one object:

* :func:`to_json`, the report's (``report.json`` items, the optimize pack's cases): each field under
  its name unless :func:`json_field` says otherwise (another key, left out, left out at its
  default, converted first), with the values the class marks :func:`derived` (a headline, a status)
  placed after the field they name. Non-finite floats are written as the strings ``"nan"``,
  ``"inf"``, ``"-inf"``: JSON has none, yet a relative norm can be infinite and a wrong output NaN.
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
from functools import lru_cache
from typing import Any

_SPEC = "cudagate.json"
_DERIVED = "__cudagate_derived__"
_order = itertools.count()


@dataclasses.dataclass(frozen=True)
class _Spec:
    key: str | None = None
    hidden: bool = False
    omit_default: bool = False
    convert: Callable[[Any], Any] | None = None


def json_field(*, key: str | None = None, hidden: bool = False, omit_default: bool = False,
               convert: Callable[[Any], Any] | None = None, **field: Any) -> Any:
    """A dataclass field (``field`` are :func:`dataclasses.field`'s arguments) as the report writes it:
    under ``key`` (default: its name); not at all (``hidden``: the object's own state); not while it
    holds its default (``omit_default``: reports from before it existed read the same); ``convert``
    applied to the value first."""
    return dataclasses.field(metadata={_SPEC: _Spec(key, hidden, omit_default, convert)}, **field)


def derived(key: str | None = None, *, after: str | None = None) -> Callable:
    """Mark a method or property's getter (below ``@property``) as a report value: written under
    ``key`` (default: its name) after the field named ``after`` (default: after the last field)."""
    def mark(function: Callable) -> Callable:
        setattr(function, _DERIVED, (key or function.__name__, after, next(_order)))
        return function
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
                key, after, order = mark
                extra.setdefault(after, []).append((order, key, name, how))
    plan: list[tuple[str, str, Any]] = []
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        spec = f.metadata.get(_SPEC, _Spec())
        if not spec.hidden:
            plan.append((spec.key or f.name, f.name, (spec, f)))
        plan += [(key, name, how) for _, key, name, how in sorted(extra.pop(f.name, []))]
    plan += [(key, name, how) for _, key, name, how in sorted(extra.pop(None, []))]
    if extra:
        raise TypeError(f"{cls.__name__}: derived values placed after no field: {sorted(extra)}")
    return tuple(plan)


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
        return data
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_json(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return to_json(value.item())
    return str(value)


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


def _build(hint: Any, value: Any) -> Any:
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        return _build(options[0], value) if len(options) == 1 else value
    if origin in (list, set, frozenset):
        (item,) = typing.get_args(hint) or (Any,)
        return origin(_build(item, v) for v in value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(h, v) for h, v in zip(args, value)) if args else tuple(value)
    if origin is dict:
        key, item = typing.get_args(hint) or (Any, Any)
        return {k: _build(item, v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = _hints(hint)
        return hint(**{f.name: _build(hints[f.name], value[f.name])
                       for f in dataclasses.fields(hint) if f.init and f.name in value})
    return value


def to_wire(value: Any) -> str:
    """``value`` (a dataclass) as JSON text, every field by name: :func:`from_wire` rebuilds it."""
    return json.dumps(_wire(value))


def from_wire(cls: type, text: str) -> Any:
    return _build(cls, json.loads(text))
