"""Expected outputs recomputed on the CPU before they are signed or trusted.

A signature vouches for the expected outputs on disk. After the reference changes they are stale
until ``cudagate cases generate`` writes them again; signed as they are, the gate would blame the
kernel. So ``cudagate sign`` and ``cudagate check`` run a Python reference over each stored case's
inputs and compare what it returns with the stored expected outputs under the suite's tolerance
(the judge's element-wise check); a generated case's inputs are drawn again from its seed, checked
against their signed digests, and the reference's outputs compared with its signed sample. Cases go
smallest first until the time budget is spent; the cases left, and a CUDA reference (it needs a
GPU), are said to be not rechecked. The reference runs in a child process (:mod:`.recheck_child`),
which calls :func:`recheck_in_process`; the commands call :func:`.recheck_child.recheck_expected`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from cudagate_harness.protocol import numpy_dtype

from pytest_cudagate.boundary.options import finite
from pytest_cudagate.defences.reference import ReferenceFailure, ReferenceRunner
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.judge.elementwise import abs_diff, check_output
from pytest_cudagate.suite.cases import case_data_fix, check_case_data
from pytest_cudagate.suite.draw import case_seed
from pytest_cudagate.defences.expected import check_sample
from pytest_cudagate.suite.generated import GeneratedCaseError, drawn_inputs, read_record
from pytest_cudagate.suite.model import Case, Suite

DEFAULT_RECHECK_S = 60.0
BUDGET_OPTION = "--recheck-budget"


def add_recheck_budget(parser) -> None:
    """The option of ``cudagate sign`` and ``cudagate check`` that sets the time budget."""
    parser.add_argument(BUDGET_OPTION, type=finite(0, 86400, unit="seconds"), default=DEFAULT_RECHECK_S, metavar="S",
                        help=f"seconds spent recomputing expected outputs with a Python reference on the CPU, "
                             f"smallest cases first; the cases left are named (default {DEFAULT_RECHECK_S:g})")


@dataclass
class Recheck:
    problems: list[str] = field(default_factory=list)  # one line per output that disagrees, or case the reference fails
    notes: list[str] = field(default_factory=list)  # what was not rechecked, and why
    agreed: list[str] = field(default_factory=list)  # the cases whose outputs the reference gave again

    def said(self, suite: Suite) -> list[str]:
        """Besides the problems: how many cases agreed, and the notes."""
        agreed = ([f"expected outputs of {len(self.agreed)} case(s) agree with the reference "
                   f"{suite.reference.python} run now"] if self.agreed else [])
        return agreed + [f"note: {note}" for note in self.notes]

    def to_json(self) -> dict:
        """As the child process answers (schemas/recheck-reply.schema.json)."""
        return asdict(self)

    @classmethod
    def from_json(cls, document: dict) -> Recheck:
        """From a document the schema has checked."""
        return cls(**{name: list(document[name]) for name in ("problems", "notes", "agreed")})


def _case_bytes(suite: Suite, case: Case) -> int:
    counts = suite.counts(case)
    return sum(counts[p.name] * numpy_dtype(p.dtype).itemsize for p in suite.buffers)


def _stored(suite: Suite, case: Case, runner: ReferenceRunner) -> list[str]:
    inputs = {p.name: np.load(suite.input_path(case, p), allow_pickle=False) for p in suite.buffers if p.is_input}
    computed = runner.python(case, inputs)
    problems = []
    for param in suite.outputs:
        path = suite.expected_path(case, param)
        shape = suite.shape(param, case)
        check = check_output(param.name, computed[param.name], np.load(path, allow_pickle=False),
                             suite.tolerance[param.name], shape, output_scale=False)
        if check.ok:
            continue
        if check.worst_index is not None:
            index = check.worst_index[0] if len(check.worst_index) == 1 else list(check.worst_index)
            worst = (f"worst at index {index}: stored {check.worst_expected!r}, reference {check.worst_actual!r}, "
                     f"|diff| {abs_diff(check.worst_actual, check.worst_expected)} > allowed {check.worst_allowed:.3g}")
        else:
            worst = f"relative norm error {check.rel_norm:.3g} exceeds max_rel_norm {check.rel_norm_limit:g}"
        tolerance = suite.tolerance[param.name]
        problems.append(f"case {case.name}: the stored expected output {param.name!r} ({display_path(path)}) "
                        f"disagrees with the reference run now at {check.mismatches} of {check.total} elements "
                        f"(atol={tolerance.atol:g}, rtol={tolerance.rtol:g}); {worst}: stale, or not made by this "
                        "reference")
    return problems


def _generated(suite: Suite, case: Case, runner: ReferenceRunner) -> list[str]:
    computed = runner.python(case, drawn_inputs(suite, case, read_record(suite, case)))
    for param in suite.outputs:
        check_sample(suite, case, param.name, case_seed(suite, case), computed[param.name])
    return []


def recheck_in_process(suite: Suite, *, budget_s: float = DEFAULT_RECHECK_S, signed: bool = True) -> Recheck:
    """Recompute the Python reference, in this process, over ``suite``'s cases whose data is sound (the
    callers report the others), smallest first, until ``budget_s`` seconds are spent. ``signed``: run
    the reference only as the suite's signature signs it (``cudagate check``); False where its outputs
    are about to be signed (``cudagate sign``, as ``cudagate cases generate``)."""
    result = Recheck()
    if not suite.reference.python:
        result.notes.append(f"expected outputs not rechecked: the reference is a CUDA kernel, which runs on a GPU "
                            f"only; after changing it, run `{command('cudagate', 'cases', 'generate', suite.path)}` "
                            f"on one, then `{command('cudagate', 'sign', suite.path)}`")
        return result
    start = time.monotonic()
    left = []
    # an instantiated suite's cases, in every instantiation (named `case [T=bfloat16]`), smallest first
    runners = {one.label: ReferenceRunner(one, signed=signed) for one in suite.instances}  # one import each
    todo = [(one, case, runners[one.label]) for one in suite.instances for case in one.cases]
    for one, case, runner in sorted(todo, key=lambda t: _case_bytes(t[0], t[1])):
        name = f"{case.name} [{one.label}]" if one.label else case.name
        if check_case_data(one, case):
            continue
        if time.monotonic() - start >= budget_s:
            left.append(name)
            continue
        try:
            found = _generated(one, case, runner) if case.generated else _stored(one, case, runner)
        except (ReferenceFailure, GeneratedCaseError) as exc:
            found = [f"case {case.name}: {exc}"]
        result.problems += [problem.replace(f"case {case.name}", f"case {name}", 1) for problem in found]
        if not found:
            result.agreed.append(name)
    if result.problems:
        result.problems.append(case_data_fix(suite))
    if left:
        result.notes.append(f"case(s) {', '.join(left)}: expected outputs not rechecked with the reference: its "
                            f"{budget_s:g} s were spent (raise them with {BUDGET_OPTION} S)")
    return result
