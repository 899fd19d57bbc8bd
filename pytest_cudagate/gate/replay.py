"""The gate for one kernel on one case (:class:`Gate`): prepare, measure, judge, decide.

Shared by the pytest items, ``cudagate approve`` and the optimizer, so a proposal is judged by
exactly the rules a pull request is.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagate.trust.approvals import Approval, Ledger
from pytest_cudagate.defences.sanitizer import wants_sanitizer
from pytest_cudagate.gate.job import CaseJob, route
from pytest_cudagate.gate.link import Link
from pytest_cudagate.gate.lookahead import Lookahead, sent_key
from pytest_cudagate.gate.measure import AgainstRelease, Answer, Bench, Measured, QuietRun, RunOnce, for_route
from pytest_cudagate.gate.options import GateOptions
from pytest_cudagate.gate.prepare import Preparer
from pytest_cudagate.gate.verdict import decide, judge
from pytest_cudagate.host import trash
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.suite.model import Case, Program, Suite
from pytest_cudagate.worker.client import Worker
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.worker.requests import KernelVersion, current_version

if TYPE_CHECKING:
    from pytest_cudagate.trust.release import ReleaseSource


class Gate:
    """Judges cases on one worker, for one hardware fingerprint."""

    def __init__(self, client: Worker, fingerprint: Fingerprint, options: GateOptions, output_dir: Path,
                 release: ReleaseSource | None = None, keep_outputs: bool = True):
        self.options = options
        self.output_dir = output_dir
        self.release = release  # release mode's reference (options.release)
        # False: a case's output files go (in the background) once it is judged, not all at the run's end
        self.keep_outputs = keep_outputs
        seed = options.fresh_seed if options.fresh_seed is not None else os.environ.get("CUDAGATE_FRESH_SEED")
        link = Link(client)
        self.prep = Preparer(link, output_dir, int(seed) if seed not in (None, "") else secrets.randbits(32))
        self.bench = Bench(link, fingerprint, self.prep.hangs, output_dir)
        self.ahead = Lookahead(link, self.bench, self.prep, self.version, threshold=self.threshold,
                               processes=options.processes)
        self._versions: dict[tuple, KernelVersion] = {}  # current and approved versions, each read once

    @property
    def fingerprint(self) -> Fingerprint:
        return self.bench.fingerprint

    @property
    def fingerprint_text(self) -> str:
        return self.bench.fingerprint_text

    @property
    def fresh_seed(self) -> int:
        return self.prep.fresh_seed

    def threshold(self, suite: Suite) -> float:
        return suite.threshold if self.options.threshold is None else self.options.threshold

    def replay(self, suite: Suite, program: Program, case: Case, ledger: Ledger, source_text: str | None = None, *,
               started: float | None = None) -> CaseOutcome:
        """A pull request's judgement of ``program`` (``source_text`` in place of its file) on ``case``;
        ``started``: ``time.perf_counter()`` as its item started, up to which a case sent ahead counts its head start."""
        job, answer = self._prepare(suite, program, case, ledger, source_text, started)
        if job.failed:
            return job.outcome
        measured = self._measure(job, ledger, answer, proposal=source_text is not None)
        self._lend(job, measured)
        judge(job, measured, self.bench, trusted=self.options.trusted)
        decide(job.outcome, self.options)
        if not self.keep_outputs and (job.out / case.name).is_dir():
            trash.discard(job.out / case.name)  # read by the judge, needed by no report
        return job.outcome

    def baseline(self, suite: Suite, program: Program, case: Case) -> CaseOutcome:
        """What ``cudagate approve`` measures: :meth:`replay`'s checks, and a performance case timed
        alone for :attr:`Timing.baseline_rounds` launches (no comparison: it is to become the
        approved version). Its samples are ``outcome.correctness.samples_ms``."""
        job = self.ahead.begin(suite, self.version(program), case)
        if job.failed:
            return job.outcome
        measure = QuietRun(self.bench) if case.kind == "performance" else RunOnce(self.bench)
        judge(job, measure.measure(job), self.bench, trusted=self.options.trusted)
        decide(job.outcome, self.options)
        return job.outcome

    def version(self, program: Program, source_text: str | None = None) -> KernelVersion:
        """``program``'s current version (``source_text``: a proposal's), read once per gate: every
        case of the kernel is built from it."""
        key = (repr(program), hashlib.sha256(source_text.encode()).hexdigest() if source_text is not None else None)
        if key not in self._versions:
            self._versions[key] = current_version(program, source_text)
        return self._versions[key]

    def approved(self, ledger: Ledger, approval: Approval) -> KernelVersion:
        """The approved version, its pinned copies read and checked once per gate."""
        key = (str(ledger.path), approval.kernel, repr(approval.identity()))
        if key not in self._versions:
            self._versions[key] = ledger.approved_version(approval)
        return self._versions[key]

    # -- the four steps of a replay -------------------------------------------------------------
    def _prepare(self, suite: Suite, program: Program, case: Case, ledger: Ledger, source_text: str | None,
                 started: float | None) -> tuple[CaseJob, Answer | None]:
        """The case's job: the one sent ahead for it (with its answer), else begun here."""
        current = self.version(program, source_text)
        sent = self.ahead.take(sent_key(suite, program, case, ledger) if source_text is None else None)
        if sent is None:
            return self.ahead.begin(suite, current, case), None
        sent.job.outcome.head_start_s = max(0.0, (time.perf_counter() if started is None else started) - sent.begun_at)
        return sent.job, sent.answer

    def _measure(self, job: CaseJob, ledger: Ledger, answer: Answer | None, *, proposal: bool) -> Measured:
        """The case measured by its route's strategy (release mode wraps it)."""
        approval = ledger.approvals.get(job.version.name)
        chosen = route(job.case, job.version, approval, proposal=proposal)
        measure = for_route(chosen, self.bench, job, ledger, approval, approved=lambda: self.approved(ledger, approval),
                            budget_s=self.options.budget_s, answer=answer)
        if self.release is not None:
            measure = AgainstRelease(measure, self.bench, self.release, approval, self.options.budget_s,
                                     proposal=proposal)
        return measure.measure(job)

    def _lend(self, job: CaseJob, measured: Measured) -> None:
        """The worker's GPU work for this case is done: the next case's run is sent while this one is
        judged (not beside compute-sanitizer, which must have the GPU alone)."""
        if wants_sanitizer(job.checks, job.suite, job.version.name, job.case, measured.body):
            return
        lent = time.perf_counter()
        self.ahead.send_next(job.suite, job.version)
        if self.ahead.sending:  # charged to the case begun, whose phases hold it
            job.outcome.lent_s = time.perf_counter() - lent
