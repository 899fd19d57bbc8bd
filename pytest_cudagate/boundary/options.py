"""Command-line values: every argument of ``cudagate`` and every ``--cuda-gate-*`` option is read by
one of these converters (argparse's ``type=``), so a bad value is refused while the command line
is parsed, in one line that names the option and what it accepts.

A number is finite and within its option's range (``nan``, ``inf`` and ``1e308`` pass
``float()``); a path or name is not empty (an empty ``$VAR`` must not stand for the default, say
the history file inside the checkout). tests/boundary/test_options.py walks every parser and refuses an
option without a converter. Light: the pytest plugin imports it on every run.
"""

from __future__ import annotations

import argparse


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


class Number:
    """An argparse ``type=``: the text given to a number within its range, or :class:`argparse.ArgumentTypeError`."""

    def __init__(self, cast: type, low: float, high: float, *, above: bool = False, below: bool = False,
                 unit: str = "", hint: str = ""):
        self.cast, self.low, self.high, self.above, self.below = cast, low, high, above, below
        noun, form = ("a whole number", ",") if cast is int else ("a number", "g")
        low_text, high_text = format(low, form), format(high, form)
        bounds = (f"strictly between {low_text} and {high_text}" if above and below
                  else f"above {low_text} and at most {high_text}" if above
                  else f"from {low_text} to {high_text}")
        self.accepts = f"{noun}{f' of {unit}' if unit else ''} {bounds}" + (f" ({hint})" if hint else "")

    def __call__(self, text: str):
        try:
            value = self.cast(text)
            # every comparison with nan is false, and inf is beyond any bound
            within = ((self.low < value if self.above else self.low <= value)
                      and (value < self.high if self.below else value <= self.high))
        except (ValueError, OverflowError):  # int() of '1e3' or of 5000 digits
            within = False
        if not within:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not {self.accepts}")
        return value


class Text:
    """An argparse ``type=``: the text given, if it is some."""

    def __init__(self, what: str, *, bare: str | None = None):
        self.what = what
        self.bare = bare  # an optional value's bare flag: the one value '' may stand for

    def __call__(self, text: str) -> str:
        if text == "" and self.bare is not None:
            return self.bare
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{_shown(text)} is empty: give {self.what} (an empty value never "
                                             "stands for a default)")
        if "\0" in text:
            raise argparse.ArgumentTypeError(f"{_shown(text)} holds a NUL character: give {self.what}")
        return text


def finite(low: float, high: float, *, above: bool = False, below: bool = False, unit: str = "",
           hint: str = "") -> Number:
    """A float from ``low`` to ``high`` (``above``/``below``: the bound itself excluded)."""
    return Number(float, low, high, above=above, below=below, unit=unit, hint=hint)


def count(low: int, high: int, *, unit: str = "", hint: str = "") -> Number:
    """A whole number from ``low`` to ``high``."""
    return Number(int, low, high, unit=unit, hint=hint)


def nonempty(what: str = "a value") -> Text:
    """A path, name or text: not empty, not blank, no NUL."""
    return Text(what)


def ref_or_bare(what: str) -> Text:
    """An optional value (``nargs="?"``, ``const=""``) whose written-out empty form ``--opt=`` is the bare flag."""
    return Text(what, bare="")


# The options several commands share, one range each.
MAX_WAIT_S = 86400.0  # a day: the longest watchdog [tool.cudagate] timeout_s allows
TIMEOUT_S = finite(0, MAX_WAIT_S, above=True, unit="seconds")
LOCK_TIMEOUT_S = finite(0, MAX_WAIT_S, unit="seconds")
BUDGET_S = finite(0, 3600, above=True, unit="seconds")  # measurement per case: the default is 2
PATH = nonempty("a path")
NAME = nonempty("a name")
# `cudagate sign`, `approve` and `gate`: the pull request a signing is for, or the one gated
PULL_REQUEST = count(1, 10**9, hint="the pull request's number; in a workflow github.event.pull_request.number")


class OneLineParser(argparse.ArgumentParser):
    """``cudagate``'s parsers: a usage error is one line (the command, the option, what it accepts),
    as every other refusal of the command is; ``--help`` shows the usage."""

    def error(self, message: str):
        message = message.removeprefix("argument ")
        self.exit(2, f"{self.prog}: {message}; see `{self.prog} --help`\n")

