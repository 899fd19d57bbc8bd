"""Validate a loaded document against one of the JSON Schemas in ``schemas/``."""

from __future__ import annotations

from functools import lru_cache

import jsonschema

import cudagate_schemas

from pytest_cudagate.errors import FileError


@lru_cache(maxsize=None)
def _validator(name: str) -> jsonschema.protocols.Validator:
    # The schemas ship with the tool; tests/test_protocol.py checks each against its metaschema (and
    # the installed copy against the repository's), so a run does not pay ~20 ms per schema for it.
    schema = cudagate_schemas.load(name)
    return jsonschema.validators.validator_for(schema)(schema)


def format_path(parts) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def problems(document, name: str, locate=None) -> list[str]:
    """Readable schema violations of ``document``; ``locate(path)`` may return a line number."""
    found = []
    for error in sorted(_validator(name).iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        where = format_path(error.absolute_path)
        line = locate(list(error.absolute_path)) if locate else None
        prefix = f"line {line}: {where}" if line else where
        hint = error.schema.get("x-hint") if isinstance(error.schema, dict) else None
        if error.validator in ("oneOf", "anyOf") and hint:
            message = f"expected {hint}"
        elif error.validator == "additionalProperties":
            message = f"{error.message}; allowed keys: {', '.join(sorted(error.schema.get('properties', {})))}"
        else:
            message = error.message
        found.append(f"{prefix}: {_clip(message)}")
    return found


def _clip(message: str, limit: int = 300) -> str:
    """jsonschema quotes the offending value whole; a hostile file's value can be megabytes."""
    return message if len(message) <= limit else message[:limit] + f"... ({len(message) - limit} more characters)"


def validate(document, name: str, path, locate=None) -> None:
    """Raise :class:`FileError` naming ``path`` if ``document`` violates schema ``name``."""
    found = problems(document, name, locate)
    if found:
        raise FileError(path, found)
