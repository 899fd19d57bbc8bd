"""The ``cudagate`` command: suite checks, request replays and case generation.

Exit codes: 0 all good, 1 a check or replay failed, 2 bad input (the message names file and fix),
3 no CUDA device where one is needed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from pytest_cudagate import __version__
from pytest_cudagate.worker.build import build_record, compile_program
from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.errors import EXIT_FAILED, CudagateError, run_command
from pytest_cudagate.config import project_config
from pytest_cudagate.paths import display_path
from pytest_cudagate.judge.output_scale import flag_cases
from pytest_cudagate.suite.cases import case_data_fix, check_case_data, generate
from pytest_cudagate.suite.loader import discover, load_suite
from pytest_cudagate.suite.model import Tolerance
from pytest_cudagate.trust import SIGNING_KEY_ENV, UNSIGNED_WARNING, gate_problems, load_private_key
from pytest_cudagate.optimize.cli import register as register_optimize
from pytest_cudagate.reports.cli import register as register_reports
from pytest_cudagate.trust.cli import register as register_trust
from pytest_cudagate.trust.ledger import sign_ledger
from pytest_cudagate.judge.correctness import judge_case, load_expected
from pytest_cudagate.schema import validate
from pytest_cudagate.approvals import Baseline, Ledger, approval_for, build_identity, git_state
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.gate import BASELINE_ROUNDS
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.judge.stats import DEFAULT_APPROVAL_RUNS, summarize
from pytest_cudagate.diffing import kernel_diff


TIMEOUT_HELP = "watchdog per case in seconds (default: [tool.cudagate] timeout_s, else 60)"


def _suites(paths: list[str]) -> list[Path]:
    found = discover([Path(p) for p in paths])
    if not found:
        raise CudagateError(f"no cudagate.yaml found in {', '.join(paths)}")
    return found


def cmd_check(args) -> int:
    failed = False
    for path in _suites(args.suites):
        suite = load_suite(path)
        print(f"{path}: suite {suite.name!r} is valid ({len(suite.kernels)} kernel(s), {len(suite.cases)} case(s))")
        if args.allow_unsigned:
            print(f"  {UNSIGNED_WARNING}")
        for problem in gate_problems(suite, None, None, allow_unsigned=args.allow_unsigned):
            failed = True
            print(f"  trust: {problem}")
        bad_data = False
        for case in suite.cases:
            for problem in check_case_data(suite, case):
                bad_data = True
                print(f"  case {case.name}: {problem}")
        if bad_data:
            failed = True
            print(f"  {case_data_fix(suite)}")
        for flag in flag_cases(suite):
            print(f"  warning: {flag}")
        programs = list(suite.kernels) + ([suite.reference.program] if suite.reference.program else [])
        for arch in args.arch or [project_config(suite).arch]:
            for program in programs:
                result = compile_program(program, arch)
                if result.ok:
                    res = result.resources
                    print(f"  {program.name}: compiles for {result.arch} in {result.seconds * 1000:.0f} ms"
                          f"{' (cached)' if result.cache_hit else ''}; {res.get('registers', '?')} registers, "
                          f"{res.get('spill_store_bytes', 0)} B spill stores, {res.get('shared_static_bytes', 0)} B static shared")
                else:
                    failed = True
                    print(f"  {program.name}: does NOT compile for {result.arch}:\n" + _indent(result.log, 6))
    return EXIT_FAILED if failed else 0


def cmd_run(args) -> int:
    path = Path(args.request)
    try:
        request = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CudagateError(f"{path}: cannot read the request: {exc}") from None
    validate(request, "harness-request", path)
    base = path.resolve().parent
    for case in request["cases"]:  # paths in a request file are relative to it
        for spec in case["buffers"].values():
            if "input" in spec:
                spec["input"] = str(base / spec["input"])
        case["expected"] = {k: str(base / v) for k, v in case.get("expected", {}).items()}
    request["output_dir"] = args.output or tempfile.mkdtemp(prefix="cudagate-run-")
    with HarnessClient(timeout_s=project_config(path, timeout_s=args.timeout).timeout_s) as client:
        client.start()
        result = client.run(request)
    report = {"request": str(path), "compile": result.compile, "device": client.device, "cases": []}
    failed = not result.compile.get("ok")
    for case in request["cases"]:
        body = result.cases.get(case["name"], {"status": "error", "error": {"kind": "compile", "message": "not run"}})
        entry = {"case": case["name"], "status": body.get("status"), "error": body.get("error"),
                 "timing": body.get("timing")}
        if case["expected"] and body.get("status") == "ok":
            tolerance = {k: Tolerance(**v) for k, v in case.get("tolerance", {}).items()}
            shapes = {k: tuple(v) for k, v in case.get("shapes", {}).items()}
            verdict = judge_case(request["kernel"]["name"], case["name"], body, load_expected(case["expected"]), tolerance, shapes)
            entry.update(passed=verdict.passed, problems=verdict.problems,
                         comparisons=[{**asdict(c), "tolerance": asdict(c.tolerance)} for c in verdict.comparisons])
            failed |= not verdict.passed
        else:
            entry["passed"] = body.get("status") == "ok"
            failed |= not entry["passed"]
        report["cases"].append(entry)
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    return EXIT_FAILED if failed else 0


def cmd_cases_generate(args) -> int:
    for path in _suites(args.suites):
        suite = load_suite(path)
        cases = [suite.case(name) for name in args.case] if args.case else list(suite.cases)
        if suite.reference.python:
            folders = generate(suite, cases)
        else:
            with HarnessClient(timeout_s=project_config(suite, timeout_s=args.timeout).timeout_s) as client:
                client.start()
                folders = generate(suite, cases, client=client)
        for folder in folders:
            print(f"wrote {folder}")
        for flag in flag_cases(suite):
            print(f"  warning: {flag}")
    return 0


def cmd_approve(args) -> int:
    """Record the working-tree kernel(s) as approved, with baselines measured here and now: ``--runs``
    independent runs, each one run median per case (the spread a stored baseline is judged by)."""
    suite = load_suite(next(iter(_suites([args.suite]))))
    kernels = [suite.kernel(args.kernel)] if args.kernel else list(suite.kernels)
    ledger = Ledger.for_suite(suite)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    who = args.approved_by or _user_name(suite.root)
    if args.runs < 1:
        raise CudagateError(f"--runs {args.runs}: at least one run; {DEFAULT_APPROVAL_RUNS} (the default) gives the "
                            "spread a stored baseline is judged by")
    timeout = project_config(suite, timeout_s=args.timeout).timeout_s
    runs = [_approval_run(suite, kernels, timeout, number, args.runs) for number in range(1, args.runs + 1)]
    fingerprint, arch = runs[0][0], runs[0][1]
    refused = False
    for program in kernels:
        problems = [p for _, _, measured in runs for p in measured[program.name][0]]
        if problems:
            refused = True
            print(f"{program.name}: NOT approved; it fails the gate:\n" + _indent("\n".join(dict.fromkeys(problems)), 2))
            continue
        # The first run's launches are kept for the plots; the interval comes from the run medians.
        baseline_cases = runs[0][2][program.name][1]
        for case, entry in baseline_cases.items():
            entry["run_medians_ms"] = [measured[program.name][1][case]["summary"]["median"] for _, _, measured in runs]
        current = ledger.approvals.get(program.name)
        if current is None or current.identity() != build_identity(program):
            if current is not None:
                ledger.history.append({**current.signed_payload(), "baselines": sorted(current.baselines)})
            current = approval_for(ledger, program, approved_by=who, approved_at=now,
                                   git=git_state(suite.root), tool_version=__version__)
            ledger.approvals[program.name] = current
            what = f"approved {current.source_sha256[:12]}"
        else:
            what = f"already approved ({current.source_sha256[:12]}); baseline recorded"
        current.build = build_record(program, arch)
        current.baselines[fingerprint.key()] = Baseline(fingerprint.to_dict(), now, baseline_cases)
        medians = ", ".join(f"{c} {_spread_text(v['run_medians_ms'])}" for c, v in baseline_cases.items())
        print(f"{program.name}: {what} by {who}; baseline of {args.runs} run(s): {medians}")
    key = load_private_key(args.key) if (args.key or os.environ.get(SIGNING_KEY_ENV)) else None
    if key is not None:
        sign_ledger(ledger, key, who)
    ledger.save()
    print(f"wrote {display_path(ledger.path)}" + ("" if key else "; its entries are unsigned until a maintainer "
                                                  f"reviews them and runs `cudagate sign {display_path(suite.path)}`"))
    return EXIT_FAILED if refused else 0


def _approval_run(suite, kernels, timeout_s: float, number: int, of: int):
    """One independent approval run: a fresh worker (fresh allocations, its own warm-up) over every
    case of ``kernels``. Returns (fingerprint, arch, {kernel: (problems, {case: baseline entry})})."""
    measured = {}
    with HarnessClient(timeout_s=timeout_s) as client, tempfile.TemporaryDirectory(prefix="cudagate-approve-") as out:
        fingerprint = Fingerprint.from_hello(client.start())
        if number == 1:
            print(f"measuring on {fingerprint.key()}: {fingerprint.describe()}")
        for program in kernels:
            problems, baseline_cases = [], {}
            for case in suite.cases:
                problems += [f"{case.name}: {p}" for p in check_case_data(suite, case)]
                if problems:
                    continue
                timing = {**suite.timing.to_json(), "repeat": BASELINE_ROUNDS} if case.kind == "performance" else None
                result = client.run(run_request(suite, program, [case], output_dir=Path(out), timing=timing))
                if not result.compile.get("ok"):
                    problems.append(f"does not compile:\n{result.compile.get('log', '')}")
                    break
                body = result.cases[case.name]
                verdict = judge_case(program.name, case.name, body,
                                     load_expected({p.name: suite.expected_path(case, p) for p in suite.outputs}),
                                     suite.tolerance, {p.name: suite.shape(p, case) for p in suite.buffers})
                if not verdict.passed:
                    problems.append(verdict.describe())
                elif timing:
                    samples = body["timing"]["samples_ms"]
                    baseline_cases[case.name] = {"summary": summarize(samples).to_dict(), "samples_ms": samples,
                                                 "cache": timing["cache"]}
            measured[program.name] = (problems, baseline_cases)
        arch = client.device["arch"]
    if of > 1:
        print(f"  run {number} of {of} done")
    return fingerprint, arch, measured


def _spread_text(medians: list[float]) -> str:
    low, high = min(medians), max(medians)
    return f"{low * 1000:.2f} µs" if len(medians) == 1 else f"{low * 1000:.2f}–{high * 1000:.2f} µs"


def cmd_diff(args) -> int:
    suite = load_suite(next(iter(_suites([args.suite]))))
    print("\n".join(kernel_diff(suite, args.kernel, Path(args.report) if args.report else None)))
    return 0


def _user_name(root: Path) -> str:
    try:
        import git

        return git.Repo(root, search_parent_directories=True).config_reader().get_value("user", "name")
    except Exception:  # no repository or no user.name configured
        return getpass.getuser()


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudagate", description="CI regression gate for CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"cudagate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="validate suites, their case data, and compile every kernel (no GPU needed)")
    check.add_argument("suites", nargs="+", metavar="SUITE", help="cudagate.yaml files or folders holding them")
    check.add_argument("--arch", action="append", metavar="SM", help="compile target, repeatable (default: [tool.cudagate] arch, else sm_90)")
    check.add_argument("--allow-unsigned", action="store_true",
                       help="skip signature checks (local experiments only; says so loudly)")
    check.set_defaults(func=cmd_check)

    run = sub.add_parser("run", help="replay one harness request file on the GPU and print per-case results as JSON")
    run.add_argument("request", metavar="REQUEST.json")
    run.add_argument("--output", metavar="DIR", help="where the kernel's outputs are written (default: a temp folder)")
    run.add_argument("--timeout", type=float, default=None, metavar="S", help=TIMEOUT_HELP)
    run.set_defaults(func=cmd_run)

    approve = sub.add_parser("approve", help="record the current kernel(s) as approved, with baselines measured on this GPU")
    approve.add_argument("suite", metavar="SUITE")
    approve.add_argument("kernel", nargs="?", metavar="KERNEL", help="only this kernel (default: all)")
    approve.add_argument("--approved-by", metavar="NAME", help="reviewer's name (default: git user.name)")
    approve.add_argument("--runs", type=int, default=DEFAULT_APPROVAL_RUNS, metavar="N",
                         help=f"independent runs, each in a fresh worker, whose medians a byte-identical kernel is "
                              f"later judged against (default {DEFAULT_APPROVAL_RUNS}; at least 2 for that)")
    approve.add_argument("--timeout", type=float, default=None, metavar="S", help=TIMEOUT_HELP)
    approve.add_argument("--key", metavar="FILE", help="sign the new entries with this private key "
                         "(or $CUDAGATE_SIGNING_KEY); without one, a maintainer signs later with `cudagate sign`")
    approve.set_defaults(func=cmd_approve)

    diff = sub.add_parser("diff", help="show what changed in a kernel since its approved version")
    diff.add_argument("suite", metavar="SUITE")
    diff.add_argument("kernel", metavar="KERNEL")
    diff.add_argument("--report", metavar="REPORT.json", help="add the latency change per case from a gate report")
    diff.set_defaults(func=cmd_diff)

    register_trust(sub)
    register_reports(sub)
    register_optimize(sub)
    cases = sub.add_parser("cases", help="manage case data")
    cases_sub = cases.add_subparsers(dest="cases_command", required=True, metavar="ACTION")
    gen = cases_sub.add_parser("generate", help="draw seeded inputs and compute expected outputs with the reference")
    gen.add_argument("suites", nargs="+", metavar="SUITE")
    gen.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
    gen.add_argument("--timeout", type=float, default=None, metavar="S", help=TIMEOUT_HELP)
    gen.set_defaults(func=cmd_cases_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
