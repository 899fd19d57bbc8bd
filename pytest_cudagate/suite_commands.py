"""The ``cudagate`` commands on suites: check, init, run (a request), approve, diff and cases
generate (registered by :mod:`pytest_cudagate.cli` when one of them runs)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import textwrap
from dataclasses import asdict
from pathlib import Path

from pytest_cudagate.approvals.approve import approve
from pytest_cudagate.config import DEFAULT_ARCH, DEFAULT_LOCK_TIMEOUT_S, LOCK_TIMEOUT_HELP, project_config
from pytest_cudagate.approvals.diff import kernel_diff
from pytest_cudagate.errors import EXIT_FAILED, CudagateError
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.errors import EXIT_INPUT, FileError
from pytest_cudagate import boundary
from cudagate_harness.request_checks import request_problems
from pytest_cudagate.judge.output_scale import flag_cases
from pytest_cudagate.judge.stats import DEFAULT_APPROVAL_RUNS
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.boundary.options import LOCK_TIMEOUT_S, NAME, PATH, PULL_REQUEST, TIMEOUT_S, count, nonempty
from pytest_cudagate.boundary.schema import validate
from pytest_cudagate.commands import COMMANDS
from pytest_cudagate.session import open_worker
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.cases import case_data_fix, check_case_data, large_case_warning, stale_files
from pytest_cudagate.suite.loader import discover, load_suite
from pytest_cudagate.defences.recheck import add_recheck_budget
from pytest_cudagate.defences.recheck_child import recheck_expected
from pytest_cudagate.suite.scaffold import init, next_steps
from pytest_cudagate.suite.model import Tolerance, load_arrays
from pytest_cudagate.trust import SIGNING_KEY_ENV, UNSIGNED_WARNING, gate_problems
from pytest_cudagate.suite.includes import IncludeError
from pytest_cudagate.worker.build import (compile_version, entry_resources, mismatch_heading, parameter_problems,
                                         suite_builds)
from pytest_cudagate.worker.requests import current_version


TIMEOUT_HELP = "watchdog per case in seconds (default: [tool.cudagate] timeout_s, else 60)"
# Each run starts a fresh worker; at least one, and two or more for the spread a stored baseline is judged by.
RUNS = count(1, 100, hint=f"{DEFAULT_APPROVAL_RUNS}, the default, gives the spread a stored baseline is judged by")


def _suites(paths: list[str]) -> list[Path]:
    found = discover([Path(p) for p in paths])
    if not found:
        raise CudagateError(f"no cudagate.yaml found in {', '.join(paths)}")
    return found


def cmd_check(args) -> int:
    failed = bad_input = False
    for path in _suites(args.suites):
        suite = load_suite(path)
        kernels = suite.all_kernels
        print(f"{path}: suite {suite.name!r} is valid ({len(kernels)} kernel(s), {len(suite.cases)} case(s))")
        for one in suite.instances if suite.instantiate else ():  # each gated as a suite of its own
            print(f"  instantiation {one.label}: {', '.join(k.name for k in one.kernels)}; case data in "
                  f"{display_path(one.data_dir)}")
        for one in suite.instances:
            for kernel in one.kernels:  # a case that breaks a kernel's `requires` is absent for it
                for case in one.cases:
                    reason = kernel.skip_reason(case)
                    if reason:
                        print(f"  skips: {reason}")
        if args.allow_unsigned:
            print(f"  {UNSIGNED_WARNING}")
        distrusted = gate_problems(suite, None, None, allow_unsigned=args.allow_unsigned)
        for problem in distrusted:
            failed = True
            print(f"  trust: {problem}")
        bad_data = False
        for one in suite.instances:
            for case in one.cases:
                for problem in check_case_data(one, case):
                    bad_data = True
                    print(f"  case {case.name}{f' [{one.label}]' if one.label else ''}: {problem}")
        if bad_data:
            failed = True
            print(f"  {case_data_fix(suite)}")
        for flag in [flag for one in suite.instances for flag in flag_cases(one)] if not bad_data else []:
            print(f"  warning: {flag}")  # judged only on sound data
        if distrusted:  # the reference runs only as a trusted signature signs it, as in the gate
            print("  note: expected outputs not rechecked with the reference: the suite is not trusted (above)")
        else:
            recheck = recheck_expected(suite, budget_s=args.recheck_budget)
            failed |= bool(recheck.problems)
            for line in recheck.problems + recheck.said(suite):
                print(f"  {line}")
        versions = []
        for one, program in [(one, build) for one in suite.instances for build in suite_builds(one)]:
            try:
                versions.append((program, one.signature, current_version(program)))
            except IncludeError as exc:  # the headers it includes are bad input, as the suite file's are
                bad_input = True
                print(f"  {program.build_name}: {exc}")
        for arch in args.arch or [project_config(suite).arch]:
            for program, signature, version in versions:
                result = compile_version(version, arch)
                if result.ok:
                    res = entry_resources(result)
                    print(f"  {program.build_name}: compiles for {result.arch} with {result.compiler} in "
                          f"{result.seconds * 1000:.0f} ms"
                          f"{' (cached)' if result.cache_hit else ''}; {res.get('registers', '?')} registers, "
                          f"{res.get('spill_store_bytes', 0)} B spill stores, {res.get('shared_static_bytes', 0)} B static shared")
                    mismatch = parameter_problems(program, result, signature, arch)
                    if mismatch:
                        failed = True
                        print(f"  {program.build_name}: {mismatch_heading(program, loud=True)}:\n"
                              + "\n".join(f"      - {p}" for p in mismatch))
                else:
                    failed = True
                    print(f"  {program.build_name}: does NOT compile for {result.arch}:\n" + textwrap.indent(result.log, " " * 6))
        bad_input |= bad_data
    return EXIT_INPUT if bad_input else EXIT_FAILED if failed else 0


def cmd_init(args) -> int:
    arch = args.arch or project_config(Path(args.kernel)).arch
    skeleton = init(Path(args.kernel), args.entry, arch, Path(args.out) if args.out else None)
    print("\n".join(next_steps(skeleton)))
    return 0


def cmd_run(args) -> int:
    path = Path(args.request)
    try:
        request = boundary.load_json(path, boundary.MAX_REQUEST_BYTES, "request file")
    except OSError as exc:
        raise CudagateError(f"{path}: cannot read the request: {exc.strerror}") from None
    if not isinstance(request, dict):
        raise CudagateError(f"{path}: expected a JSON object (a harness request)")
    validate(request, "harness-request", path)
    if request["op"] != "run":
        raise CudagateError(f"{path}: op {request['op']!r}: `cudagate run` replays op: run requests (kernel, signature, "
                            "cases); write one with `pytest --cuda-gate` (replay requests in its report)")
    base = path.resolve().parent
    # Data may lie beside the request, below the working directory, or in the suite a replay file
    # saved with a report names (by absolute path); nowhere else on disk.
    suite = (base / str(request.get("suite", ""))).resolve()
    roots = (base, Path.cwd()) + ((suite.parent,) if suite.name == "cudagate.yaml" and suite.is_file() else ())
    problems = request_problems(request, roots)
    if problems:
        raise FileError(path, problems)
    for case in request["cases"]:  # paths in a request file are relative to it
        for spec in case["buffers"].values():
            if "input" in spec:
                spec["input"] = str(base / spec["input"])
        case["expected"] = {k: str(base / v) for k, v in case.get("expected", {}).items()}
    request["output_dir"] = str(Path(args.output).resolve()) if args.output else tempfile.mkdtemp(prefix="cudagate-run-")
    config = project_config(path, timeout_s=args.timeout, lock_timeout_s=args.lock_timeout)
    with open_worker(timeout_s=config.timeout_s, lock_timeout_s=config.lock_timeout_s) as worker:
        result = worker.client.run(request)
    report = {"request": str(path), "compile": result.compile, "device": worker.client.device, "cases": []}
    failed = not result.compile.get("ok")
    for case in request["cases"]:
        body = result.cases.get(case["name"], {"status": "error", "error": {"kind": "compile", "message": "not run"}})
        entry = {"case": case["name"], "status": body.get("status"), "error": body.get("error"),
                 "timing": body.get("timing")}
        if case["expected"] and body.get("status") == "ok":
            tolerance = {k: Tolerance(**v) for k, v in case.get("tolerance", {}).items()}
            shapes = {k: tuple(v) for k, v in case.get("shapes", {}).items()}
            verdict = judge_case(request["kernel"]["name"], case["name"], body, load_arrays(case["expected"]), tolerance, shapes)
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
    # an instantiated suite's instantiations each get their data: drawn from the same seeds in its types
    for suite in [one for path in _suites(args.suites) for one in load_suite(path).instances]:
        cases = [suite.case(name) for name in args.case] if args.case else list(suite.cases)
        if suite.reference.python:
            folders = generate(suite, cases)
        else:
            config = project_config(suite, timeout_s=args.timeout, lock_timeout_s=args.lock_timeout)
            with open_worker(timeout_s=config.timeout_s, lock_timeout_s=config.lock_timeout_s) as worker:
                folders = generate(suite, cases, client=worker.client)
        for case, folder in zip(cases, folders):
            print(f"wrote {folder}" + (" (generated.json and the output sample; the arrays are drawn at run time)"
                                       if case.generated else ""))
            for stale in stale_files(suite, case):  # the case's other form, regenerable: it would block signing
                stale.unlink()
                with contextlib.suppress(OSError):
                    stale.parent.rmdir()  # expected/ or sample/, once empty
                print(f"  removed {display_path(stale)}: case {case.name!r} is " +
                      ("generated now (its arrays are drawn at run time)" if case.generated
                       else "stored now (generated.json and the sample are for a generated case)"))
            warning = large_case_warning(suite, case)
            if warning:
                print(f"  warning: {warning}")
        for flag in flag_cases(suite):
            print(f"  warning: {flag}")
    return 0


def cmd_approve(args) -> int:
    """Record the working-tree kernel(s) as approved, if the gate passes them, with baselines measured here."""
    suite = load_suite(next(iter(_suites([args.suite]))))
    kernels = [suite.instance_of(args.kernel).kernel(args.kernel)] if args.kernel else list(suite.all_kernels)
    config = project_config(suite, timeout_s=args.timeout, lock_timeout_s=args.lock_timeout)
    if args.pull_request is not None and not (args.key or os.environ.get(SIGNING_KEY_ENV)):
        raise CudagateError(f"--pull-request {args.pull_request}: names what a signing is for, and without --key (or "
                            f"${SIGNING_KEY_ENV}) approve signs nothing; pass it to `cudagate sign` after review")
    approved = approve(suite, kernels, config, approved_by=args.approved_by, key_file=args.key, runs=args.runs,
                       pull_request=args.pull_request, out=sys.stdout)
    return 0 if approved else EXIT_FAILED


def cmd_diff(args) -> int:
    suite = load_suite(next(iter(_suites([args.suite])))).instance_of(args.kernel)
    print("\n".join(kernel_diff(suite, args.kernel, Path(args.report) if args.report else None)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser("check", help=COMMANDS["check"].help)
    check.add_argument("suites", nargs="+", type=PATH, metavar="SUITE", help="cudagate.yaml files or folders holding them")
    check.add_argument("--arch", action="append", type=nonempty("a compile target such as sm_90"), metavar="SM",
                       help=f"compile target, repeatable (default: `arch` of [tool.cudagate] in the pyproject.toml "
                            f"nearest above each suite, else {DEFAULT_ARCH}; never the GPU's, whether or not one is "
                            "present)")
    check.add_argument("--allow-unsigned", action="store_true",
                       help="skip signature checks (local experiments only; says so loudly)")
    add_recheck_budget(check)
    check.set_defaults(func=cmd_check)

    init_ = sub.add_parser("init", help=COMMANDS["init"].help)
    init_.add_argument("kernel", type=PATH, metavar="KERNEL.cu", help="the CUDA file that defines the kernel")
    init_.add_argument("entry", nargs="?", type=nonempty("a __global__ function's C++ name"), metavar="ENTRY",
                       help="the kernel to gate, as C++ names it (a template with its arguments: 'reduce<float>'); "
                            "needed where the file defines several")
    init_.add_argument("--out", type=PATH, metavar="DIR", help="the suite's folder: the kernel's (default) or one above it")
    init_.add_argument("--arch", type=nonempty("a compile target such as sm_90"), metavar="SM",
                       help=f"compile target (default: [tool.cudagate] arch, else {DEFAULT_ARCH})")
    init_.set_defaults(func=cmd_init)

    run = sub.add_parser("run", help=COMMANDS["run"].help)
    run.add_argument("request", type=PATH, metavar="REQUEST.json")
    run.add_argument("--output", type=PATH, metavar="DIR", help="where the kernel's outputs are written (default: a temp folder)")
    run.add_argument("--timeout", type=TIMEOUT_S, default=None, metavar="S", help=TIMEOUT_HELP)
    run.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S", help=LOCK_TIMEOUT_HELP)
    run.set_defaults(func=cmd_run)

    approve = sub.add_parser("approve", help=COMMANDS["approve"].help)
    approve.add_argument("suite", type=PATH, metavar="SUITE")
    approve.add_argument("kernel", nargs="?", type=NAME, metavar="KERNEL", help="only this kernel (default: all)")
    approve.add_argument("--approved-by", type=NAME, metavar="NAME", help="reviewer's name (default: git user.name)")
    approve.add_argument("--runs", type=RUNS, default=DEFAULT_APPROVAL_RUNS, metavar="N",
                         help=f"independent runs, each in a fresh worker, whose medians a byte-identical kernel is "
                              f"later judged against (default {DEFAULT_APPROVAL_RUNS}; at least 2 for that)")
    approve.add_argument("--timeout", type=TIMEOUT_S, default=None, metavar="S", help=TIMEOUT_HELP)
    approve.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S", help=LOCK_TIMEOUT_HELP)
    approve.add_argument("--key", type=PATH, metavar="FILE", help="sign the new entries with this private key "
                         "(or $CUDAGATE_SIGNING_KEY); without one, a maintainer signs later with `cudagate sign`")
    approve.add_argument("--pull-request", type=PULL_REQUEST, metavar="N",
                         help="with --key: sign the ledger for pull request N, as `cudagate sign --pull-request N` does")
    approve.set_defaults(func=cmd_approve)

    diff = sub.add_parser("diff", help=COMMANDS["diff"].help)
    diff.add_argument("suite", type=PATH, metavar="SUITE")
    diff.add_argument("kernel", type=NAME, metavar="KERNEL")
    diff.add_argument("--report", type=PATH, metavar="REPORT.json", help="add the latency change per case from a gate report")
    diff.set_defaults(func=cmd_diff)

    cases = sub.add_parser("cases", help=COMMANDS["cases"].help)
    cases_sub = cases.add_subparsers(dest="cases_command", required=True, metavar="ACTION")
    gen = cases_sub.add_parser("generate", help="draw seeded inputs and compute expected outputs with the reference "
                                                "(a generated case: its input digests and output sample only)")
    gen.add_argument("suites", nargs="+", type=PATH, metavar="SUITE")
    gen.add_argument("--case", action="append", type=NAME, metavar="NAME", help="only this case (repeatable)")
    gen.add_argument("--timeout", type=TIMEOUT_S, default=None, metavar="S", help=TIMEOUT_HELP)
    gen.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S", help=LOCK_TIMEOUT_HELP)
    gen.set_defaults(func=cmd_cases_generate)
