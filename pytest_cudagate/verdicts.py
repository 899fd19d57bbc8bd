"""Turn one worker answer for one case into a correctness verdict a reviewer can read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .compare import Comparison, compare
from .suite.model import Tolerance

_ERROR_TITLES = {
    "fault": "the kernel faulted",
    "timeout": "timeout",
    "crash": "the harness worker crashed",
    "launch": "the launch was refused",
    "oom": "out of device memory",
    "input": "bad case data",
    "compile": "compile error",
}


@dataclass
class CaseVerdict:
    kernel: str
    case: str
    passed: bool
    problems: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    samples_ms: list[float] | None = None
    error_kind: str | None = None

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.samples_ms)) if self.samples_ms else None

    @property
    def rel_norm(self) -> float | None:
        return max((c.rel_norm for c in self.comparisons), default=None)

    def describe(self) -> str:
        header = f"{self.kernel} × {self.case}: {'passed' if self.passed else 'FAILED'}"
        return "\n".join([header, *self.problems, *(c.describe() for c in self.comparisons if not c.ok)])


def judge(kernel: str, case: str, body: dict, expected: dict[str, np.ndarray],
          tolerance: dict[str, Tolerance], shapes: dict[str, tuple[int, ...]] | None = None) -> CaseVerdict:
    """Check every output of both validation launches; name each way the kernel failed."""
    shapes = shapes or {}
    if body.get("status") != "ok":
        error = body.get("error", {})
        kind = error.get("kind", "error")
        title = _ERROR_TITLES.get(kind, kind)
        return CaseVerdict(kernel, case, False, [f"{title}: {error.get('message', 'no detail')}"], error_kind=kind)
    verdict = CaseVerdict(kernel, case, True, samples_ms=(body.get("timing") or {}).get("samples_ms"))
    for name, changed in sorted(body.get("inputs_modified", {}).items()):
        verdict.problems.append(f"the kernel wrote into input buffer {name!r} ({changed} elements changed)")
    for name, out in sorted(body.get("outputs", {}).items()):
        if name not in expected:
            continue
        first = np.load(out["path"], allow_pickle=False)
        result = compare(name, first, expected[name], tolerance[name], shapes.get(name), out.get("unwritten", 0))
        verdict.comparisons.append(result)
        differing = out.get("differing_second_launch", 0)
        if differing and result.ok:
            second = np.load(out["second_path"], allow_pickle=False)
            again = compare(name, second, expected[name], tolerance[name], shapes.get(name))
            if not again.ok:
                verdict.problems.append(
                    f"output {name!r} was right on the first launch but wrong after the timed launches "
                    f"({again.mismatches} elements): the kernel is stateful (caches results or counts calls)")
                verdict.comparisons.append(again)
            else:
                verdict.problems.append(
                    f"output {name!r} is not deterministic: {differing} elements differ bitwise between two "
                    f"launches on the same inputs (a race, uninitialised memory, or atomics order)")
    verdict.passed = not verdict.problems and all(c.ok for c in verdict.comparisons)
    return verdict


def load_expected(paths: dict[str, str | Path]) -> dict[str, np.ndarray]:
    return {name: np.load(path, allow_pickle=False) for name, path in paths.items()}
