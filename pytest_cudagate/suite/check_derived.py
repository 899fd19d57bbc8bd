"""A suite's ``derived:`` scalars: names of their own, expressions over the case's scalars with no
cycle, and on each case a value that fits the type the signature gives it."""

from __future__ import annotations

import numpy as np

from cudagate_harness.protocol import finfo

from pytest_cudagate.suite import device
from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.expr import ExprError, parse
from pytest_cudagate.suite.model import INT_DTYPES, Case, Param, Suite


def declared(checker: Checker, raw: dict, signature: list[Param]) -> dict[str, str]:
    """``derived: {N: "B*T*C"}``: each name once, none a buffer's or an expression function's,
    each expression over the case's scalars and other derived ones, with no cycle. Returned in
    the order they are evaluated: each after the derived scalars it reads."""
    params = {p.name: p for p in signature}
    given = {p.name for p in signature if p.kind == "scalar"} - set(raw)  # the scalars cases give
    reads: dict[str, set[str]] = {}
    for name, value in raw.items():
        parts = ["derived", name]
        if name in params and params[name].kind == "buffer":
            checker.add(parts, f"{name!r} is a buffer of the signature; name the derived scalar otherwise")
            continue
        if name in ("cdiv", "min", "max", "ceil", "floor"):
            checker.add(parts, f"{name!r} is an expression function; choose another name")
            continue
        if name in device.FACTS:
            checker.add(parts, f"{name!r} is a device fact (launch expressions read it from the GPU); choose "
                               "another name")
            continue
        try:
            names = parse(value).names
        except ExprError as exc:
            checker.add(parts, str(exc))
            continue
        unknown = sorted(names - given - set(raw))
        if unknown:
            checker.add(parts, f"{str(value)!r} uses {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} "
                               f"neither a scalar the cases give nor a derived scalar (scalars: "
                               f"{', '.join(sorted(given)) or 'none'}; derived: {', '.join(raw)})")
            continue
        reads[name] = names & set(raw)
    order: list[str] = []
    state: dict[str, str] = {}  # name -> "open" while its reads are visited, "done" after

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done" or name not in reads:
            return
        if state.get(name) == "open":
            cycle = path[path.index(name):] + [name]
            checker.add(["derived", name], f"derived scalars form a cycle ({' -> '.join(cycle)}); derive each "
                                           "from the case's scalars or from derived ones that do not read it")
            return
        state[name] = "open"
        for read in sorted(reads[name]):
            visit(read, path + [name])
        state[name] = "done"
        order.append(name)

    for name in raw:
        visit(name, [])
    return {name: str(raw[name]) for name in order}


def values_fit(checker: Checker, suite: Suite, case: Case, scalars: dict) -> bool:
    """Whether every derived scalar the signature declares fits its type on ``case`` (each that
    does not is reported)."""
    fits = True
    types = {p.name: p.dtype for p in suite.signature if p.kind == "scalar"}
    for name in suite.derived:
        dtype = types.get(name)
        if dtype is None:
            continue
        info = np.iinfo(dtype) if dtype in INT_DTYPES else finfo(dtype)
        if not -abs(info.min) <= scalars[name] <= info.max:
            fits = False
            checker.add(["derived", name], f"case {case.name!r}: {name} = {suite.derived[name]} gives "
                                           f"{scalars[name]}, which does not fit {name}'s type {dtype} "
                                           f"({info.min} to {info.max}); give {name} a wider type in the signature")
    return fits
