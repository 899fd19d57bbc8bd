"""Build the report document (:class:`~pytest_cudagate.reports.model.Report`) from one gate run: the
run (fingerprint, options), the suites (signature status) and one item per kernel × case with the
evidence; its verdict and counts follow from them."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_cudagate import __version__
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.host.paths import command
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.reports.hashes import case_hashes, relative
from pytest_cudagate.reports.locate import ItemInfo, Key, from_requests
from pytest_cudagate.reports.model import (REPORT_FORMAT, REPORT_VERSION, STATUS_ORDER, Fingerprint, Item, Report, Run,
                                           SkippedItem, Suite, regressed)
from pytest_cudagate.reports.replay_requests import request_name, runnable, with_checks
from pytest_cudagate.suite.model import DEFAULT_CLASS
from pytest_cudagate.boundary.wire import to_json

if TYPE_CHECKING:
    from pytest_cudagate.worker.build import BuildFacts


@dataclass
class Built:
    """A report document and the request files that go beside it (``requests/NAME``); the document
    may be given as its JSON form (:func:`~pytest_cudagate.boundary.wire.to_json` keeps that as it is)."""

    document: Report
    requests: dict[str, dict] = field(default_factory=dict)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def sort_items(items: list[Item | SkippedItem]) -> list[Item | SkippedItem]:
    """Failures first (latency regressions among them), then warnings, passes, skips."""
    return sorted(items, key=lambda i: (STATUS_ORDER.index(i.status), not regressed(i), i.suite, i.kernel, i.case, i.run))


def gate_flags(options: Mapping[str, Any]) -> list[str]:
    """The pytest options that change a verdict, so a reproduction judges by the same rules."""
    flags = []
    if options.get("strict"):
        flags.append("--cuda-gate-strict")
    if options.get("release"):
        flags.append("--cuda-gate-release")
    if options.get("threshold") is not None:
        flags.append(f"--cuda-gate-threshold {options['threshold']:g}")
    if options.get("budget_s") not in (None, 2.0):
        flags.append(f"--cuda-gate-budget {options['budget_s']:g}")
    return flags


def reproduce(nodeid: str, options: Mapping[str, Any], report_dir: str | None, requests: list[str]) -> list[str]:
    """The commands that run the case again: the gate on its node id, then each saved request.

    A run under ``cudagate gate --trusted-ref BASE`` is reproduced the same way, in the pull request's
    checkout: ``pytest --cuda-gate`` there would load the checkout's conftest.py and pytest settings,
    which are the pull request's code (on a maintainer's machine, beside their signing key), and
    would trust the checkout's keys instead of the base commit's."""
    quoted = "'" + nodeid.replace("'", "'\"'\"'") + "'"  # always quoted: node ids hold '::' and '[...]'
    if options.get("trusted_ref"):
        pull = f" --pull-request {int(options['pull_request'])}" if options.get("pull_request") else ""
        gate = [f"cudagate gate --trusted-ref {options['trusted_ref']}{pull} --", *gate_flags(options), quoted]
    else:
        gate = ["pytest --cuda-gate", *gate_flags(options), quoted]
    commands = [" ".join(gate)]
    for name in requests:
        path = f"{report_dir.rstrip('/')}/{name}" if report_dir else name
        commands.append(command("cudagate", "run", path))
    return commands


def _locations(info: ItemInfo, root: Path | None) -> dict[str, Any]:
    return {"suite_path": relative(info.suite_path, root) if info.suite_path else None,
            "source": relative(info.source, root) if info.source else None,
            "inputs": case_hashes(info.files, info.suite_path.parent if info.suite_path else root)}


def _outcome_item(o: CaseOutcome, info: ItemInfo, run: int, root: Path | None, options: Mapping[str, Any],
                  report_dir: str | None, tag: str, requests_out: dict[str, dict]) -> Item:
    names: list[str] = []
    number = -1
    # A generated case's arrays live only as long as the run: a saved request would point at nothing
    # (the pytest command draws them again).
    generated = bool(getattr(info.case, "generated", False))
    for role, request in [] if generated else runnable(o.requests):
        number += not role  # an approved-version request shares the number of the current one before it
        name = request_name(o.suite, o.kernel, o.case, tag, number, role)
        requests_out[name] = with_checks(request, info.suite, info.program)
        names.append(f"requests/{name}")
    return Item.of(o, nodeid=info.nodeid, run=run, **_locations(info, root), request_files=names,
                   reproduce=reproduce(info.nodeid, options, report_dir, names))


def _skipped_item(entry: tuple[str, str, str, str], info: ItemInfo, run: int, root: Path | None,
                  options: Mapping[str, Any]) -> SkippedItem:
    suite, kernel, case, kind = entry
    return SkippedItem(info.nodeid, suite, kernel, case, kind, getattr(info.case, "shape_class", DEFAULT_CLASS),
                       run=run, headline="not replayed: no CUDA device", message="not replayed: no CUDA device",
                       **_locations(info, root), reproduce=reproduce(info.nodeid, options, None, []))


def suites_section(items: Iterable[Item | SkippedItem], trust: Mapping[str | os.PathLike, str],
                   root: Path | None) -> list[Suite]:
    """One entry per suite file seen, with the signature status the runtime reported for it."""
    statuses = {relative(Path(path), root): str(status) for path, status in trust.items()}
    suites: dict[str, Suite] = {}
    for item in items:
        path = item.suite_path or item.suite
        suites.setdefault(path, Suite(item.suite, path, statuses.get(path)))
    for path, status in statuses.items():
        suites.setdefault(path, Suite(Path(path).parent.name or path, path, status))
    return sorted(suites.values(), key=lambda s: s.path)


def run_entry(fingerprint: Any, options: Mapping[str, Any], exitstatus: int | None, report_dir: str | None,
              tested: Mapping[str, int] | None = None, compiles: Iterable[BuildFacts] = ()) -> Run:
    github = None
    if os.environ.get("GITHUB_ACTIONS") == "true":
        github = {k: os.environ.get(v) for k, v in (("repository", "GITHUB_REPOSITORY"), ("run_id", "GITHUB_RUN_ID"),
                                                    ("job", "GITHUB_JOB"), ("ref", "GITHUB_REF"), ("sha", "GITHUB_SHA"),
                                                    ("server_url", "GITHUB_SERVER_URL"), ("runner", "RUNNER_NAME"))}
    return Run(
        None if fingerprint is None else Fingerprint(fingerprint.key(), fingerprint.describe(), to_json(fingerprint)),
        platform.node(), now(), __version__, exitstatus, dict(options), report_dir, github,
        None if tested is None else {name: int(tested.get(name, 0)) for name in ("failed", "errors", "passed", "skipped")},
        list(compiles))


def options_json(options: GateOptions | None, trusted_ref: str | None = None, pull_request: int | None = None) -> dict:
    """The run's options as report.json keeps them; ``trusted_ref`` and ``pull_request``: those of
    ``cudagate gate --trusted-ref BASE --pull-request N``, which its reproduction commands name."""
    found = {} if options is None else {"strict": options.strict, "release": options.release,
                                        "budget_s": options.budget_s, "threshold": options.threshold}
    return {**found, **({"trusted_ref": trusted_ref} if trusted_ref else {}),
            **({"pull_request": pull_request} if pull_request else {})}


def build_report(outcomes: list[CaseOutcome], skipped: Iterable[tuple[str, str, str, str]], *,
                 index: Mapping[Key, ItemInfo], fingerprint: Any = None, options: GateOptions | None = None,
                 trust: Mapping[str | os.PathLike, str] | None = None, root: Path | None = None,
                 exitstatus: int | None = None, report_dir: str | None = None,
                 selection: Mapping[str, Any] | None = None, trusted_ref: str | None = None,
                 pull_request: int | None = None, tested: Mapping[str, int] | None = None,
                 compiles: Iterable[BuildFacts] = ()) -> Built:
    """The report of one run. ``tested``: pytest's counts of the gate's items by outcome (passed,
    failed, skipped, errors), None outside a pytest session (the counts are then the items');
    ``compiles``: what each compile item's builds came to."""
    opts = {**options_json(options, trusted_ref, pull_request), **(selection or {})}
    tag = fingerprint.key()[:8] if fingerprint is not None else "nogpu"
    requests: dict[str, dict] = {}
    items: list[Item | SkippedItem] = []
    for o in outcomes:
        key = (o.suite, o.kernel, o.case)
        info = index.get(key) or from_requests(key, o.requests, root)
        items.append(_outcome_item(o, info, 0, root, opts, report_dir, tag, requests))
    for suite, kernel, case, kind in skipped:
        info = index.get((suite, kernel, case)) or from_requests((suite, kernel, case), [], root)
        items.append(_skipped_item((suite, kernel, case, kind), info, 0, root, opts))
    return Built(assemble([run_entry(fingerprint, opts, exitstatus, report_dir, tested, compiles)], items,
                          suites_section(items, trust or {}, root)), requests)


def assemble(runs: list[Run], items: list[Item | SkippedItem], suites: list[Suite]) -> Report:
    return Report(REPORT_FORMAT, REPORT_VERSION, now(), __version__, runs, suites, sort_items(items))
