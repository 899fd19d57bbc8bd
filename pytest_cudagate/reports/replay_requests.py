"""The harness requests of a case, saved beside the report as ``run`` requests for ``cudagate run``.

A ``run`` request is saved as it was sent. A ``compare`` request is a conversation with the gate
and cannot be replayed from a file, so each of its two kernels becomes a ``run`` request of its
own: the same case, launch and timing settings, for the current and for the approved version.
Saved requests also carry the expected outputs, tolerances and shapes (when the suite is at
hand), so that replaying one judges correctness instead of only launching the kernel.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from pytest_cudagate.worker.requests import REQUEST_PROTOCOL, case_spec

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def request_name(suite: str, kernel: str, case: str, tag: str, number: int, role: str = "") -> str:
    """A file name that says what it replays; ``tag`` keeps matrix jobs' files apart."""
    stem = _UNSAFE.sub("_", f"{suite}-{kernel}-{case}-{tag}").strip("_")
    return f"{stem}{f'-{number}' if number else ''}{f'-{role}' if role else ''}.json"


def from_compare(request: dict, role: str) -> dict:
    """One kernel of a ``compare`` request as a ``run`` request."""
    timing = {k: v for k, v in (request.get("timing") or {}).items() if k != "chunk"}
    return {
        "protocol": REQUEST_PROTOCOL, "op": "run", "suite": request.get("suite", ""),
        "kernel": copy.deepcopy(request["kernels"][role]), "signature": copy.deepcopy(request["signature"]),
        "cases": [{**copy.deepcopy(request["case"]), "launch": copy.deepcopy(request["launches"][role])}],
        "timing": timing or None, "output_dir": request.get("output_dir", ""),
    }


def runnable(requests: list[dict]) -> list[tuple[str, dict]]:
    """``(role, run request)`` for each replayable request of an outcome; role "" is as sent."""
    found: list[tuple[str, dict]] = []
    for request in requests:
        if request.get("op") == "run":
            found.append(("", copy.deepcopy(request)))
        elif request.get("op") == "compare" and {"kernels", "launches", "case", "signature"} <= request.keys():
            found += [("", from_compare(request, "current")), ("approved", from_compare(request, "approved"))]
    return found


def with_checks(request: dict, suite: Any = None, program: Any = None) -> dict:
    """``request`` with the checks of its cases added from ``suite``."""
    if suite is None or program is None:
        return request
    for entry in request.get("cases", []):
        try:
            checks = case_spec(suite, program, suite.case(entry["name"]), expected=True)
        except (KeyError, ValueError, OSError):
            continue  # a case the suite no longer has: replay without checks rather than not at all
        for key in ("expected", "tolerance", "shapes"):
            entry.setdefault(key, checks[key])
    return request
