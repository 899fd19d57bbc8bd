"""The hooks a ``conftest.py`` or an installed plugin implements to extend a ``--cuda-gate`` run
without editing cudagate: fields in report.json, more output formats, more library adapters.

Added by :func:`pytest_cudagate.plugin.pytest_addhooks` on every pytest run, so it imports pytest and
the standard library only. Called only under ``--cuda-gate``; ``cudagate gate --trusted-ref`` loads
no conftest.py and no plugin, so a pull request's implementations never run there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


class ReportWriter(Protocol):
    """An output format written beside report.json: :meth:`write` is given the report as report.json
    holds it and the report folder, and writes its files there."""

    name: str  # how messages name it

    def write(self, report: dict[str, Any], folder: Path) -> None: ...


@pytest.hookspec
def pytest_cudagate_update_report(config: pytest.Config, report: dict[str, Any]) -> None:
    """Add fields to ``report`` (the report.json document) just before it is checked and written.

    Put them under ``report["extra"]``, a free-form object (JSON values only) that report.schema.json
    allows at the top level; anything else a hook changes is refused by the schema check, and
    report.json is then written without the hook's changes.
    """


@pytest.hookspec
def pytest_cudagate_report_writers(config: pytest.Config) -> Iterable[ReportWriter]:
    """Return :class:`ReportWriter` objects to run after report.json is written (under
    ``--cuda-gate-report DIR`` only)."""


@pytest.hookspec
def pytest_cudagate_library_adapters(config: pytest.Config) -> Mapping[str, str]:
    """Return ``{name: "module:ATTRIBUTE"}``: library adapters (``cudagate_harness.library.Adapter``)
    that suites may name in ``library_baseline: {adapter: name}``.

    The module is imported by the pytest process (the suite loader reads the adapter's roles) and by
    the harness worker, a separate process, when a case asks for the baseline: it must be importable
    there too, as an installed package or from ``PYTHONPATH`` (the worker starts in ``/``, never in
    the project's folder).
    """
