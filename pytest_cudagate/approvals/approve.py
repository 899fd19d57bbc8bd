"""``cudagate approve``: record working-tree kernels as approved, with baselines measured here.

A kernel is approved only if the gate passes it. One approval run (:func:`approval_run`) is a fresh
worker under the GPU's lock and one pass of :meth:`Gate.baseline` over the kernel's cases: the
checks of ``pytest --cuda-gate`` (fresh inputs, guard zones, the sanitizer, ...), its refusals in
its words, and each performance case's timed samples for the baseline. ``--runs N`` makes N such
independent runs (fresh worker, fresh allocations, own warm-up) and stores each one's level (10th percentile) per
case: the spread a stored baseline is judged by (docs/release-gate.md).
"""

from __future__ import annotations

import getpass
import os
import tempfile
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from pytest_cudagate import __version__
from pytest_cudagate.trust.approvals import Baseline, Ledger, approval_for, build_identity, git_state
from pytest_cudagate.config import GateConfig
from pytest_cudagate.gate import Gate, GateOptions, case_data_problem
from pytest_cudagate.judge.outcome import CaseOutcome, Failure
from pytest_cudagate.judge.stats import DEFAULT_APPROVAL_RUNS, run_level, summarize
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.session import open_worker
from pytest_cudagate.suite.model import Program, Suite
from pytest_cudagate.trust import SIGNING_KEY_ENV, load_private_key
from pytest_cudagate.trust.ledger import sign_ledger
from pytest_cudagate.worker.build import build_record
from pytest_cudagate.worker.requests import current_version
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.boundary.wire import to_json


@dataclass
class ApprovalRun:
    """One gate pass over a kernel's cases on one fresh worker."""

    kernel: str
    fingerprint: Fingerprint
    arch: str
    outcomes: list[CaseOutcome]

    def refusals(self) -> list[str]:
        """Why the gate fails the kernel, in its words: one entry per distinct reason, naming its cases."""
        reasons: dict[str, list[str]] = {}
        for outcome in self.outcomes:
            if outcome.failed:
                reasons.setdefault(outcome.message, []).append(outcome.case)
        return [f"{', '.join(cases)}: {message}" for message, cases in reasons.items()]

    def warnings(self) -> list[str]:
        return [f"{o.case}: {o.warning}" for o in self.outcomes if o.warning and not o.failed]

    def samples(self) -> dict[str, list[float]]:
        """Timed samples (ms) per performance case."""
        return {o.case: list(o.correctness.samples_ms) for o in self.outcomes
                if o.kind == "performance" and o.correctness is not None and o.correctness.samples_ms}


def approval_run(suite: Suite, program: Program, config: GateConfig, output_dir: Path) -> ApprovalRun:
    """Start a worker (GPU lock held), pass ``program`` through the gate on every case, stop the worker."""
    options = GateOptions(strict=config.strict, threshold=config.threshold, fresh_seed=config.fresh_seed)
    with open_worker(timeout_s=config.timeout_s, lock_timeout_s=config.lock_timeout_s) as worker:
        gate = Gate(worker.client, worker.fingerprint, options, output_dir)
        outcomes = []
        for case in (c for c in suite.cases if program.runs(c)):  # a case its `requires` exclude has no baseline
            problem = case_data_problem(suite, case)
            if problem:
                outcomes.append(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True, message=problem,
                                            failure=Failure.CASE_DATA))
            else:
                outcomes.append(gate.baseline(suite, program, case))
        arch = worker.client.device["arch"]
    return ApprovalRun(program.name, worker.fingerprint, arch, outcomes)


def approve(suite: Suite, kernels: list[Program], config: GateConfig, *, approved_by: str | None = None,
            key_file: str | None = None, runs: int = DEFAULT_APPROVAL_RUNS, pull_request: int | None = None,
            out: TextIO) -> bool:
    """Approve each kernel the gate passes in every one of ``runs`` independent runs and record its
    baseline; write the ledger, signed (for ``pull_request`` where given) when a key is given. False if
    any was refused."""
    ledger = Ledger.for_suite(suite)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    who = approved_by or user_name(suite.root)
    refused = False
    with tempfile.TemporaryDirectory(prefix="cudagate-approve-") as work:
        for program in kernels:
            measured: list[ApprovalRun] = []
            for number in range(runs):
                run = approval_run(suite.instance_of(program.name), program, config, Path(work) / program.name / str(number))
                if number == 0:
                    print(f"measuring on {run.fingerprint.key()}: {run.fingerprint.describe()}", file=out)
                for warning in run.warnings():
                    print(f"{program.name}: warning: {warning}", file=out)
                measured.append(run)
                if run.refusals():  # one failing run refuses the kernel: no need to measure the rest
                    break
            refusals = measured[-1].refusals()
            if refusals:
                refused = True
                print(f"{program.name}: NOT approved; it fails the gate:\n" + textwrap.indent("\n".join(refusals), "  "),
                      file=out)
                continue
            print(f"{program.name}: {record(ledger, suite.instance_of(program.name), program, measured, who, now)}",
                  file=out)
    key = load_private_key(key_file) if (key_file or os.environ.get(SIGNING_KEY_ENV)) else None
    if key is not None:
        sign_ledger(ledger, key, who, pull_request)
    ledger.save()
    print(f"wrote {display_path(ledger.path)}" + ("" if key else "; its entries are unsigned until a maintainer "
                                                  f"reviews them and runs `{command('cudagate', 'sign', suite.path)}`"),
          file=out)
    return not refused


def record(ledger: Ledger, suite: Suite, program: Program, runs: list[ApprovalRun], who: str, now: str) -> str:
    """Approve ``program`` in ``ledger`` (a changed build replaces the entry; the old one goes to
    history) and store its baseline on this hardware: each run's level (10th percentile) per case, and the first
    run's launches for the plots; say what was done."""
    current = ledger.approvals.get(program.name)
    if current is None or current.identity() != build_identity(program):
        if current is not None:
            ledger.history.append({**current.signed_payload(), "baselines": sorted(current.baselines)})
        current = approval_for(ledger, program, approved_by=who, approved_at=now, git=git_state(suite.root),
                               tool_version=__version__)
        ledger.approvals[program.name] = current
        what = f"approved {current.source_sha256[:12]}"
    else:
        what = f"already approved ({current.source_sha256[:12]}); baseline recorded"
    first = runs[0]
    current.build = build_record(current_version(program), first.arch)
    cases = {name: {"summary": to_json(summarize(samples)), "samples_ms": samples, "cache": suite.timing.cache,
                    "run_p10_ms": [run_level(run.samples()[name]) for run in runs]}
             for name, samples in first.samples().items()}
    current.baselines[first.fingerprint.key()] = Baseline(first.fingerprint.to_dict(), now, cases)
    levels = ", ".join(f"{c} {_spread(v['run_p10_ms'])}" for c, v in cases.items())
    return f"{what} by {who}; baseline of {len(runs)} run(s), 10th percentiles: {levels}"


def _spread(levels: list[float]) -> str:
    low, high = min(levels), max(levels)
    return f"{low * 1000:.2f} µs" if len(levels) == 1 else f"{low * 1000:.2f}–{high * 1000:.2f} µs"


def user_name(root: Path) -> str:
    import git  # gitpython (~35 ms): only where a name is read from git

    try:
        return git.Repo(root, search_parent_directories=True, expand_vars=False).config_reader().get_value("user", "name")
    except Exception:  # no repository or no user.name configured
        return getpass.getuser()
