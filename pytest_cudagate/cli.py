"""The ``cudagate`` command: suite checks, request replays and case generation.

Exit codes: 0 all good, 1 a check or replay failed, 2 bad input (the message names file and fix),
3 no CUDA device where one is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from . import __version__
from .build import compile_program
from .client import HarnessClient, WorkerUnavailable
from .errors import CudagateError
from .suite.cases import case_data_fix, check_case_data, generate
from .suite.loader import discover, load_suite
from .suite.model import Tolerance
from .verdicts import judge, load_expected

EXIT_FAILED, EXIT_INPUT, EXIT_NO_GPU = 1, 2, 3


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
        bad_data = False
        for case in suite.cases:
            for problem in check_case_data(suite, case):
                bad_data = True
                print(f"  case {case.name}: {problem}")
        if bad_data:
            failed = True
            print(f"  {case_data_fix(suite)}")
        programs = list(suite.kernels) + ([suite.reference.program] if suite.reference.program else [])
        for arch in args.arch or ["sm_90"]:
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
    from .schema import validate

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
    with HarnessClient(timeout_s=args.timeout) as client:
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
            verdict = judge(request["kernel"]["name"], case["name"], body, load_expected(case["expected"]), tolerance, shapes)
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
            with HarnessClient(timeout_s=args.timeout) as client:
                client.start()
                folders = generate(suite, cases, client=client)
        for folder in folders:
            print(f"wrote {folder}")
    return 0


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudagate", description="CI regression gate for CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"cudagate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="validate suites, their case data, and compile every kernel (no GPU needed)")
    check.add_argument("suites", nargs="+", metavar="SUITE", help="cudagate.yaml files or folders holding them")
    check.add_argument("--arch", action="append", metavar="SM", help="compile target, repeatable (default sm_90)")
    check.set_defaults(func=cmd_check)

    run = sub.add_parser("run", help="replay one harness request file on the GPU and print per-case results as JSON")
    run.add_argument("request", metavar="REQUEST.json")
    run.add_argument("--output", metavar="DIR", help="where the kernel's outputs are written (default: a temp folder)")
    run.add_argument("--timeout", type=float, default=60.0, metavar="S", help="watchdog per case (default 60)")
    run.set_defaults(func=cmd_run)

    cases = sub.add_parser("cases", help="manage case data")
    cases_sub = cases.add_subparsers(dest="cases_command", required=True, metavar="ACTION")
    gen = cases_sub.add_parser("generate", help="draw seeded inputs and compute expected outputs with the reference")
    gen.add_argument("suites", nargs="+", metavar="SUITE")
    gen.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
    gen.add_argument("--timeout", type=float, default=60.0, metavar="S")
    gen.set_defaults(func=cmd_cases_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except WorkerUnavailable as exc:
        print(f"cudagate: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    except (CudagateError, KeyError) as exc:
        print(f"cudagate: {exc if not isinstance(exc, KeyError) else exc.args[0]}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
