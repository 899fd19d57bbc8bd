"""Every value on a command line passes a typed converter (pytest_cudagate/boundary/options.py).

The test walks every parser of the `cudagate` command and the `--cuda-gate-*` options of the pytest
plugin: an argument that takes a value without a converter fails it, so an option added later
cannot skip the checks. Each number refuses nan, inf, 1e308, 10**30 and -1; each path or name
refuses '' and blanks, in one line naming the option.
"""

from __future__ import annotations

import argparse

import pytest

from pytest_cudagate.boundary.options import Number, Text
from pytest_cudagate.cli import build_parser, main
from pytest_cudagate.plugin import add_gate_options

BAD_NUMBERS = ("nan", "inf", "-inf", "1e308", str(10**30), "-1")
BAD_TEXT = ("", " ")


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(the words that reach it, the parser) for the parser and each of its sub-commands."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _takes_values(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction)]


PARSERS = dict(_parsers(build_parser()))


def _arguments():
    """(the command's words, the action) for every argument that takes a value, in every parser."""
    found = [(path, action) for path, parser in PARSERS.items() for action in _takes_values(parser)]
    plugin = argparse.ArgumentParser(add_help=False)
    add_gate_options(plugin.add_argument)  # the one definition pytest's options come from
    return found + [(("pytest",), action) for action in _takes_values(plugin)]


def _name(path, action) -> str:
    return " ".join(path) + " " + (action.option_strings[0] if action.option_strings else action.metavar or action.dest)


ARGUMENTS = _arguments()
IDS = [_name(p, a) for p, a in ARGUMENTS]


def test_the_walk_finds_every_command_and_option():
    commands = {" ".join(p) for p, _ in ARGUMENTS}
    assert {"check", "run", "approve", "diff", "keygen", "sign", "verify", "gate", "report merge", "report comment",
            "history record", "history show", "bisect", "optimize", "cases generate", "pytest"} <= commands
    assert len(ARGUMENTS) > 80


@pytest.mark.parametrize("path, action", ARGUMENTS, ids=IDS)
def test_every_argument_that_takes_a_value_has_a_converter(path, action):
    assert isinstance(action.type, (Number, Text)), (
        f"{_name(path, action)}: give it a converter of pytest_cudagate/boundary/options.py (type=...): "
        "finite(low, high), count(low, high) or nonempty(what)")
    if action.default is not None and not isinstance(action.default, (list, bool)):
        action.type(str(action.default))  # the default is within the option's own range


NUMBERS = [(p, a) for p, a in ARGUMENTS if isinstance(a.type, Number)]
TEXTS = [(p, a) for p, a in ARGUMENTS if isinstance(a.type, Text)]


@pytest.mark.parametrize("path, action", NUMBERS, ids=[_name(p, a) for p, a in NUMBERS])
def test_every_number_is_finite_and_in_range(path, action, capsys):
    for value in BAD_NUMBERS:
        with pytest.raises(argparse.ArgumentTypeError, match=r" is not (a|a whole) number"):
            action.type(value)
    if path[0] == "pytest":
        return  # the same converters; pytest words its own usage errors (tests/plugin/test_plugin.py)
    option = action.option_strings[0]
    for value in ("nan", "1e308"):  # through the command as a user gives them
        with pytest.raises(SystemExit) as exited:
            main([*path, f"{option}={value}"])
        assert exited.value.code == 2
        line, = capsys.readouterr().err.splitlines()
        assert line.startswith(f"cudagate {' '.join(path)}: {option}: {value[:40]!r} is not "), line
        assert line.endswith(f"; see `cudagate {' '.join(path)} --help`"), line


@pytest.mark.parametrize("path, action", TEXTS, ids=[_name(p, a) for p, a in TEXTS])
def test_every_path_and_name_refuses_an_empty_value(path, action, capsys):
    """An empty `$VAR` must not stand for the default (the history file inside the checkout, say)."""
    for value in BAD_TEXT:
        if value == "" and action.type.bare is not None:  # `--cuda-gate-release=` is the bare flag, documented
            assert action.nargs == "?" and action.const == action.type(value)
            continue
        with pytest.raises(argparse.ArgumentTypeError, match=r" is empty: give "):
            action.type(value)
    if path[0] == "pytest":
        return
    argv = list(path)
    if action.option_strings:
        argv.append(f"{action.option_strings[0]}=")
    else:  # a positional: '' in its place, a word in each one before it
        positionals = [a for a in _takes_values(PARSERS[path]) if not a.option_strings]
        argv += ["x"] * positionals.index(action) + [""]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    line, = capsys.readouterr().err.splitlines()
    shown = action.option_strings[0] if action.option_strings else action.metavar
    assert line.startswith(f"cudagate {' '.join(path)}: {shown}: '' is empty: give "), line


@pytest.mark.parametrize("argv, message", [
    (["bisect", "v1", "HEAD", "s", "--budget", "nan"],
     "cudagate bisect: --budget: 'nan' is not a number of seconds above 0 and at most 3600"),
    (["bisect", "v1", "HEAD", "s", "--threshold", "200"],
     "cudagate bisect: --threshold: '200' is not a number strictly between 0 and 100 (in percent: 2 = 2%; leave it out "
     "to use the suite's gate.threshold)"),
    (["bisect", "v1", "HEAD", "s", "--timeout", "nan"],
     "cudagate bisect: --timeout: 'nan' is not a number of seconds above 0 and at most 86400"),
    (["history", "record", "r", "--lock-timeout", "nan"],
     "cudagate history record: --lock-timeout: 'nan' is not a number of seconds from 0 to 86400"),
    (["history", "record", "r", "--db", ""],
     "cudagate history record: --db: '' is empty: give a path (an empty value never stands for a default); see "
     "`cudagate history record --help`"),
    (["history", "show", "--out", ""], "cudagate history show: --out: '' is empty: give a path"),
    (["report", "merge", "", "r"], "cudagate report merge: OUT_DIR: '' is empty: give a path"),
    (["approve", "s", "--runs", "0"], "cudagate approve: --runs: '0' is not a whole number from 1 to 100 (5, the "
                                      "default, gives the spread a stored baseline is judged by)"),
], ids=["bisect budget nan", "bisect threshold 200", "bisect timeout nan", "history lock-timeout nan", "history --db ''",
        "history --out ''", "report merge ''", "approve --runs 0"])
def test_the_issue_examples_are_one_line_naming_the_option_and_its_range(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith(message), line
