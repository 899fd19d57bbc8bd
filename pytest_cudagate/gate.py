"""The gate for one kernel on one case: correctness, then latency against the approved version.

Shared by the pytest items, ``cudagate approve`` and the optimizer, so a proposal is judged by
exactly the rules a pull request is.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from concurrent.futures import ThreadPoolExecutor
import functools
import hashlib
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cudagate_harness.stopping import Settle
from cudagate_harness.telemetry import device_state, disturbances

from pytest_cudagate.approvals.ledger import Approval, Ledger
from pytest_cudagate.config import DEFAULT_ARCH, DEFAULT_BUDGET_S, DEFAULT_TIMEOUT_S
from pytest_cudagate.worker.client import RunResult, Worker
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.cpu import cores
from pytest_cudagate.worker.fingerprint import Fingerprint, differences, shown
from pytest_cudagate.defences.fresh_ahead import Ahead, Job, workers
from pytest_cudagate.defences.fresh_inputs import Prepared, arrays_in_place, labels, prepare, reads_signed_inputs
from pytest_cudagate.defences.checks import effective_checks, worker_checks
from pytest_cudagate.defences.sanitizer import sanitize, sanitizer_case, wants_sanitizer
from pytest_cudagate.judge.latency import (MAX_DISTURBED_CHUNKS, AdaptiveSampler, Latency, LatencyResult,
                                           against_runs, blocks, incomparable, warns)
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.worker.build import build_record
from pytest_cudagate.worker.requests import (KernelVersion, compare_request, current_version, run_request, shown_log,
                                             version_request)
from pytest_cudagate.suite.model import Case, Checks, Program, Suite
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.correctness import in_background, judge_case
from pytest_cudagate.judge.library import judge_library
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.suite.cases import case_data_fix, check_case_data
from pytest_cudagate.suite.generated import materialise
from pytest_cudagate import phases
from pytest_cudagate.host import trash

if TYPE_CHECKING:
    from pytest_cudagate.approvals.release import ReleaseSource



@dataclass(frozen=True)
class GateOptions:
    strict: bool = False  # inconclusive and unstable fail
    release: bool = False  # also judge against the previous release; regressed against stored runs and incomparable fail
    budget_s: float = DEFAULT_BUDGET_S  # measurement time per case
    threshold: float | None = None  # overrides the suite's
    fresh_seed: int | None = None  # seed of the fresh inputs; default $CUDAGATE_FRESH_SEED, else random per run
    trusted: bool = False  # under a trust root (cudagate gate --trusted-ref): a sanitizer without a verdict fails
    processes: int = 1  # gate processes sharing this host's cores (xdist workers): each prepares ahead with its share


# Fresh inputs are drawn ahead, beside the worker's timed launches, only on hosts with this many
# usable cores: the worker's host thread, the gate's own, and the drawing each get one.
PREFETCH_CORES = 4

# A kernel timed alone stops before Timing.baseline_rounds once its run level is known to ±0.5% at 99%
# (cudagate_harness.stopping): a long kernel after a few dozen launches, where hundreds cost most of a
# second of GPU time; its verdict's interval is at least ±8.6% (stats.RUN_SPREAD_FLOOR).
RUN_LEVEL_WITHIN = 0.005


def baseline_timing(suite: Suite) -> dict:
    """The timing of a kernel measured alone: a stored baseline, or a kernel identical to it. The
    settle rule's 1% error is shared between the looks it may take (99% over all of them)."""
    rounds = suite.timing.baseline_rounds
    return {**suite.timing.to_json(), "repeat": rounds,
            "settle": Settle.over_looks(stats.RUN_QUANTILE, RUN_LEVEL_WITHIN, rounds).to_json()}


def disturbed(threshold: float, discarded: list[str], fingerprint: str) -> LatencyResult | None:
    """``unstable`` when a run alone was disturbed in every attempt (None when one attempt was clean)."""
    if len(discarded) <= MAX_DISTURBED_CHUNKS:
        return None
    return LatencyResult(Latency.UNSTABLE, threshold, reason="the GPU was disturbed in every attempt (throttling or "
                         "other processes); free the runner and re-run", discarded=discarded, fingerprint=fingerprint)


def case_data_problem(suite: Suite, case: Case) -> str | None:
    """Why a case's data cannot be judged, in the gate's words (None when it is sound)."""
    problems = check_case_data(suite, case)
    if not problems:
        return None
    return ("case data does not match the signature:\n" + "\n".join(f"  - {p}" for p in problems)
            + f"\n{case_data_fix(suite)}")


class Route(enum.Enum):
    """How a case is measured: the comparison chosen for it."""

    CORRECTNESS = "correctness"  # not a performance case: one run, untimed
    UNAPPROVED = "unapproved"  # no approved version: timed alone, nothing to compare with
    IDENTICAL = "identical"  # byte-identical to its approval: timed alone, against the stored runs
    INTERLEAVED = "interleaved"  # changed: timed interleaved with the approved version

    def timing(self, suite: Suite) -> dict | None:
        """The timing of a run of this route (not of an interleaved comparison)."""
        if self is Route.CORRECTNESS:
            return None
        return baseline_timing(suite) if self is Route.IDENTICAL else suite.timing.to_json()


def route(case: Case, current: KernelVersion, approval: Approval | None, *, proposal: bool) -> Route:
    """The comparison ``case`` of ``current`` gets (``proposal``: an optimizer's text, never timed as
    its approval however alike)."""
    if case.kind != "performance":
        return Route.CORRECTNESS
    if approval is None:
        return Route.UNAPPROVED
    if not proposal and current.identity == approval.identity():
        return Route.IDENTICAL
    return Route.INTERLEAVED


class NotDrawnAhead(Exception):
    """A case begun in the sending thread needs host work no prefetch job did: it begins in its own
    turn instead (a Python reference may refuse to run off the main thread)."""


@dataclass(eq=False)
class SentAhead:
    """The next case's run, begun and sent to the worker while the host judges the case before it;
    its item takes the answer (:meth:`Gate.replay`)."""

    key: tuple
    hang_key: tuple[str, str, str]
    outcome: CaseOutcome
    extra: dict
    begun_at: float  # time.perf_counter() as its begin started, in the turn of the case before
    before: dict = dataclasses.field(default_factory=dict)  # NVML's view as it was sent (identical kernels)
    after: dict = dataclasses.field(default_factory=dict)  # and as it was answered
    thread: threading.Thread | None = None  # None: its begin failed, or found it is not to run
    trip: phases.RoundTrip | None = None
    result: RunResult | None = None
    error: BaseException | None = None
    failed: bool = False  # its begin raised: its item begins again in its own turn (as one by one)


class Gate:
    """Judges cases on one worker, for one hardware fingerprint."""

    def __init__(self, client: Worker, fingerprint: Fingerprint, options: GateOptions, output_dir: Path,
                 release: ReleaseSource | None = None, keep_outputs: bool = True):
        self._client = client
        self.fingerprint = fingerprint
        self.options = options
        self.output_dir = output_dir
        self.release = release  # release mode's reference (options.release)
        # False: a case's output files go (in the background) once it is judged, not all at the run's end
        self.keep_outputs = keep_outputs
        seed = options.fresh_seed if options.fresh_seed is not None else os.environ.get("CUDAGATE_FRESH_SEED")
        self.fresh_seed = int(seed) if seed not in (None, "") else secrets.randbits(32)
        self._fresh: dict[tuple, tuple[list[dict], list[str]]] = {}
        self._fresh_ahead: Ahead | None = None  # from the first prefetch (the pytest session's); else drawn in turn
        self._ahead_notes: dict[tuple, list[str]] = {}  # fresh key -> what a job's materialising noted
        self._checks: dict[str, tuple[Checks, list[str]]] = {}  # suite path -> effective_checks, read once
        self._versions: dict[tuple, KernelVersion] = {}  # current and approved versions, each read once
        # (suite path, kernel, proposal) -> the case it hung on alone: it is not run again in this gate,
        # so one hanging kernel costs one case timeout, not one per case (and its worker's restarts)
        self._hung: dict[tuple[str, str, str], str] = {}
        self._upcoming: tuple[Suite, Program, Case, Ledger] | None = None  # the case item after this one
        self._sent: SentAhead | None = None

    @property
    def client(self) -> Worker:
        """The worker link, free: a run sent ahead has its answer first (one request at a time)."""
        self.settle()
        return self._client

    def settle(self) -> None:
        """Wait for the answer to a run sent ahead, if one is on its way."""
        sent = self._sent
        if sent is not None and sent.thread is not None:
            if sent.thread is threading.current_thread():
                raise RuntimeError("the thread sending a case ahead asked for the worker link it is about to use")
            sent.thread.join()

    @property
    def fingerprint_text(self) -> str:
        return f"{self.fingerprint.key()}: {self.fingerprint.describe()}"

    def replay(self, suite: Suite, program: Program, case: Case, ledger: Ledger, source_text: str | None = None, *,
               started: float | None = None) -> CaseOutcome:
        """A pull request's judgement of ``program`` (``source_text`` in place of its file) on ``case``;
        ``started``: ``time.perf_counter()`` as its item started, up to which a case sent ahead counts its head start."""
        current = self.version(program, source_text)
        sent = self._take_sent(self._sent_key(suite, program, case, ledger) if source_text is None else None)
        if sent is not None:
            outcome, extra = sent.outcome, sent.extra
            outcome.head_start_s = max(0.0, (time.perf_counter() if started is None else started) - sent.begun_at)
        else:
            outcome, extra = self._begin(suite, current, case)
        if outcome.failed:
            return outcome
        threshold = suite.threshold if self.options.threshold is None else self.options.threshold
        approval = ledger.approvals.get(current.name)
        out = self.output_dir / current.name
        chosen = route(case, current, approval, proposal=source_text is not None)
        if chosen is Route.CORRECTNESS:
            body, compile_info = self._run(outcome, suite, current, case, None, out, extra, sent=sent)
        elif chosen is Route.UNAPPROVED:
            body, compile_info = self._run(outcome, suite, current, case, chosen.timing(suite), out, extra, library=True,
                                           sent=sent)
            outcome.latency = incomparable(threshold, f"no approved version of {current.name} in {ledger.path.name}; "
                                           f"run `cudagate approve {suite.path} {current.name}` on a GPU runner",
                                           self.fingerprint_text)
        elif chosen is Route.IDENTICAL:
            body, compile_info, discarded = self._quiet_run(outcome, suite, current, case, chosen.timing(suite), out, extra,
                                                            library=True, sent=sent)
            with phases.clock(outcome, "statistics"):
                outcome.latency = disturbed(threshold, discarded, self.fingerprint_text) or self._identical(
                    suite, approval, case, body, threshold)
            outcome.latency.discarded = discarded
        else:
            body, compile_info, outcome.latency = self.interleaved(
                outcome, suite, case, current, self._approved(ledger, approval), threshold, out, extra, library=True)
        if (self.release is not None and outcome.latency is not None and compile_info is not None
                and compile_info.get("ok") and body.get("status") == "ok"):
            outcome.latency.release = self._against_release(outcome, suite, current, case, approval, threshold, out,
                                                            extra, proposal=source_text is not None)
        if not wants_sanitizer(extra["checks"], suite, case, body):  # compute-sanitizer must have the GPU alone
            lent = time.perf_counter()
            self._send_upcoming(suite, current)
            if self._sent is not None:  # charged to the case begun, whose phases hold it
                outcome.lent_s = time.perf_counter() - lent
        judged = self._judge(outcome, suite, current, case, body, compile_info, extra)
        if not self.keep_outputs and (out / case.name).is_dir():
            trash.discard(out / case.name)  # read by the judge, needed by no report
        return judged

    def baseline(self, suite: Suite, program: Program, case: Case) -> CaseOutcome:
        """What ``cudagate approve`` measures: :meth:`replay`'s checks, and a performance case timed
        alone for :attr:`Timing.baseline_rounds` launches (no comparison: it is to become the
        approved version). Its samples are ``outcome.correctness.samples_ms``."""
        current = self.version(program)
        outcome, extra = self._begin(suite, current, case)
        if outcome.failed:
            return outcome
        threshold = suite.threshold if self.options.threshold is None else self.options.threshold
        out = self.output_dir / current.name
        if case.kind != "performance":
            body, compile_info = self._run(outcome, suite, current, case, None, out, extra)
        else:
            body, compile_info, discarded = self._quiet_run(outcome, suite, current, case, baseline_timing(suite), out, extra)
            outcome.latency = disturbed(threshold, discarded, self.fingerprint_text)
        return self._judge(outcome, suite, current, case, body, compile_info, extra)

    def version(self, program: Program, source_text: str | None = None) -> KernelVersion:
        """``program``'s current version (``source_text``: a proposal's), read once per gate: every
        case of the kernel is built from it."""
        key = (repr(program), hashlib.sha256(source_text.encode()).hexdigest() if source_text is not None else None)
        if key not in self._versions:
            self._versions[key] = current_version(program, source_text)
        return self._versions[key]

    # -- the next case's run, sent while this one is judged -------------------------------------
    def expect(self, upcoming: tuple[Suite, Program, Case, Ledger] | None) -> None:
        """The case item that runs after the one about to (None: another item, or none). Its run, where
        it is one (not an interleaved comparison), is sent to the worker once this case's GPU work is
        done, so the worker times it while the host judges this one; on hosts of
        :data:`PREFETCH_CORES` cores or more, as the fresh inputs drawn ahead."""
        self._upcoming = upcoming if cores() >= PREFETCH_CORES else None

    @staticmethod
    def _sent_key(suite: Suite, program: Program, case: Case, ledger: Ledger) -> tuple:
        return str(suite.path), repr(program), case.name, str(ledger.path)

    def _send_upcoming(self, now: Suite, kernel: KernelVersion) -> None:
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
            current = self.version(program)
        except CudagateError:
            return  # the item meets the same error in its own turn, and says it
        if case_data_problem(suite, case) is not None:
            return
        chosen = route(case, current, ledger.approvals.get(current.name), proposal=False)
        if chosen is Route.INTERLEAVED:
            return  # its sampler decides chunk by chunk: it runs in its own turn
        sent = SentAhead(self._sent_key(suite, program, case, ledger), self._hang_key(suite, current),
                         CaseOutcome(suite.name, current.name, case.name, case.kind, shape_class=case.shape_class),
                         {}, begun_at)
        identical = chosen is Route.IDENTICAL

        def begin(claimed: Job | None) -> dict | None:
            """The case begun and its request made (None: its outcome failed, or its begin did)."""
            try:
                outcome, extra = self._begin(suite, current, case, claimed=claimed)
                request = version_request(suite, current, [case], output_dir=self.output_dir / current.name,
                                          timing=chosen.timing(suite), library=chosen is not Route.CORRECTNESS)
            except Exception:  # noqa: BLE001 - never this case's failure: the next item begins again in its own turn
                sent.failed = True
                return None
            sent.outcome, sent.extra = outcome, extra
            if outcome.failed:
                return None
            outcome.requests.append(self._harden(request, request["cases"][0], extra))
            return request

        def answer(request: dict | None, claimed: Job | None) -> None:
            try:
                request = request or begin(claimed)
                if request is None:
                    return
                if identical:
                    sent.before = self._device_state()
                with phases.RoundTrip(sent.outcome, self._client) as trip:
                    sent.result = self._client.run(request)
                sent.trip = trip
                if identical:  # where the worker has no NVML of its own: right after, not when taken
                    sent.after = self._device_state()
            except BaseException as exc:  # noqa: BLE001 - raised again in the item that takes the answer
                sent.error = exc

        self._sent = sent
        request, claimed = None, None
        if suite.reference.python and self._fresh_ahead is not None:  # claimed here: the next prefetch keeps it
            claimed = self._fresh_ahead.claim(self._fresh_key(suite, case, self.checks(suite)[0]))
        if claimed is None:
            request = begin(None)  # nothing to wait for, or a CUDA reference (it needs the worker link)
            if request is None:
                return
        sent.thread = threading.Thread(target=answer, args=(request, claimed), name="cudagate-send-ahead",
                                       daemon=True)
        sent.thread.start()

    def _take_sent(self, key: tuple | None) -> SentAhead | None:
        """The run sent ahead for ``key``, answered; a run sent for another case is waited for and
        dropped (its item did not come: the worker link is free again)."""
        sent, self._sent = self._sent, None
        if sent is None:
            return None
        if sent.thread is not None:
            sent.thread.join()
        if sent.key != key:
            # its item did not come; a hang it met still spares the kernel's later cases
            timed_out = sent.result is not None and any(
                body.get("error", {}).get("kind") == "timeout" for body in sent.result.cases.values())
            if timed_out:
                self._hung.setdefault(sent.hang_key, sent.outcome.case)
            return None
        if sent.error is not None:
            raise sent.error
        return None if sent.failed else sent

    def _approved(self, ledger: Ledger, approval: Approval) -> KernelVersion:
        """The approved version, its pinned copies read and checked once per gate."""
        key = (str(ledger.path), approval.kernel, repr(approval.identity()))
        if key not in self._versions:
            self._versions[key] = ledger.approved_version(approval)
        return self._versions[key]

    def checks(self, suite: Suite) -> tuple[Checks, list[str]]:
        """:func:`effective_checks` of ``suite``, worked out once per gate (it may read the signature
        file; a prefetch asks on every item)."""
        key = str(suite.path)
        if key not in self._checks:
            self._checks[key] = effective_checks(suite)
        return self._checks[key]

    def _begin(self, suite: Suite, current: KernelVersion, case: Case, *,
               claimed: Job | None = None) -> tuple[CaseOutcome, dict]:
        """A new outcome and the case's checks and fresh inputs; a failed outcome when the build hung
        on an earlier case or a generated case cannot be rebuilt as signed (nothing is run then).
        ``claimed``: the case's prefetch job, waited for in the thread that sends the case, off the
        worker link (:class:`NotDrawnAhead` where it drew nothing: a reference runs only where it
        would have)."""
        ahead = claimed is not None
        outcome = CaseOutcome(suite.name, current.name, case.name, case.kind, shape_class=case.shape_class)
        hung_on = self._hung.get(self._hang_key(suite, current))
        if hung_on is not None:
            outcome.failed = True
            outcome.message = (f"not run: {current.name} did not finish case {hung_on} within "
                               f"the case timeout earlier in this run, so it is not run again; fix the hang (or raise "
                               f"--cuda-gate-timeout for a kernel that is only slow) and re-run")
            return outcome, {}
        checks, notes = self.checks(suite)
        outcome.notes.extend(notes)
        with phases.clock(outcome, "fresh_inputs"):
            drawn, noted = self._drawn_ahead(suite, case, checks, claimed)  # first: it may be materialising the case
            key = self._fresh_key(suite, case, checks)
            if ahead and (not arrays_in_place(suite, case)
                          or (checks.fresh_inputs > 0 and key not in self._fresh and drawn is None)):
                if noted:
                    self._ahead_notes[key] = noted  # for the item's own turn, which does the rest
                raise NotDrawnAhead(case.name)
            outcome.notes.extend(noted)
            problem = self._materialise(suite, case, outcome.notes, ahead=ahead)
            if problem:
                outcome.failed, outcome.message = True, problem
                return outcome, {}
            return outcome, {"checks": checks, "fresh": self._fresh_specs(suite, case, checks, outcome, drawn, ahead)}

    def _materialise(self, suite: Suite, case: Case, notes: list[str], *, ahead: bool = False) -> str | None:
        """Why a generated case's arrays cannot be rebuilt here (None: they are, or the case stores them).
        They are checked once per suite and run, in this run's folder, as fresh sets are, drawn
        there or taken from the per-user cache (a discarded cache entry is noted in ``notes``).
        ``ahead``: off the worker link (a prefetch job's, a Python reference; or in the sending
        thread, where they are in place)."""
        if not case.generated:
            return None
        tag = hashlib.sha256(str(suite.path).encode()).hexdigest()[:8]
        try:
            materialise(suite, case, client=None if ahead else self.client,
                        root=self.output_dir / "generated" / f"{suite.name}-{tag}", notes=notes)
        except (CudagateError, OSError) as exc:
            return f"bad case data: {exc}"
        except (MemoryError, ValueError) as exc:  # numpy's allocation failure is a MemoryError
            shapes = suite.resolved(case).shapes
            return (f"bad case data: generated case {case.name} ({case.scalars}) could not be rebuilt on this host: "
                    f"{type(exc).__name__}: {exc}; its buffers are {shapes}: choose scalars this runner's memory "
                    f"holds, or run the case on a larger runner")
        return None

    @staticmethod
    def _hang_key(suite: Suite, current: KernelVersion) -> tuple[str, str, str]:
        """A kernel as run, all its class variants together (they share the code that hangs): by its
        source text, so an optimizer's proposal of another text is a kernel of its own."""
        return str(suite.path), current.name, current.identity["source_sha256"]

    def _judge(self, outcome, suite, current: KernelVersion, case, body, compile_info, extra) -> CaseOutcome:
        """Correctness (with the fresh inputs and the sanitizer), then the decision and its words."""
        if compile_info is not None and not compile_info.get("ok"):
            outcome.failed = True
            what = f" ({current.build_name(case)})" if case.shape_class in current.classes else ""
            outcome.message = (f"{current.source_file}{what} does not compile:\n"
                               f"{shown_log(current.name, current.source_path, compile_info.get('log', ''))}")
            return outcome
        resolved = suite.resolved(case)
        checks = extra["checks"]
        with phases.clock(outcome, "checks"):
            expected = resolved.expected_outputs()
            # informational: judged beside the verdict (and side by side with it), never into it
            library = (in_background(judge_library, body["library"], case.name, expected, suite.tolerance,
                                     resolved.shapes, checks) if body.get("library") else None)
            outcome.correctness = judge_case(current.name, case.name, body, expected, suite.tolerance, resolved.shapes,
                                             checks=checks)
        outcome.notes.extend(outcome.correctness.notes)
        if library is not None:
            with phases.clock(outcome, "statistics"):
                outcome.library = library.result()
        with phases.clock(outcome, "sanitizer"):
            self._sanitize(outcome, suite, current, case, body, checks)
        decide(outcome, self.options)
        return outcome

    # -- hardening (docs/hardening.md) ------------------------------------------------------------
    def _fresh_specs(self, suite: Suite, case: Case, checks, outcome: CaseOutcome, drawn: Prepared | None,
                     ahead: bool = False) -> list[dict]:
        """The fresh input sets of a case (drawn once per gate run, shared by the suite's kernels):
        ``drawn`` ahead, else here (``ahead``: in the sending thread, where :meth:`_begin` made sure
        they were drawn)."""
        if checks.fresh_inputs <= 0:
            return []
        key = self._fresh_key(suite, case, checks)
        if key not in self._fresh:
            try:  # drawn ahead or here, the same sets
                prepared = drawn or self._prepare(suite, case, checks, reference=True)
                sets, notes = prepared.finish(None if ahead else self.client)
            except (CudagateError, OSError, ValueError, KeyError) as exc:
                sets, notes = [], [f"fresh inputs could not be drawn for case {case.name}: {exc}"]
            self._fresh[key] = ([s.spec(suite, case) for s in sets], notes)
        specs, notes = self._fresh[key]
        outcome.notes.extend(notes)
        return copy.deepcopy(specs)

    def sanitize_ahead(self, jobs: list[tuple[Suite, Program, Case]]) -> None:
        """compute-sanitizer on each ``(suite, kernel, case)`` the gate will sanitize, several kernels
        at once, into the sanitizer's on-disk cache, from which :meth:`_sanitize` reads the verdicts
        back. Where nothing is cached yet (a fresh runner) the kernels' runs then overlap instead of
        queueing, each a few seconds; called before any case is timed, since every tool's process
        is a CUDA context on the GPU. What goes wrong here is found again, and said, on the item."""
        todo = []
        for suite, program, case in jobs:
            checks, _ = self.checks(suite)
            if checks.sanitizer and case.name == sanitizer_case(suite).name:
                todo.append((suite, program, case, checks))
        if not todo:
            return
        case_timeout = float(getattr(self._client, "timeout_s", DEFAULT_TIMEOUT_S))
        env = getattr(self._client, "env", None)

        def one(job) -> None:
            suite, program, case, checks = job
            try:
                request = run_request(suite, program, [case], output_dir=self.output_dir / "sanitizer")
                sanitize(request, checks.sanitizer, case_timeout_s=case_timeout, env=env, ahead=True)
            except Exception:  # noqa: BLE001 - only a head start: the item runs it again and reports what happens
                pass

        # Three tools per kernel run at once: kernels at a time, a third of the cores' worth (two at least)
        with ThreadPoolExecutor(max_workers=max(2, cores() // 3), thread_name_prefix="cudagate-sanitize") as pool:
            list(pool.map(one, todo))

    def _drawn_ahead(self, suite: Suite, case: Case, checks, claimed: Job | None) -> tuple[Prepared | None, list[str]]:
        """The case's fresh sets as its prefetch job (``claimed`` already, or taken here) drew them,
        waited for (None: draw them in turn), and the notes its materialising left."""
        key = self._fresh_key(suite, case, checks)
        job = claimed or (self._fresh_ahead.take(key) if self._fresh_ahead is not None and checks.fresh_inputs > 0
                          and key not in self._fresh else None)
        prepared = self._taken(job, checks) if job is not None else None
        return prepared, self._ahead_notes.pop(key, [])

    def _draw(self, suite: Suite, case: Case, checks, *, reference: bool) -> Prepared:
        """A prefetch job: a generated case of a Python reference materialised first (no worker is
        needed), then the case's fresh sets prepared; what fails is found again in the item's turn."""
        if suite.reference.python and not arrays_in_place(suite, case):
            notes: list[str] = []
            problem = self._materialise(suite, case, notes, ahead=True)
            self._ahead_notes[self._fresh_key(suite, case, checks)] = notes
            if problem:
                raise CudagateError(problem)
        return self._prepare(suite, case, checks, reference=reference)

    @staticmethod
    def _taken(job, checks) -> Prepared | None:
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

    @staticmethod
    def _fresh_key(suite: Suite, case: Case, checks) -> tuple:
        return str(suite.path), case.name, checks.fresh_inputs, checks.adversarial_inputs

    def _prepare(self, suite: Suite, case: Case, checks, *, reference: bool) -> Prepared:
        tag = hashlib.sha256(str(suite.path).encode()).hexdigest()[:8]
        return prepare(suite, case, count=checks.fresh_inputs, adversarial=checks.adversarial_inputs,
                       seed=self.fresh_seed, root=self.output_dir / "fresh" / f"{suite.name}-{tag}" / case.name,
                       reference=reference)

    def prefetch(self, upcoming: list[tuple[Suite, Case]]) -> None:
        """Prepare the fresh sets of the ``upcoming`` cases (the one about to run first; as many as
        the host has threads for, defences/fresh_ahead.py) in the background, while the worker
        runs; trusted suites only, as their Python reference may run there, and materialise a
        generated case's arrays there first. Left to the item's own turn: sets drawn already, and
        those a CUDA reference draws from a generated case's signed arrays before they are in place
        (its reference needs the worker link)."""
        if cores() < PREFETCH_CORES:
            return  # the drawing would compete with the worker's own host thread while it times
        if self._fresh_ahead is None:
            self._fresh_ahead = Ahead(workers(cores() // max(1, self.options.processes)))
        jobs = []
        begun = self._sent.key if self._sent is not None else None  # its sets were taken, or failed, already
        for suite, case in upcoming[:self._fresh_ahead.held]:  # places, not jobs: never further ahead than that
            if begun is not None and begun[0] == str(suite.path) and begun[2] == case.name:
                continue
            checks, _ = self.checks(suite)
            key = self._fresh_key(suite, case, checks)
            placed = arrays_in_place(suite, case) or bool(suite.reference.python)  # by the job itself
            if checks.fresh_inputs > 0 and key not in self._fresh and (placed or not reads_signed_inputs(suite)):
                jobs.append((key, functools.partial(self._draw, suite, case, checks, reference=placed)))
        self._fresh_ahead.want(jobs)

    def close(self) -> bool:
        """Stop preparing ahead (a job running is waited for: it writes under the output folder, as
        does a run sent ahead); False when one is still running, so that folder must not go."""
        self._take_sent(None)
        return self._fresh_ahead.close() if self._fresh_ahead is not None else True

    @staticmethod
    def _harden(request: dict, case_entry: dict, extra: dict | None) -> dict:
        """Add the checks and fresh inputs to ``request``; return the copy a report keeps: without the
        fresh sets, whose files live only as long as this run (their seed is in any failure)."""
        if extra is None:
            return request
        request["checks"] = worker_checks(extra["checks"])
        if extra.get("fresh"):
            case_entry["fresh"] = extra["fresh"]
        recorded = copy.deepcopy(request)
        for entry in recorded.get("cases", []) + ([recorded["case"]] if "case" in recorded else []):
            entry.pop("fresh", None)
        return recorded

    def _sanitize(self, outcome: CaseOutcome, suite: Suite, current: KernelVersion, case: Case, body: dict,
                  checks) -> None:
        """compute-sanitizer on the kernel's smallest case (once per kernel; the verdicts are cached)."""
        if outcome.correctness is None or not wants_sanitizer(checks, suite, case, body):
            return
        request = version_request(suite, current, [case], output_dir=self.output_dir / "sanitizer")
        problems, notes = sanitize(request, checks.sanitizer,
                                   case_timeout_s=float(getattr(self._client, "timeout_s", DEFAULT_TIMEOUT_S)),
                                   env=getattr(self._client, "env", None), required=self.options.trusted)
        outcome.notes.extend(notes)
        if problems:
            outcome.correctness.problems.extend(problems)
            outcome.correctness.passed = False

    # -- the three measurement paths ------------------------------------------------------------
    def _run(self, outcome, suite, current: KernelVersion, case, timing, out, extra=None, library: bool = False,
             sent: SentAhead | None = None):
        """One run request of ``case`` (``sent``: the one sent ahead, already answered)."""
        if sent is not None and sent.result is not None:
            trip, result = sent.trip, sent.result
            sent.result = None  # a disturbed identical run is run again in turn
        else:
            request = version_request(suite, current, [case], output_dir=out, timing=timing, library=library)
            outcome.requests.append(self._harden(request, request["cases"][0], extra))
            with phases.RoundTrip(outcome, self.client) as trip:
                result = self.client.run(request)
        body = result.cases.get(case.name, {"status": "error", "error": {"kind": "compile", "message": "not run"}})
        if body.get("error", {}).get("kind") == "timeout":  # a run's kernel is this one alone (a compare's is not)
            self._hung.setdefault(self._hang_key(suite, current), case.name)
        trip.answered([result.compile], body)
        outcome.worker_s += body.get("seconds", 0.0)
        return body, result.compile

    def _quiet_run(self, outcome, suite, current: KernelVersion, case, timing, out, extra, library: bool = False,
                   sent: SentAhead | None = None):
        """The timed run of a kernel identical to its approval, repeated while NVML saw the GPU
        disturbed (harmful throttling or another process) around it; the discarded reasons too."""
        discarded: list[str] = []
        while True:
            taken = sent if sent is not None and sent.result is not None else None  # its first attempt only
            before = taken.before if taken is not None else self._device_state()
            body, compile_info = self._run(outcome, suite, current, case, timing, out, extra, library, sent=taken)
            # The worker's snapshot right after the kernel's timed launches, where it has NVML: the
            # library baseline's rounds come after them and are no part of this decision.
            after = (body.get("timing") or {}).get("state") or (taken.after if taken is not None else self._device_state())
            # Each snapshot is judged alone: between items an idle GPU's clock is legitimately low,
            # so a clock change from `before` to `after` says nothing here.
            reasons = sorted(set(disturbances(before, before) + disturbances(after, after)))
            if not reasons or body.get("status") != "ok" or len(discarded) > MAX_DISTURBED_CHUNKS:
                return body, compile_info, discarded
            discarded.append(", ".join(reasons))

    def _device_state(self) -> dict:
        """NVML's view of the worker's GPU from this process (no CUDA context here); {} without NVML."""
        device = self._client.device
        try:
            state = device_state(device.get("ordinal", 0), device.get("pci_bus_id"))
        except Exception:  # telemetry is best effort: without it the run is judged as before
            return {}
        worker = (self._client.hello or {}).get("pid")
        if isinstance(state.get("other_processes"), list):
            state["other_processes"] = [p for p in state["other_processes"] if p.get("pid") != worker]
        return state

    def _identical(self, suite: Suite, approval, case: Case, body: dict, threshold: float) -> LatencyResult:
        baseline = approval.baselines.get(self.fingerprint.key())
        if baseline is None or case.name not in baseline.cases:
            result = incomparable(threshold, "the kernel is identical to the approved version, and no baseline was "
                                             f"recorded on this hardware ({self.fingerprint.key()}){self._nearest(approval)}; "
                                             "a maintainer records one with `cudagate approve` on this runner",
                                  self.fingerprint_text)
            result.advisory = True
            return result
        samples = (body.get("timing") or {}).get("samples_ms") or []
        if not samples:
            return incomparable(threshold, "no timing samples (the case did not run)", self.fingerprint_text)
        return against_runs(baseline.cases[case.name], samples, threshold, suite=display_path(suite.path),
                            kernel=approval.kernel,
                            fingerprint=self.fingerprint_text)

    def _nearest(self, approval) -> str:
        """How this hardware differs from the closest one that has a baseline (empty if none has)."""
        recorded = []
        for baseline in approval.baselines.values():
            try:
                recorded.append(Fingerprint.from_dict(baseline.fingerprint))
            except TypeError:  # a fingerprint missing fields (hand-edited or from an old ledger)
                continue
        if not recorded:
            return ""
        closest = min(recorded, key=lambda other: len(differences(self.fingerprint, other)))
        changed = ", ".join(f"{name} ({shown(name, theirs)} there, {shown(name, ours)} here)"
                            for name, ours, theirs in differences(self.fingerprint, closest))
        return f"; the nearest recorded hardware differs in {changed}" if changed else ""

    def interleaved(self, outcome, suite, case, current: KernelVersion, baseline: KernelVersion, threshold, out,
                    extra=None, which: str = "the approved version", library: bool = False):
        """``current`` timed interleaved against ``baseline`` (``which`` names it in messages);
        ``library``: its library baseline too, after the rounds that decide (the PR comparison only)."""
        request = compare_request(suite, case, current=current, baseline=baseline, output_dir=out,
                                  chunk=suite.timing.repeat, library=library)
        outcome.requests.append(self._harden(request, request["case"], extra))
        sampler = AdaptiveSampler(threshold, self.options.budget_s, rounds=suite.timing.repeat)
        with phases.RoundTrip(outcome, self.client) as trip:
            result = self.client.compare(request, phases.clocked(outcome, "statistics", sampler.decide))
        trip.answered(list(result.compile.values()), result.body or {})
        outcome.worker_s += (result.body or {}).get("seconds", 0.0)
        compile_info = result.compile.get("current") or {"ok": False, "log": "not compiled"}
        approved_compile = result.compile.get("approved")
        body = result.body or {"status": "error", "error": {"kind": "crash", "message": "no answer"}}
        if approved_compile is not None and not approved_compile.get("ok"):
            return body, compile_info, incomparable(threshold, f"{which} no longer compiles here:\n"
                                                    + approved_compile.get("log", ""), self.fingerprint_text)
        if body.get("status") != "ok":
            return body, compile_info, None
        resolved = suite.resolved(case)
        with phases.clock(outcome, "checks"):
            approved_check = judge_case(f"{current.name} ({which})", case.name,
                                        {"status": "ok", **body["approved"]}, resolved.expected_outputs(),
                                        suite.tolerance, resolved.shapes, checks=(extra or {}).get("checks"))
        if not approved_check.passed:
            return body, compile_info, incomparable(threshold, f"{which} fails this case now, so its "
                                                    "latency means nothing: " + approved_check.describe(), self.fingerprint_text)
        with phases.clock(outcome, "statistics"):
            return body, compile_info, sampler.result(self.fingerprint_text)

    # -- release mode (docs/release-gate.md) ----------------------------------------------------
    def _against_release(self, outcome, suite, current: KernelVersion, case, approval, threshold, out, extra, *,
                         proposal: bool) -> LatencyResult:
        """Current against the version approved at the release ref, timed as the PR gate times
        current against approved. When nothing differs from the release (the kernel is byte-identical
        to it, or the approved version is the released one and was just timed), nothing more is timed."""
        from pytest_cudagate.approvals.release import AbsentAtRef, BuildRecord, NoReleaseYet, build_drift  # release mode only

        try:
            released = self.release.lookup(suite, current.name)
        except CudagateError as exc:
            # The kernel's `release` item says it too, and fails unless this is a first release; a case
            # warns of a release it could not use (an item deselected by -k must not hide that).
            result = incomparable(threshold, str(exc), self.fingerprint_text)
            result.advisory = True
            result.said_by_kernel = isinstance(exc, NoReleaseYet)
            return result
        if isinstance(released, AbsentAtRef):
            result = incomparable(threshold, released.describe() + "; judged by the PR gate only", self.fingerprint_text)
            result.advisory = result.said_by_kernel = True
            return result
        built = build_record(current, self._arch())
        drift = (build_drift(released.build, BuildRecord.from_json(built)).describe(released.label)
                 if built is not None else "")
        label = released.label
        if not proposal and released.identity() == current.identity:
            return LatencyResult(Latency.PASS, threshold, reason=f"identical to the version approved at {label} "
                                 "(source, headers, entry, options and launch): nothing to time side by side",
                                 note=drift, fingerprint=self.fingerprint_text)
        latency = outcome.latency
        if (approval is not None and released.identity() == approval.identity() and latency.estimate is not None
                and latency.run_spread is None):
            # The approved version is the released one: the comparison just made is the release's.
            return dataclasses.replace(latency, reason=label, samples={}, telemetry=[], release=None, note="; ".join(
                filter(None, [f"the approved version is the one approved at {label}: one comparison serves both", drift])))
        _, _, result = self.interleaved(outcome, suite, case, current, released.version, threshold, out, extra,
                                        which=f"the version approved at {label}")
        if result is None:
            return incomparable(threshold, f"the comparison with {label} did not complete", self.fingerprint_text)
        if result.estimate is not None:
            result.reason = label
        elif result.verdict is Latency.INCOMPARABLE:
            result.advisory = True  # the release's version cannot run this case now: nothing to fix but the ref
        result.note = drift
        return result

    def _arch(self) -> str:
        device = getattr(self._client, "device", None) or {}
        return device.get("arch") or DEFAULT_ARCH


def decide(outcome: CaseOutcome, options: GateOptions) -> None:
    """Whether a judged outcome fails, warns or passes under ``options``, and the words for it."""
    parts = []
    if not outcome.correctness.passed:
        outcome.failed = True
        parts.append(outcome.correctness.describe())
    latency = outcome.latency
    if latency is not None and outcome.correctness.passed:
        judged = [latency] + ([latency.release] if latency.release is not None else [])
        if any(blocks(r, strict=options.strict, release=options.release) for r in judged):
            outcome.failed = True
            parts.append(latency.describe())
        elif any(warns(r) for r in judged):
            outcome.warning = latency.describe()
    if outcome.notes:  # relaxed or skipped checks are said with every outcome, never silently
        said = "\n".join(f"note: {note}" for note in dict.fromkeys(outcome.notes))
        if outcome.failed:
            parts.append(said)
        else:
            outcome.warning = f"{outcome.warning}\n{said}" if outcome.warning else said
    outcome.message = "\n".join(parts)
