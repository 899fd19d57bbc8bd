"""Every expression of a suite evaluated on every case, each result checked against what it feeds:
derived scalars, buffer sizes, shapes and padding, outliers per row, each step's buffers, and each
launch (the tuning launch at each tunable value), so that errors show when the suite loads."""

from __future__ import annotations

from collections import ChainMap

from cudagate_harness.protocol import numpy_dtype

from pytest_cudagate.suite import device
from pytest_cudagate.suite.check_derived import values_fit
from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.expr import ExprError, buffer_problem, launch_problems
from pytest_cudagate.suite.model import Case, Launch, Param, Program, Step, Steps, Suite
from pytest_cudagate.suite.step_checks import step_fits


def resolve_everything(checker: Checker, suite: Suite) -> None:
    """Evaluate every derived scalar, size, shape and launch expression (tuning launches too, at
    each tunable value) for every case, and check each result against what it feeds, so errors
    show at load time."""
    crowded: set[str] = set()  # inputs whose outliers fill a row
    narrow: set[str] = set()  # padded buffers whose ld is refused (one line each, naming the first case)
    misfits: set[tuple[str, int]] = set()  # (kernel, step number) of steps already named as not fitting
    for i, case in enumerate(suite.cases):
        try:
            scalars = suite.scalars(case)
        except ExprError as exc:
            checker.add(["derived"], f"case {case.name!r}: {exc}")
            continue
        if not values_fit(checker, suite, case, scalars):
            continue
        counts = None  # stays None where the sizes cannot be worked out (named once, below)
        try:
            counts = suite.counts(case)
            for param in suite.buffers:
                problem = buffer_problem(counts[param.name], numpy_dtype(param.dtype).itemsize)
                if problem:
                    checker.add(["cases", i], f"buffer {param.name!r} {problem} in case {case.name!r}")
                elif param.shape:
                    shape = suite.shape(param, case)
                    product = 1
                    for dim in shape:
                        product *= dim
                    if min(shape) < 0 or product != counts[param.name]:
                        checker.add(["cases", i], f"buffer {param.name!r}: shape {list(shape)} holds {product} "
                                                  f"elements but size gives {counts[param.name]}")
                    elif param.ld is not None and param.name not in narrow:
                        padding(checker, suite, param, case, narrow)
                dist = suite.inputs.get(param.name)
                if (not problem and dist is not None and dist.distribution == "outliers" and dist.k is not None
                        and param.name not in crowded and dist.k >= dist.group(suite.shape(param, case))):
                    crowded.add(param.name)  # one line for the input, naming the first case
                    group, what = dist.group(suite.shape(param, case)), "a row" if dist.per == "row" else "a block"
                    checker.add(["inputs", param.name, "k"], f"{dist.k} outliers in {what} of {group} elements "
                                f"(case {case.name!r}) leave no value of the base distribution; make k at most "
                                f"{group - 1}" + (", or draw them per a larger block (`per: N`)" if what == "a row" else ""))
        except ExprError as exc:
            checker.add(["cases", i], f"case {case.name!r}: {exc}")
        programs = list(suite.kernels) + ([suite.reference.program] if suite.reference.program else [])
        for program in programs:
            if not meets(program, case):  # absent for it: its launches need not fit the case
                continue
            if counts is not None:
                step_fits(checker, program, case, i, scalars, counts, misfits)
            for what, launch, scalars in launches(program, case, scalars):
                for label, one in labelled(what, launch):
                    facts = "" if one.names().isdisjoint(device.FACTS) else f" ({device.STAND_IN_TEXT})"
                    try:
                        resolved = one.resolve(device.with_facts(scalars, device.STAND_IN))
                    except ExprError as exc:
                        checker.add(["cases", i], f"{program.name} {label} in case {case.name!r}: {exc}{facts}")
                        continue
                    for problem in launch_problems(resolved["grid"], resolved["block"], resolved["shared_bytes"]):
                        checker.add(["cases", i], f"{program.name} {label} in case {case.name!r}: {problem}{facts}")


def meets(program: Program, case: Case) -> bool:
    """Whether ``case`` meets ``program``'s requires; one that cannot be worked out counts as met,
    so its launches are resolved and the problem named there."""
    try:
        return program.runs(case)
    except ExprError:
        return True


def padding(checker: Checker, suite: Suite, param: Param, case: Case, narrow: set[str]) -> None:
    """A padded buffer's ``ld`` on ``case``: at least its row length, its rows within a buffer's bytes
    (a buffer refused is added to ``narrow``)."""
    rows, cols, ld = suite.layout(param, case)
    parts = ["signature", suite.signature.index(param), "ld"]
    problem = buffer_problem(rows * ld, numpy_dtype(param.dtype).itemsize)
    if ld < cols:
        checker.add(parts, f"ld = {param.ld} gives {ld} in case {case.name!r}, less than the row length {cols} of "
                           f"buffer {param.name!r}: its rows would overlap; make ld at least {param.shape[1]}")
    elif problem:
        checker.add(parts, f"buffer {param.name!r} with its padding (ld = {ld}) {problem} in case {case.name!r}")
    else:
        return
    narrow.add(param.name)


def labelled(what: str, launch: Launch | Steps):
    """``(label, launch)`` for a launch, or for each step of a kernel's steps (named by number and entry)."""
    if isinstance(launch, Steps):
        for number, step in enumerate(launch.steps, 1):
            if isinstance(step, Step):
                yield f"step {number} ({step.entry})", step.launch
    else:
        yield what, launch


def launches(program: Program, case: Case, scalars: dict):
    """``(what, launch, scalars)`` for the launch the gate uses and the tuning launch with every
    value of each tunable it names (one tunable at a time, the others at their defaults). A tunable
    the launch does not name cannot change it, and each value costs one resolve: the checks grow
    with the values, not with their square. ``scalars``: the case's, derived ones included."""
    build = program.for_case(case)
    what = f"launch (class {case.shape_class} variant)" if build.variant else "launch"
    yield what, build.launch_for(case.name), scalars
    tuning = program.tuning_overrides.get(case.name, program.tuning_launch)
    if tuning is None or not program.tunables:
        return
    defaults = ChainMap({name: values[0] for name, values in program.tunables.items()}, scalars)
    used = tuning.names()
    named = [name for name in program.tunables if name in used]
    if not named:
        yield "tuning_launch", tuning, defaults
    for name in named:
        for value in program.tunables[name]:
            yield f"tuning_launch ({name}={value})", tuning, defaults.new_child({name: value})
