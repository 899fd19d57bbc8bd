"""``cudagate gate``: the gate as CI runs it, without the pull request's pytest configuration.

``pytest --cuda-gate`` reads the checkout's pytest configuration: ``addopts`` in pyproject.toml, a
``conftest.py``, ``PYTEST_ADDOPTS``... all of which a pull request controls. ``cudagate gate`` runs
pytest in-process with a configuration file it writes itself (``-c``), ``--noconftest``, no plugin
autoloading, no cache, an explicit ``--rootdir``, and no pytest variables from the environment; no
Python file of the checkout is collected. With ``--trusted-ref SHA`` it also reads the trust root
from that commit's git objects (:mod:`.base_ref`) and hands it to the plugin, refuses the options
that would weaken the gate, and refuses a change that deletes, moves, renames or swaps a suite the
trusted commit gates, or drops one of its kernels. ``--pull-request N`` (from the workflow) adds that a
signed state other than the base's counts only when it was signed for pull request N.
Without ``--trusted-ref`` it is ``pytest --cuda-gate`` with the same isolation.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pytest_cudagate.commands import COMMANDS
from pytest_cudagate import boundary
from pytest_cudagate.boundary import walk
from pytest_cudagate.boundary.options import PATH, PULL_REQUEST, nonempty
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.reports import github
from pytest_cudagate.suite.loader import discover, load_suite
from pytest_cudagate.trust.base_ref import read_trust_root
from pytest_cudagate.config import DEFAULT_BUDGET_S
from pytest_cudagate.plugin import add_gate_options

TRUST_ROOT_OPTION = "--cuda-gate-trust-root"
RELEASE_OPTION = "--cuda-gate-release"  # passes: judging against the previous release adds checks
# Options that would switch a check off or loosen it; refused under --trusted-ref.
WEAKENING = {
    "--cuda-gate-allow-unsigned": "it would judge suites whose oracle or approvals are not signed",
    TRUST_ROOT_OPTION: "the gate hands the trust root to the plugin itself",
    "--cuda-gate-fresh-seed": "a seed known in advance makes the fresh inputs predictable",
    "--cuda-gate-class": "it leaves the performance cases of other shape classes untimed; the trusted gate runs them all",
}
# Kept for options added later: one named like these is refused until it is judged harmless here.
WEAKENING_PREFIXES = {
    "--cuda-gate-allow-": "options that allow what the gate refuses are off under --trusted-ref",
    "--cuda-gate-skip-": "options that skip checks (release checks included) are off under --trusted-ref",
    "--cuda-gate-no-": "options that skip checks are off under --trusted-ref",
}
# Options of the checkout's own pytest setup that the gate ignores, so it says so.
PYTEST_CONFIG_FILES = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "conftest.py")
_ENV_DROPPED = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
_TAKES_VALUE = {"--cuda-gate-threshold", "--cuda-gate-budget", "--cuda-gate-arch", "--cuda-gate-timeout",
                "--cuda-gate-fresh-seed", "--cuda-gate-lock-timeout", "--cuda-gate-report", "--cuda-gate-benchmark-json",
                "--cuda-gate-class", "--cuda-gate-durations", "--junitxml", TRUST_ROOT_OPTION}
_PASSTHROUGH = {"-q", "-v", "-vv", "-x", "-rA", "-ra", "-rf", "-rs", "-rfs", "--quiet", "--verbose", "--exitfirst"}


def _plugin_options(*, leave_out: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The plugin's --cuda-gate* options as pytest defines them (plugin.add_gate_options)."""
    parser = argparse.ArgumentParser(prog="cudagate gate", add_help=False, usage=argparse.SUPPRESS)
    add_gate_options(lambda *flags, **kwargs: flags[0] in leave_out or parser.add_argument(*flags, **kwargs))
    return parser


def _refusal(option: str) -> str | None:
    name = option.split("=", 1)[0]
    if name in WEAKENING:
        return WEAKENING[name]
    if name.startswith("--cuda-gate") and name not in _plugin_options()._option_string_actions:
        return ("no such option, and none skips a check: the trusted gate runs them all; "
                "`cudagate gate --help` lists the options it forwards")
    for prefix, why in WEAKENING_PREFIXES.items():
        if name.startswith(prefix):
            return why
    if name.startswith("--cuda-gate") or name in _PASSTHROUGH or name.startswith("--junitxml"):
        return None
    return "the gate's pytest command line is fixed under --trusted-ref; only --cuda-gate-* and report options pass"


def _option_value(options: list[str], name: str) -> str | None:
    for i, option in enumerate(options):
        if option == name and i + 1 < len(options):
            return options[i + 1]
        if option.startswith(name + "="):
            return option.split("=", 1)[1]
    return None


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(pytest options with their values, suite paths) of the arguments after ``cudagate gate``."""
    options, paths = [], []
    pending = False
    for arg in args:
        if arg == RELEASE_OPTION:
            arg += "="  # its value is optional: bare, it must not take the suite path put after it (REF: =REF)
        if pending or arg.startswith("-"):
            options.append(arg)
            pending = not pending and arg in _TAKES_VALUE
        else:
            paths.append(arg)
    return options, paths


def _weakening_problems(options: list[str], suites) -> list[str]:
    problems = []
    seen: set[str] = set()
    for option in options:
        if not option.startswith("-"):
            continue
        name = option.split("=", 1)[0]
        why = _refusal(option)
        if why:
            problems.append(f"{name}: refused under --trusted-ref: {why}")
        if name.startswith("--cuda-gate") and name in seen:
            # pytest keeps the last value; the checks here read the first
            problems.append(f"{name}: given twice; refused under --trusted-ref: give each option once")
        seen.add(name)
    budget = _option_value(options, "--cuda-gate-budget")
    try:
        short = budget is not None and not float(budget) >= DEFAULT_BUDGET_S
    except ValueError:
        short = True
    if short:
        problems.append(f"--cuda-gate-budget {budget}: refused under --trusted-ref: less measurement than the "
                        f"default {DEFAULT_BUDGET_S:g} s weakens the latency verdicts")
    threshold = _option_value(options, "--cuda-gate-threshold")
    if threshold is not None:
        try:
            value = float(threshold)
        except ValueError:
            problems.append(f"--cuda-gate-threshold {threshold!r}: not a number")
            value = None
        for suite in suites if value is not None else ():
            if value > suite.threshold:
                problems.append(f"--cuda-gate-threshold {threshold}: refused under --trusted-ref: wider than the "
                                f"threshold {suite.threshold:g} signed in {display_path(suite.path)}")
    return problems


def _ignored_configs(worktree: Path) -> list[str]:
    notes = []
    try:
        conftests = [p for p in walk(worktree, "checkout", skip=(".git",)) if p.name == "conftest.py"]
    except FileError as exc:  # these notes alone need the search: the gate loads no conftest.py either way
        conftests = []
        notes.append(f"cudagate gate: not looking for conftest.py files to ignore: {exc.path}: {exc.problems[0]}")
    for name in PYTEST_CONFIG_FILES:
        for path in conftests if name == "conftest.py" else [worktree / name]:
            if path.is_file():
                notes.append(f"cudagate gate: ignoring {display_path(path)}: the gate runs without the checkout's "
                             "pytest configuration")
    pyproject = worktree / "pyproject.toml"
    try:
        text = boundary.read_text(pyproject, boundary.MAX_SETTINGS_BYTES, "project settings file")
    except FileNotFoundError:
        text = ""
    except FileError as exc:  # the trusted settings come from the ref; this only words a note
        text = ""
        notes.append(f"cudagate gate: not reading {display_path(pyproject)}: {exc.problems[0]}")
    if "[tool.pytest" in text:
        notes.append(f"cudagate gate: ignoring [tool.pytest.ini_options] in {display_path(pyproject)} (addopts "
                     "included): the gate runs without the checkout's pytest configuration")
    return notes


def _config_text(policy: dict) -> str:
    """The gate's own pytest configuration: collect no Python file of the checkout, add no options."""
    lines = ["# written by `cudagate gate`; the checkout's pytest configuration is not read", "[pytest]",
             "addopts =", "python_files = cudagate-gate-collects-no-python-files", "testpaths ="]
    lines += [f"# [tool.cudagate] at the trusted ref: {key} = {value!r}" for key, value in sorted(policy.items())]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _isolated_environment():
    saved = {name: os.environ.get(name) for name in (*_ENV_DROPPED, "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    for name in _ENV_DROPPED:
        os.environ.pop(name, None)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Where a child process looks for programs and modules: git, compute-sanitizer and the worker's python.
_SEARCH_PATHS = ("PATH", "PYTHONPATH")


@contextlib.contextmanager
def without_checkout(worktree: Path):
    """sys.path without the checkout's folders, and PATH and PYTHONPATH (which every child process
    inherits) without them or any relative entry. Run as ``python -m`` or ``-c`` from the checkout, the
    current folder comes first on sys.path, and a module first imported during the run (pdb, cuda,
    whatever the reference imports) would be the pull request's; a relative PATH entry ('.', 'bin')
    resolves in the folder a child starts in, and git starts in the checkout. The interpreter's own
    environment stays, even where it lies inside the checkout (a local .venv). A module the
    interpreter imported before the gate started is beyond its reach: CI runs ``python -I``, whose
    sys.path holds no checkout folder."""
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    environments = [path for path in (Path(p).resolve() for p in prefixes) if path.is_relative_to(worktree)]

    def in_checkout(entry: str) -> bool:
        path = Path(entry or os.curdir).resolve()
        return path.is_relative_to(worktree) and not any(path.is_relative_to(env) for env in environments)

    saved, saved_env = list(sys.path), {name: os.environ.get(name) for name in _SEARCH_PATHS}
    sys.path[:] = [entry for entry in sys.path if not (isinstance(entry, str) and in_checkout(entry))]
    for name in _SEARCH_PATHS:
        if name in os.environ:
            kept = [e for e in os.environ[name].split(os.pathsep) if os.path.isabs(e) and not in_checkout(e)]
            # an empty PATH would search the current folder
            os.environ[name] = os.pathsep.join(kept) or (os.defpath if name == "PATH" else "")
    try:
        yield
    finally:
        sys.path[:] = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def checkout_root(repo: str | Path | None) -> Path:
    """The working tree of the repository at ``repo`` (default: the current folder), or ``repo`` itself."""
    import git  # gitpython (~35 ms): only where a checkout's root is looked up

    start = Path(repo or Path.cwd())
    try:
        return Path(git.Repo(start, search_parent_directories=True, expand_vars=False).working_tree_dir).resolve()
    except (git.exc.GitError, TypeError):
        return start.resolve()


def cmd_gate(args) -> int:
    github.stop_commands()  # first: no name or log of the checkout printed from here on is a workflow command
    worktree = checkout_root(args.repo)
    rest = list(args.pytest_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    options, paths = split_args(rest)
    if args.pull_request is not None and args.trusted_ref is None:
        raise CudagateError(f"--pull-request {args.pull_request}: needs --trusted-ref BASE (the pull request's base "
                            "commit): a pull request's signed state is judged against its base")
    # first too: reading the trust root runs git in the checkout
    with without_checkout(worktree), tempfile.TemporaryDirectory(prefix="cudagate-gate-") as tmp:
        policy = {}
        extra = []
        if args.trusted_ref is not None:  # an empty ref is refused, never a run without a trust root
            root = read_trust_root(worktree, args.trusted_ref)
            root.pull_request = args.pull_request
            policy = root.policy
            suite_paths = [worktree / p for p in (paths or list(root.settings().suites) or ["."])]
            found = discover(suite_paths, worktree)
            problems = root.suite_problems(found)
            suites = []
            for path in found:
                try:
                    suites.append(load_suite(path))
                except CudagateError:
                    continue  # a broken suite becomes a failed item under pytest
            problems += _weakening_problems(options, suites)
            if problems:
                raise CudagateError("the gate refuses to run:\n" + "\n".join(f"  - {p}" for p in problems))
            trust_file = Path(tmp) / "trust-root.json"
            root.save(trust_file)
            extra = [TRUST_ROOT_OPTION, str(trust_file)]
            print(f"cudagate gate: trust root from {root.ref[:12]} ({len(root.keys)} trusted key(s): "
                  f"{', '.join(sorted(root.keys)) or 'none'})"
                  + (f"; a changed signed state must be signed for pull request {args.pull_request}"
                     if args.pull_request else ""))
        else:
            suite_paths = [worktree / p for p in paths] if paths else []
        for note in _ignored_configs(worktree):
            print(note)
        config = Path(tmp) / "pytest.ini"
        config.write_text(_config_text(policy), encoding="utf-8")
        argv = ["-c", str(config), "--rootdir", str(worktree), "--noconftest", "-p", "no:cacheprovider",
                "-p", "no:doctest", "-o", "addopts=", "-p", "pytest_cudagate.plugin", "--cuda-gate", *extra, *options,
                *[str(p) for p in suite_paths]]
        from pytest_cudagate.items import CheckoutCollection  # the plugin imports it anyway; `cudagate verify` need not

        with _isolated_environment():
            sys.stdout.flush()
            return int(pytest.main(argv, plugins=[CheckoutCollection()]))


def _forwarded_help() -> str:
    """The epilog of ``cudagate gate --help``: the plugin's options, as ``pytest --help`` words them."""
    # --cuda-gate itself: the command adds it
    listed = _plugin_options(leave_out=("--cuda-gate",)).format_help().split("\n", 1)[1]  # after the section title
    refused = ", ".join(name for name in WEAKENING if name != TRUST_ROOT_OPTION)
    return (f"pytest options it forwards (after --):\n{listed}\n" + textwrap.fill(
        f"Under --trusted-ref these are refused: {refused}, a --cuda-gate-budget below {DEFAULT_BUDGET_S:g} "
        "and a --cuda-gate-threshold wider than a suite's signed gate.threshold.", 78, break_on_hyphens=False))


def register(subparsers) -> None:
    gate = subparsers.add_parser(
        "gate", help=COMMANDS["gate"].help,
        epilog=_forwarded_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    gate.add_argument("--trusted-ref", type=nonempty("the base commit"), metavar="SHA",
                      help="the base commit: keys, [tool.cudagate] and ledgers are read from its git objects")
    gate.add_argument("--pull-request", type=PULL_REQUEST, metavar="N",
                      help="the pull request gated (from the workflow: github.event.pull_request.number, never the "
                           "checkout): a suite whose signed state differs from the trusted ref's must have been signed "
                           "for it (`cudagate sign SUITE --pull-request N`); needs --trusted-ref")
    gate.add_argument("--repo", type=PATH, metavar="DIR", help="the checkout to judge (default: the repository at the current folder)")
    gate.add_argument("pytest_args", nargs="*", type=nonempty("a suite path or an option"), metavar="ARG",
                      help="suite paths and --cuda-gate-* options (after --)")
    gate.set_defaults(func=cmd_gate)
