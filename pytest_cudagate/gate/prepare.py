"""What a case needs before its kernel runs (:class:`Preparer`): the suite's checks, a generated
case's arrays, and the fresh input sets, drawn once per gate run and shared by the suite's kernels;
and the kernels that hung (:class:`Hangs`), which are not run again."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

from pytest_cudagate.defences.checks import effective_checks
from pytest_cudagate.defences.fresh_inputs import Prepared, arrays_in_place, prepare
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate.job import CaseJob, outcome_for
from pytest_cudagate.judge.outcome import Failure
from pytest_cudagate.gate.link import Link
from pytest_cudagate.defences.expected import materialise
from pytest_cudagate.suite.model import Case, Checks, Suite
from pytest_cudagate.worker.requests import KernelVersion


class Hangs:
    """The kernels that did not finish a case alone within the case timeout in this gate run: each is
    not run again, so one hanging kernel costs one timeout, not one per case (and its worker's restarts)."""

    def __init__(self):
        self._on: dict[tuple[str, str, str], str] = {}  # kernel -> the case it hung on

    @staticmethod
    def key(suite: Suite, version: KernelVersion) -> tuple[str, str, str]:
        """A kernel as run, all its class variants together (they share the code that hangs): by its
        source text, so an optimizer's proposal of another text is a kernel of its own."""
        return str(suite.path), version.name, version.identity["source_sha256"]

    def record(self, key: tuple[str, str, str], case: str) -> None:
        self._on.setdefault(key, case)

    def case(self, key: tuple[str, str, str]) -> str | None:
        return self._on.get(key)


def fresh_key(suite: Suite, case: Case, checks: Checks) -> tuple:
    return suite.ident, case.name, checks.fresh_inputs, checks.adversarial_inputs


class Preparer:
    def __init__(self, link: Link, output_dir: Path, fresh_seed: int):
        self._link = link
        self.output_dir = output_dir
        self.fresh_seed = fresh_seed
        self.hangs = Hangs()
        self._fresh: dict[tuple, tuple[list[dict], list[str]]] = {}  # fresh_key -> the sets' specs, notes
        self._checks: dict[str, tuple[Checks, list[str]]] = {}  # suite path -> effective_checks, read once

    def checks(self, suite: Suite) -> tuple[Checks, list[str]]:
        """:func:`effective_checks` of ``suite``, worked out once per gate (it may read the signature
        file; a prefetch asks on every item)."""
        key = str(suite.path)
        if key not in self._checks:
            self._checks[key] = effective_checks(suite)
        return self._checks[key]

    def drawn(self, key: tuple) -> bool:
        """Whether the fresh sets of ``key`` (:func:`fresh_key`) were drawn in this gate already."""
        return key in self._fresh

    def open(self, suite: Suite, version: KernelVersion, case: Case, threshold: float) -> CaseJob:
        """A new job with its checks; failed (nothing is to run) where its kernel hung earlier."""
        job = CaseJob(suite, version, case, self.output_dir / version.name, None, [],
                      outcome_for(suite, version, case), threshold)
        hung_on = self.hangs.case(Hangs.key(suite, version))
        if hung_on is not None:
            job.outcome.failed = True
            job.outcome.message = (f"not run: {version.name} did not finish case {hung_on} within "
                                   f"the case timeout earlier in this run, so it is not run again; fix the hang (or "
                                   f"raise --cuda-gate-timeout for a kernel that is only slow) and re-run")
            return job
        job.checks, notes = self.checks(suite)
        job.outcome.notes.extend(notes)
        return job

    def off_link(self, job: CaseJob, drawn: Prepared | None) -> bool:
        """Whether ``job`` can be made ready without the worker link: its arrays are in place, and its
        fresh sets drawn (``drawn`` ahead, or earlier in this gate)."""
        key = fresh_key(job.suite, job.case, job.checks)
        return arrays_in_place(job.suite, job.case) and (job.checks.fresh_inputs <= 0 or key in self._fresh
                                                         or drawn is not None)

    def ready(self, job: CaseJob, drawn: Prepared | None, *, ahead: bool = False) -> None:
        """A generated case's arrays rebuilt and the fresh sets' specs in ``job`` (``drawn``: its sets as
        a prefetch job drew them; ``ahead``: off the worker link, where :meth:`off_link` holds);
        ``job`` fails where the arrays cannot be rebuilt."""
        problem = self.materialise(job.suite, job.case, job.outcome.notes, ahead=ahead)
        if problem:
            job.outcome.failed, job.outcome.failure, job.outcome.message = True, Failure.CASE_DATA, problem
            return
        job.fresh = self._fresh_specs(job, drawn, ahead)

    def materialise(self, suite: Suite, case: Case, notes: list[str], *, ahead: bool = False) -> str | None:
        """Why a generated case's arrays cannot be rebuilt here (None: they are, or the case stores them).
        They are checked once per suite and run, in this run's folder, as fresh sets are, drawn
        there or taken from the per-user cache (a discarded cache entry is noted in ``notes``).
        ``ahead``: off the worker link (a prefetch job's, a Python reference; or in the sending
        thread, where they are in place)."""
        if not case.generated:
            return None
        tag = _tag(suite)
        try:
            materialise(suite, case, client=None if ahead else self._link.free(),
                        root=self.output_dir / "generated" / f"{suite.name}-{tag}", notes=notes)
        except (CudagateError, OSError) as exc:
            return f"bad case data: {exc}"
        except (MemoryError, ValueError) as exc:  # numpy's allocation failure is a MemoryError
            shapes = suite.resolved(case).shapes
            return (f"bad case data: generated case {case.name} ({case.scalars}) could not be rebuilt on this host: "
                    f"{type(exc).__name__}: {exc}; its buffers are {shapes}: choose scalars this runner's memory "
                    f"holds, or run the case on a larger runner")
        return None

    def sets(self, suite: Suite, case: Case, checks: Checks, *, reference: bool) -> Prepared:
        """The case's fresh sets as far as they go without the worker (``reference``: a Python one run)."""
        tag = _tag(suite)
        return prepare(suite, case, count=checks.fresh_inputs, adversarial=checks.adversarial_inputs,
                       seed=self.fresh_seed, root=self.output_dir / "fresh" / f"{suite.name}-{tag}" / case.name,
                       reference=reference)

    def _fresh_specs(self, job: CaseJob, drawn: Prepared | None, ahead: bool) -> list[dict]:
        """The fresh input sets of a case: ``drawn`` ahead, else here (``ahead``: in the sending
        thread, where they were drawn ahead)."""
        suite, case, checks = job.suite, job.case, job.checks
        if checks.fresh_inputs <= 0:
            return []
        key = fresh_key(suite, case, checks)
        if key not in self._fresh:
            try:  # drawn ahead or here, the same sets
                prepared = drawn or self.sets(suite, case, checks, reference=True)
                sets, notes = prepared.finish(None if ahead else self._link.free())
            except (CudagateError, OSError, ValueError, KeyError) as exc:
                sets, notes = [], [f"fresh inputs could not be drawn for case {case.name}: {exc}"]
            self._fresh[key] = ([s.spec(suite, case) for s in sets], notes)
        specs, notes = self._fresh[key]
        job.outcome.notes.extend(notes)
        return copy.deepcopy(specs)


def _tag(suite: Suite) -> str:
    """The suite's folders of this run are named for its file and instantiation (each has its own arrays)."""
    return hashlib.sha256(suite.ident.encode()).hexdigest()[:8]
