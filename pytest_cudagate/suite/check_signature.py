"""A suite's ``signature:``: each parameter's type, its buffer's size, shape and padding (``ld``) as
expressions over the scalars, each name once, and at least one output to judge."""

from __future__ import annotations

from cudagate_harness.protocol import LOW_PRECISION, unknown_dtype

from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.model import Param
from pytest_cudagate.suite.step_checks import init_value


def dtypes(checker: Checker, raw: list[dict]) -> None:
    """Each parameter's type is one of DTYPES (the schemas take any name: DTYPES is the one list)."""
    for n, param in enumerate(raw):
        for key in ("buffer", "scalar"):
            if key in param and (problem := unknown_dtype(param[key])):
                checker.add(["signature", n, key], problem)


def params(checker: Checker, raw: list[dict]) -> list[Param]:
    """The parameters, each name once (the schema has checked their keys, :func:`dtypes` their types)."""
    signature = []
    for i, p in enumerate(raw):
        if "buffer" in p:
            signature.append(Param(p["name"], "buffer", p["buffer"], p["intent"], str(p["size"]),
                                   tuple(str(s) for s in p["shape"]) if "shape" in p else None,
                                   str(p["ld"]) if "ld" in p else None, init_value(checker, p, ["signature", i])))
            if "ld" in p and len(p.get("shape", ())) != 2:
                checker.add(["signature", i, "ld"], f"{p['name']!r} has no 2-D shape; `ld` is the distance between "
                                                    "the rows of a [rows, cols] buffer: give it `shape: [ROWS, COLS]`"
                                                    ", or remove `ld`")
            if "ld" in p and "init" in p:
                checker.add(["signature", i, "init"], f"{p['name']!r} has `ld`: its padding must keep the canary the "
                                                      "harness checks, and `init` sets the whole buffer; scratch is "
                                                      "never compared, so remove `ld` (or `init`)")
        else:
            signature.append(Param(p["name"], "scalar", p["scalar"]))
            if p["scalar"] in LOW_PRECISION:
                checker.add(["signature", i, "scalar"], f"{p['scalar']} is for buffers only; pass the scalar as "
                                                        "float32 (`scalar: float32`) and convert it in the kernel")
    checker.unique([p.name for p in signature], ["signature"], "parameter")
    return signature


def expressions(checker: Checker, signature: list[Param], scalars: set[str]) -> None:
    """Each buffer's size, shape and ``ld`` are expressions over ``scalars`` (derived ones included),
    and some buffer is an output."""
    for i, p in enumerate(signature):
        if p.kind == "buffer":
            checker.expr(p.size, ["signature", i, "size"], scalars)
            for j, s in enumerate(p.shape or ()):
                checker.expr(s, ["signature", i, "shape", j], scalars)
            if p.ld is not None:
                checker.expr(p.ld, ["signature", i, "ld"], scalars)
    if not any(p.is_output for p in signature):
        checker.add(["signature"], "no buffer has intent out or inout: there would be nothing to check")

