"""The optimisation loop: at most N rounds of propose → check → compile → run → time, then the gate.

Round 0 evaluates the initial kernel (the suite's kernel as shipped): its medians are the scale
every later latency is expressed on. Each round the proposer returns one candidate (a model) or
a batch (autotune). A candidate passes, in order: the static checks (entry, includes, launch
expressions and limits on the visible cases), the host compile, every visible correctness case,
then every visible performance case, timed interleaved with the initial kernel. A static or
compile failure goes back to a proposer that can repair it, inside the round, at most
``max_repairs`` times. Candidates are ranked by the geometric mean of their performance-case
latencies; after the search, the fastest candidate that beats the initial kernel must pass the full
gate (:meth:`HarnessEvaluator.validate`: all cases, holdout included, against the approved kernel).
One that fails is reported as rejected, with the reason, and the next fastest is gated, up to
``validate_top`` candidates. Every attempt is written to the audit pack as soon as it is judged,
so an interrupted run (Ctrl-C) leaves a consistent pack behind.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pytest_cudagate.optimize.budgets import STOP_REASONS, Budgets, BudgetExceeded, Meter
from pytest_cudagate.optimize.candidate import Candidate, static_problems
from pytest_cudagate.optimize.evaluator import Evaluation, Validation
from pytest_cudagate.optimize.proposers import ModelError, ProposalError, ProposerExhausted, RoundContext


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Attempt:
    index: int  # 0: the initial kernel
    round: int
    candidate: Candidate | None  # None: the proposer's answer held no usable candidate
    stage: str  # proposal / duplicate / static / compile / correctness / performance / done / skipped
    passed: bool = False
    repair: int = 0  # 0: the round's first answer; n: its n-th repair
    compile: dict | None = None
    evaluation: Evaluation | None = None
    rejection: str | None = None
    rejection_for_model: str | None = None
    anchored: dict[str, float] = field(default_factory=dict)  # case -> ms on the round-0 scale
    geomean_ms: float | None = None
    speedup: float | None = None  # geomean of the initial / this (round-0 scale); > 1 is faster
    nsight: dict | None = None
    model_calls: list[str] = field(default_factory=list)
    validation: Validation | None = None
    started_at: str = ""
    seconds: float = 0.0


def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


class Optimizer:
    def __init__(self, *, suite, program, evaluator, proposer, pack, meter: Meter, progress, budgets: Budgets,
                 use_nsight: bool = False, validate_top: int = 3, settings: dict | None = None):
        self.suite, self.program = suite, program
        self.evaluator, self.proposer, self.pack = evaluator, proposer, pack
        self.meter, self.progress, self.budgets = meter, progress, budgets
        self.use_nsight = use_nsight
        self.validate_top = max(1, validate_top)
        self.settings = settings or {}
        self.visible = [c for c in suite.cases if not c.holdout and program.runs(c)]  # its `requires` leave the rest out
        self.perf = [c.name for c in self.visible if c.kind == "performance"]
        self.attempts: list[Attempt] = []
        self.base: dict[str, float] = {}  # round-0 medians of the initial kernel, per performance case
        self.best: Attempt | None = None
        self.winner: Attempt | None = None
        self.rejected: list[Attempt] = []  # gated and failed
        self.stop_reason: str | None = None
        self.stop_detail = ""
        self.outcome = "running"
        self.rounds_run = 0
        self.started_at = now()
        self.ended_at: str | None = None
        self._seen: dict[str, int] = {}
        self._pending_calls: list[str] = []
        self.validation_note = ""

    # -- the audit pack hooks ----------------------------------------------------------------------
    def call_recorded(self, name: str) -> None:
        self._pending_calls.append(name)

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict:
        self.pack.begin(self)
        try:
            self._search()
            if self.stop_reason not in ("interrupted", "initial_failed"):
                self._validate()
        except KeyboardInterrupt:
            self._stop("interrupted")
            self.validation_note = self.validation_note or "interrupted before the winner was gated"
        finally:
            self.ended_at = now()
            if self.outcome == "running":
                self.outcome = self._outcome()
            try:
                self.proposer.close()
            except Exception:  # closing a connection must not lose the pack
                pass
        return self.pack.finish(self)

    def _outcome(self) -> str:
        if self.stop_reason == "initial_failed":
            return "initial_failed"
        if self.winner is not None:
            return "winner"
        if self.rejected:
            return "rejected"
        if self._ranked():
            return "not_validated"
        return "no_improvement"

    def _stop(self, reason: str, detail: str = "") -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_detail = detail or STOP_REASONS[reason]
            self.progress.note(f"stopping: {self.stop_detail}")

    def _search(self) -> None:
        self.progress.stage(0, self.budgets.max_iterations, "evaluating the initial kernel")
        initial = self._try(0, Candidate.initial(self.program), 0, None)
        if not initial.passed:
            self._stop("initial_failed", "the initial kernel fails its own cases: " + (initial.rejection or "")[:2000])
            return
        self.meter.reserve_s = self.evaluator.validation_reserve_s()
        try:
            try:
                for number in range(1, self.budgets.max_iterations + 1):
                    self.meter.check_time()
                    self._round(number)
                reason = ("max_iterations", "")
            except ProposerExhausted as exc:
                reason = ("proposer_exhausted", str(exc) or STOP_REASONS["proposer_exhausted"])
            self._compose()
            self._stop(*reason)
        except BudgetExceeded as exc:
            self._stop(exc.reason, exc.detail)
        except ModelError as exc:
            self._stop("model_error", str(exc))

    def _compose(self) -> None:
        """A proposer that searched shape classes separately (autotune) may offer one more candidate
        after its rounds: one source with per-class variants. It is timed like any other, in the
        last round, and wins only if it is faster as it would ship."""
        compose = getattr(self.proposer, "compose", None)  # optional: see proposers.Proposer
        candidate = compose(list(self.attempts)) if compose is not None else None
        if candidate is not None:
            self.meter.check_time()
            self._try(self.rounds_run, candidate, 0, None)

    def _round(self, number: int) -> None:
        context = RoundContext(number, self.budgets.max_iterations, self.attempts[0], self.best, list(self.attempts))
        repairs = 0
        while True:
            self.progress.stage(number, self.budgets.max_iterations,
                                f"asking {self.proposer.name}" + (f" (repair {repairs})" if repairs else ""), self.best)
            try:
                candidates = self.proposer.propose(context)
                self.rounds_run = number
            except ProposalError as exc:
                self.rounds_run = number
                self._record(Attempt(len(self.attempts), number, None, "proposal", repair=repairs, started_at=now(),
                                     rejection=f"unusable answer: {exc.reason}", rejection_for_model=exc.reason))
                if not self.proposer.supports_repair or repairs >= self.budgets.max_repairs:
                    return
                repairs += 1
                context.problem, context.repairs = exc.reason, repairs
                continue
            compiled = self._compile_all(candidates)
            problem = None
            for candidate, result in zip(candidates, compiled):
                attempt = self._try(number, candidate, repairs, result)
                if attempt.stage in ("static", "compile"):
                    problem = attempt.rejection_for_model
            if (problem and len(candidates) == 1 and self.proposer.supports_repair
                    and repairs < self.budgets.max_repairs):
                repairs += 1
                context.problem, context.repairs = problem, repairs
                context.history = list(self.attempts)
                continue
            return

    def _compile_all(self, candidates: list[Candidate]) -> list[dict | None]:
        """Host compiles of a batch in parallel (NVRTC releases the GIL); None where a static check fails."""
        ok = [c for c in candidates if not static_problems(c, self.suite, self.program, self.visible,
                                                           own_source=c.is_own_source(self.program))]
        if len(ok) <= 1:
            return [None] * len(candidates)
        self.progress.stage(self.rounds_run, self.budgets.max_iterations, f"compiling {len(ok)} candidates", self.best)
        with ThreadPoolExecutor(max_workers=max(1, min(len(ok), os.cpu_count() or 1))) as pool:
            results = dict(zip([id(c) for c in ok], pool.map(self.evaluator.compile, ok)))
        return [results.get(id(c)) for c in candidates]

    def _try(self, number: int, candidate: Candidate, repair: int, compiled: dict | None) -> Attempt:
        attempt = Attempt(len(self.attempts), number, candidate, "static", repair=repair, started_at=now())
        start = time.monotonic()
        try:
            self._judge(attempt, compiled)
        except KeyboardInterrupt:
            attempt.passed = False
            attempt.rejection = attempt.rejection or f"interrupted (Ctrl-C) at the {attempt.stage} stage"
            raise
        finally:
            attempt.seconds = round(time.monotonic() - start, 3)
            if not any(a is attempt for a in self.attempts):
                self._record(attempt)
        return attempt

    def _judge(self, attempt: Attempt, compiled: dict | None) -> None:
        candidate = attempt.candidate
        key = candidate.key()
        if key in self._seen:
            attempt.stage = "duplicate"
            attempt.rejection = attempt.rejection_for_model = (f"identical to attempt {self._seen[key]} (same source "
                                                               "and launch): not measured again")
            return
        problems = static_problems(candidate, self.suite, self.program, self.visible,
                                   own_source=candidate.is_own_source(self.program))
        if problems:
            attempt.rejection = attempt.rejection_for_model = "\n".join(problems)
            return
        self._seen[key] = attempt.index
        attempt.stage = "compile"
        self.progress.stage(attempt.round, self.budgets.max_iterations, f"compiling {candidate.label or 'candidate'}",
                            self.best)
        attempt.compile = compiled or self.evaluator.compile(candidate)
        if not attempt.compile.get("ok"):
            attempt.rejection = attempt.rejection_for_model = "compile error:\n" + (attempt.compile.get("log") or "")
            return
        try:
            self.meter.check_time()
        except BudgetExceeded:
            attempt.stage = "skipped"
            attempt.rejection = "not measured: the budget ran out first"
            raise
        self.progress.stage(attempt.round, self.budgets.max_iterations,
                            f"running {candidate.label or 'candidate'} on {len(self.visible)} cases", self.best)
        evaluation = self.evaluator.evaluate(candidate)
        self.meter.add_gpu(evaluation.gpu_s)
        attempt.evaluation = evaluation
        attempt.stage = evaluation.stage
        attempt.passed = evaluation.passed
        attempt.rejection, attempt.rejection_for_model = evaluation.rejection, evaluation.rejection_for_model
        if evaluation.compile and not attempt.compile.get("resources"):
            attempt.compile = evaluation.compile
        if not evaluation.passed:
            return
        self._score(attempt)
        if self.use_nsight and attempt.round >= 0:
            self.progress.stage(attempt.round, self.budgets.max_iterations, "Nsight Compute", self.best)
            attempt.nsight = self.evaluator.profile(candidate)
            self.meter.add_gpu(float(attempt.nsight.get("seconds") or 0.0))

    def _score(self, attempt: Attempt) -> None:
        cases = {c.case: c for c in attempt.evaluation.cases}
        if attempt.index == 0:
            self.base = {name: (cases[name].initial_ms or cases[name].latency_ms) for name in self.perf if name in cases}
        for name in self.perf:
            result = cases.get(name)
            if result is None or result.latency_ms is None:
                continue
            ratio = (result.ratio or {}).get("ratio")
            base = self.base.get(name)
            attempt.anchored[name] = ratio * base if ratio and base else result.latency_ms
        attempt.geomean_ms = geomean(attempt.anchored.values())
        base_mean = geomean(self.base.values())
        attempt.speedup = base_mean / attempt.geomean_ms if base_mean and attempt.geomean_ms else None
        if attempt.geomean_ms and (self.best is None or attempt.geomean_ms < self.best.geomean_ms):
            self.best = attempt

    def _record(self, attempt: Attempt, rejection: str | None = None) -> None:
        if rejection:
            attempt.rejection = rejection
        attempt.model_calls, self._pending_calls = self._pending_calls, []
        if not any(a is attempt for a in self.attempts):
            self.attempts.append(attempt)
        self.pack.attempt(self, attempt)
        self.progress.attempt(attempt, self.best)

    # -- the gate ----------------------------------------------------------------------------------
    def _ranked(self) -> list[Attempt]:
        seen, ranked = set(), []
        for a in sorted((a for a in self.attempts if a.round >= 1 and a.passed and a.speedup and a.speedup > 1.0),
                        key=lambda a: a.geomean_ms):
            key = a.candidate.key()
            if key not in seen:
                seen.add(key)
                ranked.append(a)
        return ranked

    def _validate(self) -> None:
        ranked = self._ranked()
        if not ranked:
            self.validation_note = "no candidate was faster than the initial kernel: nothing to gate"
            return
        self.meter.reserve_s = 0.0
        for position, attempt in enumerate(ranked[:self.validate_top]):
            if position:
                try:
                    self.meter.check_time()
                except BudgetExceeded as exc:
                    self.validation_note = f"stopped gating after {position} candidate(s): {exc.detail}"
                    return
            self.progress.stage(self.rounds_run, self.budgets.max_iterations,
                                f"gating attempt {attempt.index} ({attempt.speedup:.2f}×) against the approved kernel "
                                "on every case, holdout included", self.best)
            validation = self.evaluator.validate(attempt.candidate)
            self.meter.add_gpu(validation.gpu_s)
            attempt.validation = validation
            self.pack.attempt(self, attempt)
            self.progress.validated(attempt, validation)
            if validation.passed:
                self.winner = attempt
                return
            self.rejected.append(attempt)
        self.validation_note = (f"the {min(len(ranked), self.validate_top)} fastest candidate(s) failed the gate"
                                + (f"; {len(ranked) - self.validate_top} more were not gated (--validate-top "
                                   f"{self.validate_top})" if len(ranked) > self.validate_top else ""))
