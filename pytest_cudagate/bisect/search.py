"""``cudagate bisect GOOD BAD SUITE [KERNEL] [--case NAME]``: the first commit from GOOD to BAD at which a
case is slower than at GOOD beyond the threshold.

The kernel at each commit is its approved version there, read from git objects and verified as the
release gate reads a release (:mod:`pytest_cudagate.bisect.history`); only commits that change it are
candidates. Every candidate is timed interleaved against GOOD's version in one worker
(:mod:`pytest_cudagate.bisect.compare`). BAD is timed first: when it is not slower than GOOD beyond
the threshold, no commit regresses. Otherwise a binary search finds the first candidate that is, so
``n`` candidates take at most ceil(log2 n) + 1 comparisons. Its own step, from the candidate before
it, is that candidate's ratio over the one before's (both against GOOD): a step beyond the threshold,
or a version before it that is within a quarter of the threshold of GOOD, names the commit;
otherwise the slowdown is spread over several commits (creep), and every candidate up to the first
one beyond the threshold is then timed so that each commit's share is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pytest_cudagate.commands import COMMANDS
from pytest_cudagate import __version__

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary.options import BUDGET_S, LOCK_TIMEOUT_S, NAME, PATH, TIMEOUT_S, finite, nonempty
from pytest_cudagate.bisect.compare import Bench, Comparison, ratio_text, step_estimate
from pytest_cudagate.bisect.history import KernelHistory, Version, kernel_history
from pytest_cudagate.config import DEFAULT_BUDGET_S, DEFAULT_LOCK_TIMEOUT_S, LOCK_TIMEOUT_HELP, project_config, resolve
from pytest_cudagate.errors import EXIT_FAILED, CudagateError
from pytest_cudagate.gate import Gate, GateOptions, case_data_problem
from pytest_cudagate.judge import stats
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.session import open_worker
from pytest_cudagate.defences.expected import materialise
from pytest_cudagate.suite.loader import SUITE_FILENAME, load_suite
from pytest_cudagate.suite.model import Case, Program, Suite
from pytest_cudagate.trust import gate_problems
from pytest_cudagate.trust.base_ref import TrustRoot, read_trust_root
from pytest_cudagate.trust.gate_command import checkout_root, without_checkout
from pytest_cudagate.boundary.wire import to_json


@dataclass(frozen=True)
class Step:
    """One candidate's change from the version before it (creep: which commits contribute)."""

    version: Version
    estimate: stats.RatioEstimate
    contributes: bool  # slower by more than the gate's resolution (a quarter of the threshold)


@dataclass(frozen=True)
class Finding:
    """What the search found: ``commit`` (one commit crosses the threshold by itself), ``creep``
    (several do together) or ``none`` (BAD is not slower than GOOD beyond it)."""

    kind: str
    total: Comparison  # the first candidate beyond the threshold against GOOD, or BAD against GOOD for none
    # that candidate against the one before it (None where that one is GOOD: ``total`` is its step)
    step: stats.RatioEstimate | None = None
    steps: tuple[Step, ...] = ()  # creep: every candidate up to the first beyond the threshold


class Unjudged(Exception):
    """A comparison without an interval to act on (a version that does not compile or fails the
    case, a disturbed GPU): the search cannot go on."""

    def __init__(self, comparison: Comparison):
        super().__init__(comparison.describe())
        self.comparison = comparison


def search(history: KernelHistory, compare: Callable[[Version, Version], Comparison], threshold: float) -> Finding:
    """The first candidate slower than GOOD beyond ``threshold``, timing as few as the binary search needs.

    A version is beyond it when its ratio's estimate is: a step the size of the threshold lies
    within the gate's resolution (a quarter of it), where the interval alone would call the same
    version ``regressed`` in one comparison and ``inconclusive`` in the next and send the search the
    wrong way; the verdict, with its interval, is said with every comparison and with the finding."""
    versions = (history.good, *history.candidates)
    against_good: dict[int, Comparison] = {}

    def judged(index: int) -> stats.RatioEstimate:
        if index not in against_good:
            comparison = compare(history.good, versions[index])
            if not comparison.judged:
                raise Unjudged(comparison)
            against_good[index] = comparison
        return against_good[index].result.estimate

    def beyond(index: int) -> bool:
        return judged(index).ratio > 1 + threshold

    def step(index: int) -> stats.RatioEstimate:
        return judged(index) if index == 1 else step_estimate(judged(index), judged(index - 1))

    last = len(history.candidates)
    if not beyond(last):
        return Finding("none", against_good[last])
    good, bad = 0, last  # versions[good] is within the threshold (GOOD itself at first), versions[bad] beyond
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (good, middle) if beyond(middle) else (middle, bad)
    own, resolution = step(bad), 1 + threshold / 4
    # One commit, where its own step crosses the threshold or nothing measurable came before it (the
    # version before it within the gate's resolution of GOOD): its step, a quotient of two estimates,
    # carries both their errors. Always so for the first candidate: its comparison with GOOD is its step.
    if own.ratio > 1 + threshold or bad == 1 or judged(bad - 1).ratio <= resolution:
        return Finding("commit", against_good[bad], own if bad > 1 else None)
    steps = tuple(Step(versions[i], change, change.ratio > resolution)
                  for i, change in ((i, step(i)) for i in range(1, bad + 1)))
    return Finding("creep", against_good[bad], own, steps)


# --------------------------------------------------------------------------- the command


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.trusted_ref is None:
        return _bisect(args, None)
    # As `cudagate gate --trusted-ref`: the keys and [tool.cudagate] of that commit, read from git objects, and
    # no folder of the working tree on sys.path, PATH or PYTHONPATH.
    worktree = checkout_root(args.repo or _suite_file(args.suite).parent)
    with without_checkout(worktree):
        return _bisect(args, read_trust_root(worktree, args.trusted_ref))


def _bisect(args: argparse.Namespace, root: TrustRoot | None) -> int:
    suite = _suite(args.suite)
    name = args.kernel or _only_kernel(suite).name
    suite = suite.instance_of(name)  # an instantiated suite: one instantiation is bisected at a time
    program = suite.kernel(name)
    case = _case(suite, program, args.case)
    threshold = _threshold(args.threshold, suite)
    problems = gate_problems(suite, None, None, trust_root=root)
    if problems:
        raise CudagateError(f"{display_path(suite.path)}: its cases cannot be trusted to judge anything: "
                            + "; ".join(dict.fromkeys([problems[0], problems[-1]])))  # the first problem, the fix
    problem = case_data_problem(suite, case)
    if problem:
        raise CudagateError(f"{display_path(suite.path)}: case {case.name}: "
                            + "; ".join(line.strip(" -") for line in problem.splitlines()))
    repo = Path(args.repo) if args.repo else suite.root
    history = kernel_history(repo, args.good, args.bad, suite, program.name, root)
    print(f"bisect {program.name} · {case.name} (suite {suite.name}) from GOOD {_named(args.good, history.good.commit)} "
          f"to BAD {_named(args.bad, history.bad)}, threshold ±{_percent(threshold)}: {history.commits} commit(s), "
          f"{len(history.candidates)} change the kernel's approved version ({history.skipped} skipped without GPU time)")
    given = {"timeout_s": args.timeout, "lock_timeout_s": args.lock_timeout}
    config = resolve(root.settings(), **given) if root is not None else project_config(suite, **given)
    with tempfile.TemporaryDirectory(prefix="cudagate-bisect-") as work, \
            open_worker(timeout_s=config.timeout_s, lock_timeout_s=config.lock_timeout_s) as worker:
        gate = Gate(worker.client, worker.fingerprint, GateOptions(budget_s=args.budget, threshold=threshold), Path(work))
        if case.generated:
            materialise(suite, case, client=worker.client, root=Path(work) / "generated")
        bench = Bench(gate, suite, program, case, threshold, Path(work))

        def compare(reference: Version, version: Version) -> Comparison:
            done = bench.compare(reference, version)
            print(f"  {len(bench.done)}. {done.describe()}", flush=True)
            return done

        try:
            finding, stopped = search(history, compare, threshold), None
        except Unjudged as exc:
            finding, stopped = None, exc.comparison
        fingerprint = gate.fingerprint_text
    lines = _stopped(stopped) if stopped else _said(finding, history, threshold)
    worker_s = sum(c.worker_s for c in bench.done)
    lines.append(f"{len(bench.done)} comparison(s), {worker_s:.1f} s of worker time, on {fingerprint}")
    print("\n".join(lines))
    if args.json:
        _write_json(Path(args.json), _document(args, suite, program.name, case, threshold, history, bench.done,
                                               finding, stopped, fingerprint))
        print(f"wrote {display_path(args.json)}")
    return EXIT_FAILED if stopped else 0


def _suite_file(given: str) -> Path:
    path = Path(given)
    path = path / SUITE_FILENAME if path.is_dir() else path
    if not path.is_file():
        raise CudagateError(f"{given}: no suite there (no {SUITE_FILENAME}); pass a suite file or the folder holding it")
    return path


def _suite(given: str) -> Suite:
    return load_suite(_suite_file(given))


def _only_kernel(suite: Suite):
    kernels = suite.all_kernels  # an instantiated suite's: one per instantiation
    if len(kernels) != 1:
        raise CudagateError(f"{display_path(suite.path)}: suite {suite.name!r} has {len(kernels)} kernels "
                            f"({', '.join(k.name for k in kernels)}): name one as KERNEL")
    return kernels[0]


def _case(suite: Suite, program: Program, name: str | None) -> Case:
    """The performance case to time: ``name``, else the first; one ``program``'s ``requires`` meet."""
    timed = [c for c in suite.cases if c.kind == "performance" and program.runs(c)]
    choices = f"its performance cases: {', '.join(c.name for c in timed) or 'none'}"
    if name is None:
        if not timed:
            raise CudagateError(f"{display_path(suite.path)}: suite {suite.name!r} has no performance case "
                                f"{program.name} runs, to time")
        return timed[0]
    case = next((c for c in suite.cases if c.name == name), None)
    if case is None or case.kind != "performance":
        what = "no case" if case is None else "a correctness case, not a timed one,"
        raise CudagateError(f"{display_path(suite.path)}: --case {name!r}: suite {suite.name!r} has {what} of that name; "
                            f"{choices}")
    if not program.runs(case):
        raise CudagateError(f"{display_path(suite.path)}: --case {name!r}: {program.skip_reason(case)}; {choices}")
    return case


def _threshold(percent: float | None, suite: Suite) -> float:
    return suite.threshold if percent is None else percent / 100


def _named(ref: str, sha: str) -> str:
    """``v1.2 (1a2b3c4d5e6f)``, or the short sha alone where the ref is (a prefix of) it."""
    return sha[:12] if sha.startswith(ref.lower()) else f"{ref} ({sha[:12]})"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _said(finding: Finding, history: KernelHistory, threshold: float) -> list[str]:
    total, good = finding.total, f"GOOD {history.good.short}"
    estimate = total.result.estimate
    if finding.kind == "none":
        return [f"no commit regresses: BAD {history.bad[:12]} is {ratio_text(estimate, good)}: "
                f"{total.result.verdict.value} at ±{_percent(threshold)}"]
    first = total.version
    if finding.kind == "commit":
        lines = [f"first regressing commit: {first.short} {first.subject!r}",
                 f"  {ratio_text(estimate, good)}: {total.result.verdict.value} at ±{_percent(threshold)}"]
        if finding.step is not None:
            lines.append(f"  its own step: {ratio_text(finding.step, 'the version before it', approximate=True)}")
        return lines
    lines = [f"spread over several commits (creep): no single step exceeds ±{_percent(threshold)}, but from "
             f"{first.short} {first.subject!r} on the kernel is {ratio_text(estimate, good)}: "
             f"{total.result.verdict.value}",
             "  each commit's step from the version before it:"]
    lines += [f"  {'*' if s.contributes else ' '} {s.version.short} {s.version.subject!r}: "
              f"{ratio_text(s.estimate, approximate=number > 0)}" for number, s in enumerate(finding.steps)]
    lines.append(f"  * contributes: slower by more than {_percent(threshold / 4)} (a quarter of the threshold)")
    return lines


def _stopped(comparison: Comparison) -> list[str]:
    return [f"stopped: comparison {comparison.describe()}",
            "  the search needs an interval for every version it times; fix the version or the runner and run again"]


def _document(args, suite: Suite, kernel: str, case: Case, threshold: float, history: KernelHistory,
              done: list[Comparison], finding: Finding | None, stopped: Comparison | None, fingerprint: str) -> dict:
    first = finding.total.version if finding is not None and finding.kind != "none" else None
    return {
        "tool_version": __version__, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite": display_path(suite.path), "kernel": kernel, "case": case.name, "threshold": threshold,
        "good": {"ref": args.good, **history.good.to_json()}, "bad": {"ref": args.bad, "commit": history.bad},
        "commits": history.commits, "candidates": [v.to_json() for v in history.candidates],
        "verdict": "stopped" if stopped else finding.kind,
        "first_bad": first.to_json() if first else None,
        "step": to_json(finding.step) if finding is not None and finding.step is not None else None,
        "steps": [{**s.version.to_json(), "estimate": to_json(s.estimate), "contributes": s.contributes}
                  for s in (finding.steps if finding is not None else ())],
        "stopped": stopped.result.reason if stopped else None,
        "comparisons": [c.to_json() for c in done],
        "worker_s": sum(c.worker_s for c in done), "fingerprint": fingerprint,
    }


def _write_json(path: Path, document: dict) -> None:
    """Written whole (a temporary file renamed into place): an earlier file is replaced only by a complete one."""
    schema.validate(document, "bisect", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, allow_nan=False)
        handle.write("\n")
    os.replace(tmp, path)


REF = nonempty("a commit, tag or branch")
THRESHOLD_PCT = finite(0, 100, above=True, below=True,
                       hint="in percent: 2 = 2%; leave it out to use the suite's gate.threshold")


def register(subparsers: argparse._SubParsersAction) -> None:
    bisect = subparsers.add_parser("bisect", help=COMMANDS["bisect"].help)
    bisect.add_argument("good", type=REF, metavar="GOOD", help="a commit, tag or branch where the case was fast")
    bisect.add_argument("bad", type=REF, metavar="BAD", help="a later commit, tag or branch (GOOD must be an ancestor of it)")
    bisect.add_argument("suite", type=PATH, metavar="SUITE", help="the suite (cudagate.yaml or its folder) as it is now: its "
                                                       "signed cases and reference judge every version")
    bisect.add_argument("kernel", nargs="?", type=NAME, metavar="KERNEL", help="the kernel (default: the suite's only one)")
    bisect.add_argument("--case", type=NAME, metavar="NAME", help="the performance case to time (default: the suite's first)")
    bisect.add_argument("--threshold", type=THRESHOLD_PCT, metavar="PCT",
                        help="slower than GOOD by more than PCT percent (default: the suite's gate.threshold)")
    bisect.add_argument("--budget", type=BUDGET_S, default=DEFAULT_BUDGET_S, metavar="S",
                        help=f"measurement seconds per comparison at most, as --cuda-gate-budget (default {DEFAULT_BUDGET_S:g})")
    bisect.add_argument("--repo", type=PATH, metavar="DIR", help="the git repository to read (default: the one holding SUITE)")
    bisect.add_argument("--trusted-ref", type=nonempty("a commit you trust"), metavar="REF",
                        help="a commit you trust (CI: the default branch's): the trusted keys and [tool.cudagate] "
                             "come from its git objects, never the working tree; the suite, its Python reference "
                             "and each commit's ledger are used only where they verify against those keys")
    bisect.add_argument("--timeout", type=TIMEOUT_S, default=None, metavar="S",
                        help="watchdog per request in seconds (default: [tool.cudagate] timeout_s, else 60)")
    bisect.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S", help=LOCK_TIMEOUT_HELP)
    bisect.add_argument("--json", type=PATH, metavar="OUT", help="also write the result here (schemas/bisect.schema.json)")
    bisect.set_defaults(func=cmd_bisect)
