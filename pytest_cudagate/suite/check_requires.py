"""A kernel's ``requires:`` (the cases it runs on) and ``outputs:`` (the outputs it is judged on):
conditions over the scalars that evaluate on every case and leave it a latency case, outputs of the
signature that a step writes."""

from __future__ import annotations

from dataclasses import replace

from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.expr import ExprError, parse_condition
from pytest_cudagate.suite.model import Param, Program, Suite


def preconditions(checker: Checker, program: Program, raw: dict, parts: list, scalars: set[str],
                  signature: tuple[Param, ...], derivations: tuple = ()) -> Program:
    """A kernel's ``requires:`` (conditions over the scalars, derived ones included: ``derivations``,
    :attr:`Suite.derivations`) and ``outputs:`` (the outputs it is judged on: outputs of the
    signature, each written by one of its steps where it has steps)."""
    requires = []
    for i, text in enumerate(raw.get("requires", [])):
        try:
            names = parse_condition(text).names
        except ExprError as exc:
            checker.add(parts + ["requires", i], f"{exc}")
            continue
        unknown = sorted(names - scalars)
        if unknown:
            checker.add(parts + ["requires", i], f"{text!r} uses {', '.join(unknown)}, which "
                                                 f"{'is' if len(unknown) == 1 else 'are'} neither a scalar parameter "
                                                 f"nor a derived scalar (scalars: {', '.join(sorted(scalars)) or 'none'})"
                                                 "; name those only")
            continue
        requires.append(text.strip())
    program = replace(program, requires=tuple(requires), derived=derivations if requires else ())
    if "outputs" not in raw:
        return program
    params = {p.name: p for p in signature}
    taken = {a for step in program.steps for a in step.writes} if program.steps else set(params)
    for i, name in enumerate(raw["outputs"]):
        param = params.get(name)
        if param is None or not param.is_output:
            what = ("not a parameter of the signature" if param is None else
                    "a scalar" if param.kind == "scalar" else f"a buffer of intent {param.intent}")
            checker.add(parts + ["outputs", i], f"{name!r} is {what}; name outputs of the signature (intent out or "
                                                f"inout: {', '.join(p.name for p in signature if p.is_output)})")
        elif name not in taken:
            checker.add(parts + ["outputs", i], f"output {name!r} is judged but no step takes it; add it to the "
                                                "`args` of the step that writes it, or remove it from `outputs`")
    for name in sorted({n for n in raw["outputs"] if raw["outputs"].count(n) > 1}):
        checker.add(parts + ["outputs"], f"{name!r} is named twice; name each judged output once")
    return replace(program, judged=tuple(raw["outputs"]))


def kernel_cases(checker: Checker, suite: Suite) -> None:
    """Each kernel's ``requires`` evaluate on every case, and leave it a non-holdout performance
    case (the latency gate ranks those): a kernel is never left without latency cases."""
    for i, kernel in enumerate(suite.kernels):
        try:
            kept = [case for case in suite.cases if kernel.runs(case)]
        except ExprError as exc:
            checker.add(["kernels", i, "requires"], f"{exc}")
            continue
        if not any(c.kind == "performance" and not c.holdout for c in kept):
            checker.add(["kernels", i, "requires"], f"kernel {kernel.name!r} meets its requires on no non-holdout "
                                                    "performance case; add a case that meets them, or loosen them")
