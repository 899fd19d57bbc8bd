"""What the gate prepares and sends ahead of a case's turn (:class:`Lookahead`): the fresh sets of
the next cases, drawn in background threads while the worker runs (:meth:`~Lookahead.prefetch`,
defences/fresh_ahead.py); the next case's run, sent to the worker while the host judges the case
before it (:meth:`~Lookahead.expect`, then :meth:`~Lookahead.take` in its turn); and every kernel's
compute-sanitizer run before any case is timed (:meth:`~Lookahead.sanitize`)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pytest_cudagate import phases
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.defences.fresh_ahead import Ahead, Job, workers
from pytest_cudagate.defences.fresh_inputs import Prepared, arrays_in_place, labels, reads_signed_inputs
from pytest_cudagate.defences.sanitizer import sanitize, sanitizer_case
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate.job import CaseJob, Route, case_data_problem, route
from pytest_cudagate.gate.link import Link
from pytest_cudagate.gate.measure import Answer, Bench
from pytest_cudagate.gate.prepare import Hangs, Preparer, fresh_key
from pytest_cudagate.host.cpu import cores
from pytest_cudagate.suite.model import Case, Checks, Program, Suite
from pytest_cudagate.worker.requests import KernelVersion, run_request, version_request

# Fresh inputs are drawn ahead, beside the worker's timed launches, only on hosts with this many
# usable cores: the worker's host thread, the gate's own, and the drawing each get one.
PREFETCH_CORES = 4

Upcoming = tuple[Suite, Program, Case, Ledger]


class NotDrawnAhead(Exception):
    """A case begun in the sending thread needs host work no prefetch job did: it begins in its own
    turn instead (a Python reference may refuse to run off the main thread)."""


@dataclass(eq=False)
class SentAhead:
    """The next case's run, begun and sent to the worker while the host judges the case before it;
    its item takes it (:meth:`Lookahead.take`)."""

    key: tuple
    hang_key: tuple[str, str, str]
    job: CaseJob
    begun_at: float  # time.perf_counter() as its begin started, in the turn of the case before
    thread: threading.Thread | None = None  # None: its begin failed, or found it is not to run
    answer: Answer | None = None
    error: BaseException | None = None
    failed: bool = False  # its begin raised: its item begins again in its own turn (as one by one)


def sent_key(suite: Suite, program: Program, case: Case, ledger: Ledger) -> tuple:
    return suite.ident, repr(program), case.name, str(ledger.path)


class Lookahead:
    def __init__(self, link: Link, bench: Bench, prep: Preparer, version: Callable[[Program], KernelVersion], *,
                 threshold: Callable[[Suite], float], processes: int = 1):
        self._link, self._bench, self._prep, self._version, self._threshold = link, bench, prep, version, threshold
        self._processes = processes  # gate processes sharing this host's cores (xdist workers)
        self._ahead: Ahead | None = None  # from the first prefetch (the pytest session's); else drawn in turn
        self._notes: dict[tuple, list[str]] = {}  # fresh key -> what a job's materialising noted
        self._upcoming: Upcoming | None = None  # the case item after this one
        self._sent: SentAhead | None = None

    # -- a case begun ---------------------------------------------------------------------------
    def begin(self, suite: Suite, version: KernelVersion, case: Case, *, claimed: Job | None = None) -> CaseJob:
        """A case's job, ready to run: its checks and fresh inputs (as drawn ahead, else drawn here); a
        failed job where the build hung on an earlier case or a generated case cannot be rebuilt as
        signed (nothing is run then). ``claimed``: its prefetch job, waited for in the thread that
        sends the case, off the worker link (:class:`NotDrawnAhead` where it drew nothing: a
        reference runs only where it would have)."""
        job = self._prep.open(suite, version, case, self._threshold(suite))
        if job.failed:
            return job
        with phases.clock(job.outcome, "fresh_inputs"):
            drawn, noted = self._drawn(suite, case, job.checks, claimed)  # first: it may be materialising the case
            ahead = claimed is not None
            if ahead and not self._prep.off_link(job, drawn):
                if noted:
                    self._notes[fresh_key(suite, case, job.checks)] = noted  # for the item's own turn
                raise NotDrawnAhead(case.name)
            job.outcome.notes.extend(noted)
            self._prep.ready(job, drawn, ahead=ahead)
        return job

    def _drawn(self, suite: Suite, case: Case, checks: Checks, claimed: Job | None) -> tuple[Prepared | None, list[str]]:
        """The case's fresh sets as its prefetch job (``claimed`` already, or taken here) drew them,
        waited for (None: draw them in turn), and the notes its materialising left."""
        key = fresh_key(suite, case, checks)
        job = claimed or (self._ahead.take(key) if self._ahead is not None and checks.fresh_inputs > 0
                          and not self._prep.drawn(key) else None)
        prepared = _taken(job, checks) if job is not None else None
        return prepared, self._notes.pop(key, [])

    # -- fresh sets drawn ahead -----------------------------------------------------------------
    def prefetch(self, upcoming: list[tuple[Suite, Case]]) -> None:
        """Prepare the fresh sets of the ``upcoming`` cases (the one about to run first; as many as
        the host has threads for, defences/fresh_ahead.py) in the background, while the worker
        runs; trusted suites only, as their Python reference may run there, and materialise a
        generated case's arrays there first. Left to the item's own turn: sets drawn already, and
        those a CUDA reference draws from a generated case's signed arrays before they are in place
        (its reference needs the worker link)."""
        if cores() < PREFETCH_CORES:
            return  # the drawing would compete with the worker's own host thread while it times
        if self._ahead is None:
            self._ahead = Ahead(workers(cores() // max(1, self._processes)))
        jobs = []
        begun = self._sent.key if self._sent is not None else None  # its sets were taken, or failed, already
        for suite, case in upcoming[:self._ahead.held]:  # places, not jobs: never further ahead than that
            if begun is not None and begun[0] == suite.ident and begun[2] == case.name:
                continue
            checks, _ = self._prep.checks(suite)
            key = fresh_key(suite, case, checks)
            placed = arrays_in_place(suite, case) or bool(suite.reference.python)  # by the job itself
            if checks.fresh_inputs > 0 and not self._prep.drawn(key) and (placed or not reads_signed_inputs(suite)):
                jobs.append((key, functools.partial(self._draw, suite, case, checks, reference=placed)))
        self._ahead.want(jobs)

    def _draw(self, suite: Suite, case: Case, checks: Checks, *, reference: bool) -> Prepared:
        """A prefetch job: a generated case of a Python reference materialised first (no worker is
        needed), then the case's fresh sets prepared; what fails is found again in the item's turn."""
        if suite.reference.python and not arrays_in_place(suite, case):
            notes: list[str] = []
            problem = self._prep.materialise(suite, case, notes, ahead=True)
            self._notes[fresh_key(suite, case, checks)] = notes
            if problem:
                raise CudagateError(problem)
        return self._prep.sets(suite, case, checks, reference=reference)

    # -- the next case's run, sent while this one is judged -------------------------------------
    def expect(self, upcoming: Upcoming | None) -> None:
        """The case item that runs after the one about to (None: another item, or none). Its run, where
        it is one (not an interleaved comparison), is sent to the worker once this case's GPU work is
        done (:meth:`send_next`), so the worker times it while the host judges this one; on hosts of
        :data:`PREFETCH_CORES` cores or more, as the fresh inputs drawn ahead."""
        self._upcoming = upcoming if cores() >= PREFETCH_CORES else None

    def send_next(self, now: Suite, kernel: KernelVersion) -> None:
        """Begin the expected next case and send its run, where it is the next case of this kernel
        (``now``'s kernel ``kernel``); another kernel's, or another suite's, may write the folder this
        case's outputs are still judged in. Where a prefetch job is drawing its fresh sets with a
        Python reference, that job is claimed here and the case begun in the sending thread, from
        what the job drew, while this case is judged; else the case is begun here."""
        upcoming, self._upcoming = self._upcoming, None
        if upcoming is None or self._sent is not None:
            return
        suite, program, case, ledger = upcoming
        if suite.path != now.path or program.name != kernel.name:
            return
        begun_at = time.perf_counter()
        try:
            current = self._version(program)
        except CudagateError:
            return  # the item meets the same error in its own turn, and says it
        if case_data_problem(suite, case) is not None:
            return
        chosen = route(case, current, ledger.approvals.get(current.name), proposal=False)
        if chosen is Route.INTERLEAVED:
            return  # its sampler decides chunk by chunk: it runs in its own turn
        placeholder = CaseJob.bare(suite, current, case, self._prep.output_dir / current.name, self._threshold(suite))
        sent = SentAhead(sent_key(suite, program, case, ledger), Hangs.key(suite, current), placeholder, begun_at)
        identical = chosen is Route.IDENTICAL
        client, bench = self._link.client, self._bench

        def begin(claimed: Job | None) -> dict | None:
            """The case begun and its request made (None: its job failed, or its begin did)."""
            try:
                job = self.begin(suite, current, case, claimed=claimed)
                request = version_request(suite, current, [case], output_dir=job.out, timing=chosen.timing(suite),
                                          library=chosen is not Route.CORRECTNESS)
            except Exception:  # noqa: BLE001 - never this case's failure: the next item begins again in its own turn
                sent.failed = True
                return None
            sent.job = job
            if job.failed:
                return None
            job.outcome.requests.append(job.harden(request, request["cases"][0]))
            return request

        def answer(request: dict | None, claimed: Job | None) -> None:
            try:
                request = request or begin(claimed)
                if request is None:
                    return
                before = bench.device_state() if identical else {}
                with phases.RoundTrip(sent.job.outcome, client) as trip:
                    result = client.run(request)
                # where the worker has no NVML of its own: right after, not when taken
                sent.answer = Answer(trip, result, before, bench.device_state() if identical else {})
            except BaseException as exc:  # noqa: BLE001 - raised again in the item that takes the answer
                sent.error = exc

        self._sent = sent
        request, claimed = None, None
        if suite.reference.python and self._ahead is not None:  # claimed here: the next prefetch keeps it
            checks, _ = self._prep.checks(suite)
            claimed = self._ahead.claim(fresh_key(suite, case, checks))
        if claimed is None:
            request = begin(None)  # nothing to wait for, or a CUDA reference (it needs the worker link)
            if request is None:
                return
        sent.thread = threading.Thread(target=answer, args=(request, claimed), name="cudagate-send-ahead",
                                       daemon=True)
        self._link.hold(sent.thread)
        sent.thread.start()

    @property
    def sending(self) -> bool:
        """Whether a case's run was sent ahead and its item has not taken it yet."""
        return self._sent is not None

    def take(self, key: tuple | None) -> SentAhead | None:
        """The run sent ahead for ``key``, answered; a run sent for another case is waited for and
        dropped (its item did not come: the worker link is free again)."""
        sent, self._sent = self._sent, None
        if sent is None:
            return None
        if sent.thread is not None:
            sent.thread.join()
        if sent.key != key:
            # its item did not come; a hang it met still spares the kernel's later cases
            timed_out = sent.answer is not None and any(
                body.get("error", {}).get("kind") == "timeout" for body in sent.answer.result.cases.values())
            if timed_out:
                self._prep.hangs.record(sent.hang_key, sent.job.case.name)
            return None
        if sent.error is not None:
            raise sent.error
        return None if sent.failed else sent

    def settle(self) -> None:
        """Wait for the answer to a run sent ahead, if one is on its way."""
        self._link.settle()

    def close(self) -> bool:
        """Stop preparing ahead (a job running is waited for: it writes under the output folder, as
        does a run sent ahead); False when one is still running, so that folder must not go."""
        self.take(None)
        return self._ahead.close() if self._ahead is not None else True

    # -- compute-sanitizer before the first timed case ------------------------------------------
    def sanitize(self, jobs: list[tuple[Suite, Program, Case]]) -> None:
        """compute-sanitizer on each ``(suite, kernel, case)`` the gate will sanitize, several kernels
        at once, into the sanitizer's on-disk cache, from which the judge reads the verdicts back.
        Where nothing is cached yet (a fresh runner) the kernels' runs then overlap instead of
        queueing, each a few seconds; called before any case is timed, since every tool's process
        is a CUDA context on the GPU. What goes wrong here is found again, and said, on the item."""
        todo = []
        for suite, program, case in jobs:
            checks, _ = self._prep.checks(suite)
            if checks.sanitizer and case.name == sanitizer_case(suite, program.name).name:
                todo.append((suite, program, case, checks))
        if not todo:
            return
        client = self._link.client
        case_timeout, env = float(client.timeout_s), client.env
        output_dir = self._prep.output_dir / "sanitizer"

        def one(job) -> None:
            suite, program, case, checks = job
            try:
                request = run_request(suite, program, [case], output_dir=output_dir)
                sanitize(request, checks.sanitizer, case_timeout_s=case_timeout, env=env, ahead=True)
            except Exception:  # noqa: BLE001 - only a head start: the item runs it again and reports what happens
                pass

        # Three tools per kernel run at once: kernels at a time, a third of the cores' worth (two at least)
        with ThreadPoolExecutor(max_workers=max(2, cores() // 3), thread_name_prefix="cudagate-sanitize") as pool:
            list(pool.map(one, todo))


def _taken(job: Job, checks: Checks) -> Prepared | None:
    """A job's sets, or None to draw them again in the item's own turn: where it failed, or a
    Python reference dropped a set, off this thread (a reference may refuse to run in another
    thread, and a kernel must not pass for want of a fresh set)."""
    try:
        prepared = job.result()
    except (CudagateError, OSError, ValueError, KeyError):
        return None
    if prepared.sets is not None and len(prepared.sets) < len(labels(checks.fresh_inputs, checks.adversarial_inputs)):
        return None
    return prepared
