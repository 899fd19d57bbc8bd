"""A :class:`CaseOutcome` as JSON text and back, field for field, for an outcome that crosses a
process boundary (a pytest-xdist worker hands its outcomes to the controller, which reports them).

:meth:`CaseOutcome.to_json` is the report's view (derived fields, rounded samples); this is the
object itself, so the controller's reports are built from the very outcomes a ``-n 0`` run holds.
The dataclasses are rebuilt from their type hints; non-finite floats travel as JSON's NaN/Infinity
extension, which Python's json module reads back.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from enum import Enum
from functools import lru_cache
from typing import Any

from pytest_cudagate.judge.outcome import CaseOutcome


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
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


def outcome_to_wire(outcome: CaseOutcome) -> str:
    return json.dumps(_plain(outcome))


def outcome_from_wire(text: str) -> CaseOutcome:
    return _build(CaseOutcome, json.loads(text))
