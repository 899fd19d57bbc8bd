"""``cudagate optimize SUITE KERNEL``: the command line of the optimiser.

``pytest_cudagate/cli.py``'s ``build_parser`` calls :func:`register`. Exit codes: 0 a candidate passed the gate, 1 none did (no gain, rejected, or not
gated), 2 bad input, 3 no CUDA device, 130 interrupted (the pack is still complete).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_cudagate.commands import COMMANDS
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.boundary.options import (BUDGET_S, LOCK_TIMEOUT_S, NAME, PATH, TIMEOUT_S, count, finite,
                                            nonempty)
from pytest_cudagate.config import DEFAULT_BUDGET_S, DEFAULT_LOCK_TIMEOUT_S, LOCK_TIMEOUT_HELP, project_config
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.optimize.budgets import MIN_COMPLETION_TOKENS, Budgets, Meter, load_price_table, price_for
from pytest_cudagate.optimize.evaluator import HarnessEvaluator
from pytest_cudagate.optimize.gitpropose import clean_tree_problem, propose_branch
from pytest_cudagate.optimize.loop import Optimizer
from pytest_cudagate.optimize.pack import AuditPack
from pytest_cudagate.optimize.progress import Progress
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.optimize.proposers.openai import OpenAIProposer
from pytest_cudagate.optimize.proposers.replay import ReplayProposer
from pytest_cudagate.optimize.research import Notes
from pytest_cudagate.host.paths import command, display_path, run_command
from pytest_cudagate.suite.loader import discover, load_suite
from pytest_cudagate.trust import UNSIGNED_WARNING, gate_problems
from pytest_cudagate.session import open_worker

EXIT_WINNER, EXIT_NO_WINNER, EXIT_INTERRUPTED = 0, 1, 130  # bad input and no GPU: errors.EXIT_INPUT, EXIT_NO_GPU
MINUTES = finite(0, 7 * 24 * 60, unit="minutes", hint="0: no limit")  # a week at most


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "optimize", help=COMMANDS["optimize"].help,
        description="A bounded search for a faster version of KERNEL: each round a proposer suggests CUDA source and "
                    "a launch configuration, the harness checks it on the suite's visible cases and times it "
                    "interleaved with the initial kernel; the fastest must then pass the full gate (holdout cases, "
                    "fresh inputs, against the approved kernel). Writes an audit pack to RESULTS/run-NNN/. "
                    "Needs a CUDA GPU, and a signed suite (or --allow-unsigned). The default proposer, openai, needs "
                    "the [optimize] extra and OPENAI_API_KEY (or --base-url for a server that needs no key); "
                    "autotune and replay need neither. The winner's gate compares it with KERNEL's approved version "
                    "(`cudagate approve` on a GPU): without one, its latency is incomparable and only its "
                    "correctness is gated.")
    p.add_argument("suite", type=PATH, metavar="SUITE", help="cudagate.yaml (or its folder)")
    p.add_argument("kernel", type=NAME, metavar="KERNEL", help="the kernel of the suite to optimise")
    p.add_argument("--max-iterations", type=count(1, 1000), default=7, metavar="N", help="rounds (default 7)")
    p.add_argument("--proposer", default="openai", type=nonempty("openai, autotune or replay:DIR"), metavar="openai|autotune|replay:DIR",
                   help="where candidates come from (default openai)")
    model = p.add_argument_group("model (--proposer openai)")
    model.add_argument("--model", default="gpt-5-mini", type=NAME, help="model name (default gpt-5-mini)")
    model.add_argument("--reasoning-effort", default="medium", type=nonempty("a reasoning level"), metavar="LEVEL",
                       help="minimal/low/medium/high, or none to send no reasoning_effort (default medium)")
    model.add_argument("--base-url", type=nonempty("a URL"), metavar="URL", help="any OpenAI-compatible endpoint (vLLM, Ollama); key from "
                                                        "OPENAI_API_KEY")
    model.add_argument("--description", type=nonempty("notes"), metavar="TEXT", help="notes for the model about the workload")
    model.add_argument("--use-nsight", action="store_true",
                       help="profile each passing candidate with ncu --clock-control none; the summary feeds the next round")
    model.add_argument("--nvidia-research", action="store_true",
                       help="give the model a tool that searches local optimisation notes (--research-dir)")
    model.add_argument("--research-dir", type=PATH, metavar="DIR", help="folder of notes for --nvidia-research (no internet)")
    model.add_argument("--price-table", type=PATH, metavar="FILE.json",
                       help='USD per million tokens, {"MODEL": {"input": .., "cached_input": .., "output": ..}}')
    budgets = p.add_argument_group("budgets (hard; the stop reason names the one that ran out)")
    budgets.add_argument("--budget-usd", type=finite(0, 1e6, above=True, unit="US dollars"), metavar="X", help="estimated model spend")
    budgets.add_argument("--max-tokens", type=count(1, 10**12), metavar="N", help="model tokens, prompt and completion")
    budgets.add_argument("--max-model-calls", type=count(0, 100_000), default=40, metavar="N", help="model requests, retries "
                         "included (default 40)")
    budgets.add_argument("--max-gpu-minutes", type=MINUTES, default=20.0, metavar="Y",
                         help="GPU time (default 20; 0: no limit)")
    budgets.add_argument("--max-wall-minutes", type=MINUTES, default=60.0, metavar="Z",
                         help="wall time (default 60; 0: no limit)")
    budgets.add_argument("--max-repairs", type=count(0, 100), default=2, metavar="N",
                         help="answers sent back for repair per round (malformed, refused, not compiling; default 2)")
    budgets.add_argument("--max-tool-calls", type=count(0, 100), default=4, metavar="N", help="research tool calls per round")
    budgets.add_argument("--max-completion-tokens", type=count(MIN_COMPLETION_TOKENS, 10_000_000), default=32_000, metavar="N", help="per model call")
    search = p.add_argument_group("search and gate")
    search.add_argument("--batch", type=count(1, 1024), default=8, metavar="N", help="autotune: candidates per round (default 8)")
    search.add_argument("--seed", type=count(0, 2**64 - 1), default=0, help="autotune: random seed (default 0)")
    search.add_argument("--validate-top", type=count(1, 100), default=3, metavar="N",
                        help="gate up to N of the fastest candidates until one passes (default 3)")
    search.add_argument("--gate-budget", type=BUDGET_S, default=DEFAULT_BUDGET_S, metavar="S", help="gate measurement seconds per case")
    search.add_argument("--strict", action="store_true", help="the gate fails inconclusive and unstable cases")
    search.add_argument("--timeout", type=TIMEOUT_S, default=None, metavar="S",
                        help="watchdog per case (default: [tool.cudagate] timeout_s, else 60)")
    search.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S", help=LOCK_TIMEOUT_HELP)
    search.add_argument("--allow-unsigned", action="store_true", help="optimise against an unsigned suite (experiments)")
    out = p.add_argument_group("output")
    out.add_argument("--results", default="results", type=PATH, metavar="DIR", help="where run-NNN/ goes (default results)")
    out.add_argument("--propose", action="store_true", help="with a clean git tree: commit the winner on a new branch")
    out.add_argument("--branch", type=NAME, metavar="NAME", help="branch name for --propose")
    out.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_optimize)
    return p


def cmd_optimize(args) -> int:
    return run_optimize(args)


def _budgets(args):
    return Budgets(max_iterations=args.max_iterations, max_model_calls=args.max_model_calls, max_tokens=args.max_tokens,
                   max_usd=args.budget_usd, max_gpu_s=args.max_gpu_minutes * 60 if args.max_gpu_minutes else None,
                   max_wall_s=args.max_wall_minutes * 60 if args.max_wall_minutes else None,
                   max_repairs=args.max_repairs, max_tool_calls=args.max_tool_calls,
                   max_completion_tokens=args.max_completion_tokens)


def run_optimize(args, *, evaluator_factory=None, openai_client=None, sleep=None, stream=None) -> int:
    """The command. ``evaluator_factory(suite, program, ledger)`` replaces the GPU harness (tests)."""
    paths = discover([Path(args.suite)])
    if not paths:
        raise CudagateError(f"no cudagate.yaml found at {args.suite}")
    suite = load_suite(paths[0])
    suite = suite.instance_of(args.kernel)  # an instantiated suite: the instantiation of `gelu[T=bfloat16]`
    program = suite.kernel(args.kernel)
    if program.steps:
        raise CudagateError(f"{display_path(suite.path)}: kernel {program.name!r} is {len(program.steps)} steps; "
                            "cudagate optimize searches single-launch kernels (its proposals replace one source and "
                            "one launch): optimize each pass as a suite of its own")
    ledger = Ledger.for_suite(suite)  # one read: the ledger verified is the ledger judged with
    problems = gate_problems(suite, None, None, allow_unsigned=args.allow_unsigned, ledger=ledger)
    if problems:
        raise CudagateError("the suite's oracle is not trusted, so nothing can be judged against it:\n  "
                            + "\n  ".join(problems) + "\n(--allow-unsigned for a local experiment)")
    trust = "not checked (--allow-unsigned)" if args.allow_unsigned else "verified"
    if args.propose:
        problem = clean_tree_problem(suite.root)
        if problem:
            raise CudagateError(problem)
    proposer_kind = "replay" if args.proposer.startswith("replay:") else args.proposer
    if proposer_kind not in ("openai", "autotune", "replay"):
        raise CudagateError(f"--proposer {args.proposer!r}: use openai, autotune or replay:DIR")
    # its files are read and checked before a GPU is taken
    replay = ReplayProposer(args.proposer.split(":", 1)[1]) if proposer_kind == "replay" else None
    price = None
    if proposer_kind == "openai":
        price = price_for(args.model, load_price_table(Path(args.price_table) if args.price_table else None))
        if args.budget_usd is not None and price is None:
            raise CudagateError(f"--budget-usd needs a price for {args.model!r}: pass --price-table FILE.json with "
                                '{"' + args.model + '": {"input": USD_PER_MTOK, "output": USD_PER_MTOK}}')
    notes = None
    if args.nvidia_research:
        if not args.research_dir:
            raise CudagateError("--nvidia-research needs --research-dir DIR (a folder of notes; nothing is fetched)")

        try:
            notes = Notes(Path(args.research_dir))
        except FileNotFoundError as exc:
            raise CudagateError(str(exc)) from None
    if args.allow_unsigned and not args.quiet:
        print(f"cudagate optimize: {UNSIGNED_WARNING}", file=stream or sys.stderr)

    budgets = _budgets(args)
    progress = Progress(quiet=args.quiet, stream=stream)
    resources = []
    try:
        if evaluator_factory is not None:
            evaluator = evaluator_factory(suite, program, ledger)
        else:
            evaluator = _harness_evaluator(args, suite, program, ledger, resources)
        resources.append(evaluator)
        settings = {"proposer": args.proposer, "model": args.model if proposer_kind == "openai" else None,
                    "reasoning_effort": args.reasoning_effort if proposer_kind == "openai" else None,
                    "base_url": None, "description": args.description or "", "use_nsight": args.use_nsight,
                    "nvidia_research": args.nvidia_research,
                    "research_dir": str(args.research_dir) if args.research_dir else None,
                    "max_iterations": args.max_iterations, "batch": args.batch, "seed": args.seed,
                    "validate_top": args.validate_top, "gate_budget_s": args.gate_budget, "strict": args.strict,
                    "allow_unsigned": args.allow_unsigned}
        meter = Meter(budgets, price)
        pack = AuditPack(Path(args.results), suite=suite, program=program, device=evaluator.device(), settings=settings,
                         trust=trust, on_problem=progress.note)
        visible = [c for c in suite.cases if not c.holdout and program.runs(c)]
        proposer = replay or _proposer(args, proposer_kind, suite, program, visible, meter, pack, notes, evaluator,
                                       openai_client, sleep)
        describe = getattr(proposer, "describe", None)
        pack.proposer = {"kind": proposer_kind, **(describe() if describe else {})}
        settings["base_url"] = pack.proposer.get("endpoint")

        optimizer = Optimizer(suite=suite, program=program, evaluator=evaluator, proposer=proposer, pack=pack,
                              meter=meter, progress=progress, budgets=budgets, use_nsight=args.use_nsight,
                              validate_top=args.validate_top, settings=settings)
        if not args.quiet:
            print(f"cudagate optimize: {suite.name}/{program.name} with {args.proposer}, at most "
                  f"{args.max_iterations} round(s); audit pack {display_path(pack.dir)}", file=stream or sys.stderr)
        summary = optimizer.run()
        progress.close()
        proposal = None
        if args.propose and optimizer.winner is not None:
            proposal = propose_branch(suite, program, optimizer.winner, summary, pack.dir, branch=args.branch)
            summary = pack.record_proposal(proposal)
        _print_summary(summary, pack, proposal, stream or sys.stdout)
        if summary["stop_reason"] == "interrupted":
            return EXIT_INTERRUPTED
        return EXIT_WINNER if optimizer.winner is not None else EXIT_NO_WINNER
    finally:
        progress.close()
        for resource in reversed(resources):
            try:
                resource.close()
            except Exception:  # closing must never hide the real outcome
                pass


def _harness_evaluator(args, suite, program, ledger, resources):
    config = project_config(suite, timeout_s=args.timeout, lock_timeout_s=args.lock_timeout)
    worker = open_worker(timeout_s=config.timeout_s, lock_timeout_s=config.lock_timeout_s)
    resources.append(worker)
    options = GateOptions(strict=args.strict, budget_s=args.gate_budget)
    return HarnessEvaluator(suite, program, ledger, worker.client, worker.fingerprint, gate_options=options)


def _proposer(args, kind, suite, program, visible, meter, pack, notes, evaluator, client, sleep):
    if kind == "openai":
        device = (evaluator.device() or {}).get("description", "an NVIDIA GPU").split(" driver")[0]
        return OpenAIProposer(suite=suite, program=program, visible=visible, meter=meter, recorder=pack.record_call,
                              model=args.model, reasoning_effort=None if args.reasoning_effort == "none" else args.reasoning_effort,
                              base_url=args.base_url, description=args.description or "", notes=notes, device=device,
                              timeout_s=min(600.0, args.max_wall_minutes * 60 if args.max_wall_minutes else 600.0),
                              client=client, **({"sleep": sleep} if sleep else {}))
    return AutotuneProposer(suite, program, visible, batch=args.batch, seed=args.seed)


def _print_summary(summary: dict, pack, proposal, stream) -> None:
    out = [f"\n{summary['suite_name']}/{summary['kernel']}: {summary['outcome']} after {summary['rounds']} round(s), "
           f"{summary['attempts']} attempt(s); stop reason: {summary['stop_reason']} ({summary['stop_detail']})"]
    best = summary.get("best")
    if best:
        out.append(f"winner: attempt {best['attempt']} ({best['label']}), {best['speedup_vs_initial']:.2f}× the initial "
                   f"kernel" + (f", {best['speedup_vs_approved']:.2f}× the approved (gate)" if best.get("speedup_vs_approved")
                                else "") + "; it passed the gate on every case, holdout included")
    for rejected in summary.get("rejected_by_gate", []):
        reason = (rejected.get("reason") or "").splitlines()
        out.append(f"rejected by the gate: attempt {rejected['attempt']} ({rejected['label']}): {reason[0] if reason else ''}")
    if summary.get("validation_note"):
        out.append(summary["validation_note"])
    usage = summary["usage"]
    cost = usage.get("estimated_cost_usd")
    out.append(f"model: {usage['model_calls']} call(s), {usage['total_tokens']} tokens"
               + (f", ~${cost:.4f}" if cost is not None else "") + f"; GPU {usage['gpu_seconds']:.1f} s; "
               f"wall {usage['wall_seconds']:.1f} s")
    out.append(f"audit pack: {display_path(pack.dir)} ({', '.join(summary['files'])})")
    if pack.problems:
        out.append("warning: " + "; ".join(pack.problems))
    if proposal:
        out.append(f"proposed on branch {proposal['branch']} ({proposal['commit'][:12]}): review it, then "
                   f"`{command('cudagate', 'approve', summary['suite'], summary['kernel'])}`"
                   + (" and `cudagate sign` (the launch changed)" if proposal["launch_changed"] else ""))
    print("\n".join(out), file=stream)


def main(argv: list[str] | None = None) -> int:
    """``cudagate optimize ARGS`` from Python (tests, notebooks): the same options and exit codes."""
    parser = argparse.ArgumentParser(prog="cudagate")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["optimize", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
