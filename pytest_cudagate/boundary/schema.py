"""Validate a loaded document against one of the JSON Schemas in ``schemas/``."""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import TYPE_CHECKING

import jsonschema_rs

import cudagate_schemas

from pytest_cudagate.errors import FileError

if TYPE_CHECKING:
    import jsonschema


_BOUNDS = {"minimum": operator.ge, "exclusiveMinimum": operator.gt, "maximum": operator.le,
           "exclusiveMaximum": operator.lt}


def _all_plain_numbers(items, instance: list) -> bool:
    """Every element of ``instance`` is a Python int or float inside the bounds of ``items``, a schema
    of only ``type: number``, bounds and a description (timing samples: thousands per report)."""
    if not isinstance(items, dict) or items.get("type") != "number" or not set(items) <= {*_BOUNDS, "type", "description"}:
        return False
    bounds = [(compare, items[key]) for key, compare in _BOUNDS.items() if key in items]
    return all((type(x) is float or type(x) is int) and all(compare(x, limit) for compare, limit in bounds)
               for x in instance)


def _items_with_shortcut(base):
    """jsonschema's ``items``, which checks each element as a schema of its own (about 6 µs a number),
    preceded by a plain loop that proves a long array of numbers valid; anything it cannot prove goes
    through ``base``, so the errors reported are jsonschema's own."""
    def items(validator, value, instance, schema):
        if isinstance(instance, list) and "prefixItems" not in schema and _all_plain_numbers(value, instance):
            return
        yield from base(validator, value, instance, schema)
    return items


@lru_cache(maxsize=None)
def _validator(name: str) -> jsonschema.protocols.Validator:
    import jsonschema  # ~60 ms: only a refused document needs its words, the compiled validator says "valid"

    # The schemas ship with the tool; tests/harness/test_protocol.py checks each against its metaschema (and
    # the installed copy against the repository's), so a run does not pay ~20 ms per schema for it.
    schema = cudagate_schemas.load(name)
    cls = jsonschema.validators.validator_for(schema)
    cls = jsonschema.validators.extend(cls, {"items": _items_with_shortcut(cls.VALIDATORS["items"])})
    return cls(schema)


@lru_cache(maxsize=None)
def _fast(name: str) -> jsonschema_rs.Validator:
    # A compiled validator answers "valid?" for a 230 KiB report in ~0.3 ms, where jsonschema walks it
    # in ~20 ms; jsonschema still words every refusal, so messages are the same as before.
    return jsonschema_rs.validator_for(cudagate_schemas.load(name), offline=True)


def _valid(document, name: str) -> bool:
    try:
        return _fast(name).is_valid(document)
    except ValueError:  # a value JSON cannot hold (a numpy scalar, bytes, a key not a string)
        return False


def format_path(parts) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def problems(document, name: str, locate=None) -> list[str]:
    """Readable schema violations of ``document``; ``locate(path)`` may return a line number."""
    if _valid(document, name):
        return []
    found = []
    for error in sorted(_validator(name).iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        hint = error.schema.get("x-hint") if isinstance(error.schema, dict) else None
        if error.validator in ("oneOf", "anyOf") and not hint and error.context:
            error = _closest(error)
        where = format_path(error.absolute_path)
        line = locate(list(error.absolute_path)) if locate else None
        prefix = f"line {line}: {where}" if line else where
        if error.validator in ("oneOf", "anyOf") and hint:
            message = f"expected {hint}"
        elif error.validator == "pattern" and hint:  # a hint says what the pattern means, and the fix
            message = f"{_clip(repr(error.instance), 120)} is not {hint}"
        elif error.validator == "additionalProperties":
            message = f"{error.message}; allowed keys: {', '.join(sorted(error.schema.get('properties', {})))}"
        else:
            message = error.message
        found.append(f"{prefix}: {_clip(message)}")
    return found


def _closest(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """Of the alternatives a value matches none of, what is wrong in the one of its own type (a
    launch object's grid, not "is not a list of steps")."""
    from jsonschema.exceptions import best_match

    own_type = [e for e in error.context if not (e.validator == "type" and not e.relative_path)]
    return best_match(own_type or error.context)


def _clip(message: str, limit: int = 300) -> str:
    """jsonschema quotes the offending value whole; a hostile file's value can be megabytes."""
    return message if len(message) <= limit else message[:limit] + f"... ({len(message) - limit} more characters)"


def validate(document, name: str, path, locate=None) -> None:
    """Raise :class:`FileError` naming ``path`` if ``document`` violates schema ``name``."""
    found = problems(document, name, locate)
    if found:
        raise FileError(path, found)
