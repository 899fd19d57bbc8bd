"""JSON Schemas: the contract for every file a cudagate user writes or the tool emits."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The schema ``name`` (e.g. ``"suite"`` for ``suite.schema.json``)."""
    text = resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)
