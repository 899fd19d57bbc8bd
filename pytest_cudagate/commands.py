"""The ``cudagate`` command's subcommands, in the order ``cudagate --help`` lists them: each one's
module (whose ``register(subparsers)`` adds its parser) and one-line help. Standard library only:
:mod:`pytest_cudagate.cli` lists them all from here and imports the one module that is run."""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    module: str
    help: str


_SUITES = "pytest_cudagate.suite_commands"
_TRUST = "pytest_cudagate.trust.cli"
COMMANDS: dict[str, Command] = {
    "check": Command(_SUITES, "validate suites, their case data, and compile every kernel (no GPU needed)"),
    "init": Command(_SUITES, "write a suite skeleton (cudagate.yaml, reference.py) from a kernel's parameters"),
    "run": Command(_SUITES, "replay one harness request file on the GPU and print per-case results as JSON"),
    "approve": Command(_SUITES, "record the current kernel(s) as approved, with baselines measured on this GPU"),
    "diff": Command(_SUITES, "show what changed in a kernel since its approved version"),
    "keygen": Command(_TRUST, "create an Ed25519 signing key pair for a maintainer"),
    "sign": Command(_TRUST, "sign a suite's cases, reference and tolerances (writes cudagate.sig.json)"),
    "verify": Command(_TRUST, "check a suite against its signature and the trusted keys"),
    "gate": Command(_TRUST, "run the gate as CI does: without the checkout's pytest configuration; with "
                            "--trusted-ref, trusting only the keys, policy and ledgers of that commit"),
    "report": Command("pytest_cudagate.reports.cli", "work with gate reports (report.json folders)"),
    "history": Command("pytest_cudagate.history.cli", "the run history: record reports' timed cases by commit "
                                                      "(SQLite), show latency over commits as a page"),
    "bisect": Command("pytest_cudagate.bisect.search", "find the first commit from GOOD to BAD where a case got "
                                                       "slower than at GOOD, timing the kernel's approved versions "
                                                       "read from git"),
    "optimize": Command("pytest_cudagate.optimize.cli", "search for a faster kernel (model, autotune or replay); the "
                                                        "winner must pass the gate"),
    "cases": Command(_SUITES, "manage case data"),
}
