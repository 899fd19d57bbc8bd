"""A suite's ``tolerance:``: one for each output buffer and for nothing else, ``ulp`` a whole number of
units in the last place of a float output, and a low-precision output's default ``rtol``."""

from __future__ import annotations

from cudagate_harness.protocol import LOW_PRECISION

from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.model import INT_DTYPES, Param, Tolerance, default_rtol


def tolerances(checker: Checker, raw: dict, signature: list[Param]) -> dict[str, Tolerance]:
    """Each output's tolerance, by name (the schema has checked their keys)."""
    outputs = {p.name for p in signature if p.is_output}
    tolerance = {}
    dtypes = {p.name: p.dtype for p in signature}
    scratch = {p.name for p in signature if p.is_scratch}
    for name, tol in raw.items():
        if name in scratch:
            checker.add(["tolerance", name], f"{name!r} is a scratch buffer: the kernel's own workspace is never "
                                             "compared; remove its tolerance, or make it an output (intent: out)")
        elif name not in outputs:
            checker.add(["tolerance", name], f"{name!r} is not an output buffer (outputs: {', '.join(sorted(outputs))})")
        if "ulp" in tol:
            tol = {**tol, "ulp": ulp(checker, tol["ulp"], dtypes.get(name), ["tolerance", name, "ulp"])}
        if dtypes.get(name) in LOW_PRECISION and "rtol" not in tol and "ulp" not in tol:
            tol = {**tol, "rtol": default_rtol(dtypes[name])}
        tolerance[name] = Tolerance(**tol)
    for name in sorted(outputs - set(tolerance)):
        checker.add(["tolerance"], f"output {name!r} has no tolerance; add `{name}: {{atol: ..., rtol: ...}}`")
    return tolerance


def ulp(checker: Checker, value: float, dtype: str | None, parts: list) -> int:
    """A tolerance's ``ulp``: a whole number of units in the last place, 0 or more, of a float output."""
    if dtype in INT_DTYPES:
        checker.add(parts, f"the output is {dtype}: units in the last place belong to float outputs; remove `ulp` "
                           "and use atol (0 for exact integers)")
    elif value < 0 or not float(value).is_integer():
        checker.add(parts, f"{value!r} is not a number of units in the last place; write a whole number, 0 or more "
                           "(e.g. `ulp: 4`)")
    return int(value) if float(value).is_integer() else 0
