"""Calling the hooks of :mod:`pytest_cudagate.hookspecs`: each implementation on its own, so that what
one returns wrong or raises is one line naming its plugin (a conftest.py by its path), never a
traceback and never a lost report.

Imported by the plugin's configure under ``--cuda-gate``, before the worker starts: the standard
library only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_cudagate.errors import CudagateError, FileError

if TYPE_CHECKING:
    import pytest

    from pytest_cudagate.hookspecs import ReportWriter

# cudagate_harness.library.ADAPTERS_ENV, spelled here: the harness imports numpy, and the worker's
# environment is made before anything heavy is imported (tests/plugin/test_hookspecs.py ties the two).
ADAPTERS_ENV = "CUDAGATE_LIBRARY_ADAPTERS"
_WHERE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*\Z")


class ExtensionError(CudagateError):
    """A plugin's hook raised or returned something cudagate cannot use; the message names it."""


def _plugin(config: pytest.Config, impl) -> str:
    """A conftest.py by its path from the root folder, an installed plugin by its name."""
    name = str(impl.plugin_name)
    try:
        return str(Path(name).relative_to(config.rootpath))
    except ValueError:
        return name


def results(config: pytest.Config, hook: str, problems: list[str] | None = None,
            **kwargs: Any) -> list[tuple[str, Any]]:
    """``(plugin, what it returned)`` for each implementation of ``hook`` that returned something,
    in pytest's order; one that raises is a line in ``problems``, or without it an
    :class:`ExtensionError`, naming it."""
    found = []
    for impl in reversed(getattr(config.hook, hook).get_hookimpls()):  # pluggy calls the last added first
        who = _plugin(config, impl)
        try:
            result = impl.function(*(dict(config=config, **kwargs)[arg] for arg in impl.argnames))
        except Exception as exc:
            line = f"{hook} of {who} raised {type(exc).__name__}: {exc}"
            if problems is None:
                raise ExtensionError(line) from None
            problems.append(line)
            continue
        if result is not None:
            found.append((who, result))
    return found


def library_adapters(config: pytest.Config) -> dict[str, str]:
    """The adapters the run's plugins add, ``{name: "module:ATTRIBUTE"}``; the worker imports them
    itself, so nothing else can be passed."""
    adapters: dict[str, str] = {}
    for who, returned in results(config, "pytest_cudagate_library_adapters"):
        if not isinstance(returned, dict):
            raise ExtensionError(f"pytest_cudagate_library_adapters of {who} returned a {type(returned).__name__}; "
                                 'return {name: "module:ATTRIBUTE"}, the module importable by the harness worker')
        for name, where in returned.items():
            if not (isinstance(name, str) and name and isinstance(where, str) and _WHERE.match(where)):
                raise ExtensionError(f"pytest_cudagate_library_adapters of {who}: {name!r}: {where!r} is not "
                                     '"module:ATTRIBUTE"; the worker imports the adapter by that path, so '
                                     "nothing else can be passed")
            if adapters.get(name, where) != where:
                raise ExtensionError(f"pytest_cudagate_library_adapters of {who}: {name!r} is already "
                                     f"{adapters[name]}")
            adapters[name] = where
    return adapters


def worker_env(adapters: dict[str, str]) -> dict[str, str]:
    """What the harness worker's environment says of ``adapters`` (always set: an inherited value
    never adds one)."""
    return {ADAPTERS_ENV: json.dumps(adapters, sort_keys=True)}


def register_adapters(config: pytest.Config, adapters: dict[str, str]) -> None:
    """Add ``adapters`` to this process's registry, for the suite loader and the judge, until pytest
    unconfigures."""
    from cudagate_harness import library

    for name, where in adapters.items():
        try:
            library.register(name, where)
        except library.LibraryUnavailable as exc:
            raise ExtensionError(f"pytest_cudagate_library_adapters: {exc}") from None
        config.add_cleanup(lambda name=name: library.ADAPTERS.pop(name, None))


def update_report(config: pytest.Config, document: dict,
                  check: Callable[[dict, Path], None]) -> tuple[dict, list[str]]:
    """``document`` with what the plugins add (:func:`~pytest_cudagate.hookspecs.pytest_cudagate_update_report`),
    and a line for each that failed; a failing plugin's changes (those ``check``, the report's, raises
    FileError on) are left out, never the report."""
    import copy

    problems = []
    for impl in reversed(config.hook.pytest_cudagate_update_report.get_hookimpls()):
        who = _plugin(config, impl)
        changed = copy.deepcopy(document)  # the plugin's copy: kept only if it is a valid report
        changed.setdefault("extra", {})
        try:
            impl.function(*(dict(config=config, report=changed)[arg] for arg in impl.argnames))
            if not changed["extra"]:
                del changed["extra"]
            check(changed, Path("report.json"))
        except FileError as exc:
            problems.append(f"pytest_cudagate_update_report of {who} made report.json invalid: {exc.problems[0]}; "
                            'add fields under report["extra"]; the report is written without them')
            continue
        except Exception as exc:
            problems.append(f"pytest_cudagate_update_report of {who} raised {type(exc).__name__}: {exc}; "
                            "the report is written without its fields")
            continue
        document = changed
    return document, problems


def report_writers(config: pytest.Config) -> tuple[list[tuple[str, ReportWriter]], list[str]]:
    """``(plugin, writer)`` for each writer the plugins return, and a line for each that is not one."""
    writers: list[tuple[str, ReportWriter]] = []
    problems: list[str] = []
    for who, found in results(config, "pytest_cudagate_report_writers", problems):
        for writer in found if isinstance(found, (list, tuple)) else [found]:
            if isinstance(getattr(writer, "name", None), str) and callable(getattr(writer, "write", None)):
                writers.append((who, writer))
            else:
                problems.append(f"pytest_cudagate_report_writers of {who} returned {type(writer).__name__}, not a "
                                "writer (a name and write(report, folder))")
    return writers, problems


def run_writers(writers: list[tuple[str, ReportWriter]], report: dict, folder: Path) -> list[str]:
    """Run each writer on its own; a line for each that raised."""
    problems = []
    for who, writer in writers:
        try:
            writer.write(report, folder)
        except Exception as exc:
            problems.append(f"report writer {writer.name!r} of {who} failed: {type(exc).__name__}: {exc}; "
                            "report.json and report.html are written")
    return problems
