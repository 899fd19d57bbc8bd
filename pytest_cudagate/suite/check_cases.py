"""A suite's ``cases:``: each name once, a class name of one word, a value of its type for every
scalar the cases give (none for a derived one), and a non-holdout performance case to rank latency on."""

from __future__ import annotations

import re

import numpy as np

from cudagate_harness.protocol import finfo

from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.model import DEFAULT_CLASS, INT_DTYPES, Case, Param

CLASS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def cases(checker: Checker, raw: list[dict], signature: list[Param], derived: dict[str, str]) -> list[Case]:
    """The cases (the schema has checked their keys); ``derived``: the suite's derived scalars."""
    cases = [Case(c["name"], c["kind"], dict(c["scalars"]), bool(c.get("holdout", False)), c.get("seed"),
                  shape_class(checker, c.get("class", DEFAULT_CLASS), ["cases", i, "class"]), bool(c.get("generated", False)),
                  bool(c.get("constant_ok", False)))
             for i, c in enumerate(raw)]
    checker.unique([c.name for c in cases], ["cases"], "case")
    if not any(c.kind == "performance" and not c.holdout for c in cases):
        checker.add(["cases"], "at least one non-holdout case needs kind: performance (the latency gate ranks those)")
    for i, case in enumerate(cases):
        scalars(checker, case, i, signature, derived)
    return cases


def shape_class(checker: Checker, value: str, parts: list) -> str:
    """A case's ``class:``: one word, since it is typed after ``--cuda-gate-class`` and ``-k``."""
    if not CLASS_NAME.fullmatch(value):
        checker.add(parts, f"{value!r} is not a class name; write one word of letters, digits, '_' or '-' "
                           f"starting with a letter (e.g. small, large), or leave `class` out for {DEFAULT_CLASS!r}")
    return value


def scalars(checker: Checker, case: Case, index: int, signature: list[Param], derived: dict[str, str]) -> None:
    """A case's ``scalars:``: a value of its type for each scalar parameter the suite does not derive."""
    declared = {p.name: p for p in signature if p.kind == "scalar"}
    parts = ["cases", index, "scalars"]
    for name in sorted(set(declared) - set(case.scalars) - set(derived)):
        checker.add(parts, f"scalar {name!r} has no value in case {case.name!r}")
    for name, value in case.scalars.items():
        if name in derived:
            checker.add(parts + [name], f"{name!r} is derived by the suite ({name} = {derived[name]}); remove it "
                                        "from the case")
        elif name not in declared:
            checker.add(parts + [name], f"{name!r} is not a scalar parameter of the signature")
        elif declared[name].dtype in INT_DTYPES and not (isinstance(value, int) and not isinstance(value, bool)):
            checker.add(parts + [name], f"{name} is {declared[name].dtype}, so its value must be a whole number, not {value!r}")
        else:
            info = np.iinfo(declared[name].dtype) if declared[name].dtype in INT_DTYPES else finfo(declared[name].dtype)
            if not -abs(info.min) <= value <= info.max:
                checker.add(parts + [name], f"{value} does not fit {name}'s type {declared[name].dtype} "
                                            f"({info.min} to {info.max})")
