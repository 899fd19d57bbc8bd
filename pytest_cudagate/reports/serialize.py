"""Gate results as plain JSON values (``schemas/report.schema.json``).

JSON has no NaN or infinity, yet a relative norm can be infinite and a wrong output can hold NaN:
such floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"``.
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import Any

from pytest_cudagate.judge.elementwise import OutputCheck
from pytest_cudagate.judge.latency import LatencyResult
from pytest_cudagate.judge.correctness import CaseVerdict

SAMPLE_DECIMALS = 6  # ms to the nanosecond: below CUDA event resolution, and keeps the file small


def plain(value: Any) -> Any:
    """A JSON-safe copy: dataclasses and enums unwrapped, tuples as lists, non-finite floats as text."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Enum):
        return plain(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return plain(value.item())
    return str(value)


def number(value: Any) -> float | None:
    """A report number back as a float (``"inf"`` included); None when absent."""
    if value is None:
        return None
    return float(value)


def comparison_json(c: OutputCheck) -> dict:
    return plain({
        "buffer": c.buffer, "ok": c.ok, "total": c.total, "mismatches": c.mismatches, "rel_norm": c.rel_norm,
        "max_abs_error": c.max_abs_error, "worst_index": list(c.worst_index) if c.worst_index is not None else None,
        "worst_expected": c.worst_expected, "worst_actual": c.worst_actual, "worst_allowed": c.worst_allowed,
        "rel_norm_limit": c.rel_norm_limit, "unwritten": c.unwritten,
        "tolerance": dataclasses.asdict(c.tolerance) if c.tolerance is not None else None,
        "description": c.describe(),
    })


def correctness_json(v: CaseVerdict) -> dict:
    return plain({
        "passed": v.passed, "problems": list(v.problems), "error_kind": v.error_kind, "median_ms": v.median_ms,
        "rel_norm": v.rel_norm, "comparisons": [comparison_json(c) for c in v.comparisons],
    })


def latency_json(r: LatencyResult) -> dict:
    data = plain(r.to_json())
    data["headline"] = r.headline()
    return data


def samples_json(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    return {role: [round(float(x), SAMPLE_DECIMALS) for x in values] for role, values in samples.items() if values}
