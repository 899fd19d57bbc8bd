"""The ``run`` harness requests of a case, saved beside the report for ``cudagate run``.

A saved request also carries the expected outputs, tolerances and shapes (when the suite is at
hand), so that replaying it judges correctness instead of only launching the kernel.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from ..requests import case_spec

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def request_name(suite: str, kernel: str, case: str, tag: str, number: int) -> str:
    """A file name that says what it replays; ``tag`` keeps matrix jobs' files apart."""
    stem = _UNSAFE.sub("_", f"{suite}-{kernel}-{case}-{tag}").strip("_")
    return f"{stem}-{number}.json" if number else f"{stem}.json"


def replayable(request: dict, suite: Any = None, program: Any = None) -> dict:
    """A copy of a ``run`` request with the checks of its cases added from ``suite``."""
    saved = copy.deepcopy(request)
    if suite is None or program is None:
        return saved
    for entry in saved.get("cases", []):
        try:
            checks = case_spec(suite, program, suite.case(entry["name"]), expected=True)
        except (KeyError, ValueError, OSError):
            continue  # a case the suite no longer has: replay without checks rather than not at all
        for key in ("expected", "tolerance", "shapes"):
            entry.setdefault(key, checks[key])
    return saved
