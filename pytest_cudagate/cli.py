"""The ``cudagate`` command. Every subcommand is listed from :data:`pytest_cudagate.commands.COMMANDS`
(standard library only), and only the module of the one that runs is imported: ``cudagate --help``
loads neither numpy, jsonschema nor gitpython.

Exit codes: 0 all good, 1 a check or replay failed, 2 bad input (the message names file and fix),
3 no CUDA device where one is needed.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Iterable

from pytest_cudagate import __version__
from pytest_cudagate.boundary.options import OneLineParser
from pytest_cudagate.commands import COMMANDS
from pytest_cudagate.host.paths import run_command


def build_parser(wanted: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The command's parser: the subcommands in ``wanted`` (None: all) in full, each by its module's
    ``register``; the others by name and help alone."""
    parser = OneLineParser(prog="cudagate", description="CI regression gate for CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"cudagate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    full = COMMANDS if wanted is None else [name for name in wanted if name in COMMANDS]
    for module in dict.fromkeys(COMMANDS[name].module for name in full):  # each adds all of its commands
        importlib.import_module(module).register(sub)
    for name, command in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=command.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    program = argv is None  # the process is this command (not a caller passing its arguments)
    argv = sys.argv[1:] if program else list(argv)
    named = next((arg for arg in argv if not arg.startswith("-")), None)  # the top level has no option taking a value
    args = build_parser([named] if named else []).parse_args(argv)
    if program:
        # The command's modules are loaded and stay until the process ends: frozen, they are not walked
        # again by every later garbage collection (pytest's at its end among them).
        gc.freeze()
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
