"""``cudagate diff``: what changed in a kernel since its approved version, concisely."""

from __future__ import annotations

import difflib
from pathlib import Path

from pytest_cudagate.trust.approvals import Ledger, variants_record
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.worker.requests import current_version
from pytest_cudagate.suite.model import Suite


def kernel_diff(suite: Suite, kernel: str, report: Path | None = None) -> list[str]:
    """Lines describing the kernel's changes against its approval (and latency, from a report)."""
    program = suite.kernel(kernel)
    ledger = Ledger.for_suite(suite)
    approval = ledger.approvals.get(kernel)
    if approval is None:
        raise CudagateError(f"{display_path(ledger.path)}: {kernel!r} has no approved version yet; "
                            f"run `{command('cudagate', 'approve', suite.path, kernel)}` on a GPU runner")
    approved, current = ledger.approved_version(approval), current_version(program)
    lines = [f"{kernel}: approved {approval.source_sha256[:12]} by {approval.approved_by} at {approval.approved_at}"
             f" (commit {(approval.git.get('commit') or 'unknown')[:12]})"]
    if current.identity == approval.identity():
        lines.append("  unchanged: source, headers, options and launch configurations match the approval")
    lines += _text_diff(approved.source, current.source, f"approved/{approval.source_sha256[:12]}.cu",
                        display_path(program.source))
    for name in sorted(set(approved.headers) | set(current.headers)):
        lines += _text_diff(approved.headers.get(name, ""), current.headers.get(name, ""),
                            f"approved:{name}", name)
    if approval.options != list(current.options):
        lines.append(f"  options: {approval.options} -> {list(current.options)}")
    variants = variants_record(program)
    for name in sorted(set(approval.classes) | set(variants)):
        before, after = approval.classes.get(name), variants.get(name)
        if before != after:
            lines.append(f"  variant of class {name}: {_variant_text(before)} -> {_variant_text(after)}")
    for case in (c for c in suite.cases if program.runs(c)):
        resolved = suite.resolved(case)
        before = resolved.launch(approved.launch_for(case))
        after = resolved.launch(current.launch_for(case))
        if before != after:
            lines.append(f"  launch for {case.name}: grid {before['grid']} block {before['block']} shared "
                         f"{before['shared_bytes']} -> grid {after['grid']} block {after['block']} shared {after['shared_bytes']}")
    if report is not None:
        lines += _latency_lines(report, suite, kernel)
    return lines


def _variant_text(variant: dict | None) -> str:
    if variant is None:
        return "none (the shared build)"
    launch = variant.get("launch")
    return f"options {variant['options']}" + (f", grid {launch['grid']} block {launch['block']} shared "
                                              f"{launch.get('shared_bytes', '0')}" if launch else ", the kernel's launch")


def _text_diff(old: str, new: str, old_name: str, new_name: str) -> list[str]:
    diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=2))
    return ["  " + line for line in diff]


def _latency_lines(report: Path, suite: Suite, kernel: str) -> list[str]:
    from pytest_cudagate.reports.fmt import interval
    from pytest_cudagate.reports.writer import read_report  # only with --report

    lines = []
    for item in read_report(report).items:  # another job's artifact: read and checked as every reader does
        estimate = item.latency and item.latency.estimate
        if item.suite != suite.name or item.kernel != kernel or not estimate:
            continue
        lines.append(f"  latency {item.case}: {(estimate.ratio - 1) * 100:+.1f}% "
                     f"{interval(estimate, confidence=False)} {item.latency.verdict.value}")
    return lines or [f"  latency: no timed case of {kernel} in {report}"]
