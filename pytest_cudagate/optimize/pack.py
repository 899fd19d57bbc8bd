"""The audit pack: ``results/run-NNN/``, a new folder per run, never overwritten.

- ``history.json``: every attempt, per-case detail, launch, latencies, rejection reason, gate result
  (``schemas/optimize-history.schema.json``); rewritten after each attempt.
- ``summary.json``: outcome, stop reason, best candidate per case, speedups, what the final gate
  said about it (per case and as a whole), tokens, estimated cost, GPU and wall time, device, git
  state, the review branch after ``--propose``, and oracle hashes (``optimize-summary``).
- ``model-NNN.json``: each model request and response with its usage (``optimize-model-call``).
- ``best.cu`` and ``best-case-N.json`` (harness requests that replay the winner with ``cudagate
  run``, expected outputs and tolerances included; N counts the suite's cases from 1; none for a
  generated case, whose arrays the gate draws again), when a candidate passed the gate.
- ``heatmap.png`` / ``heatmap.svg`` (latency per case per round) and ``report.html``.

Every file is written whole, through a temporary file and a rename, so an interrupted run leaves
each file either as it was or complete. Secrets (the API key, a signing key, anything in an
environment variable whose name says KEY/TOKEN/SECRET) are masked in every text before it is
written.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from pytest_cudagate import __version__
from pytest_cudagate.trust.approvals import git_state
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.suite.expr import ExprError
from pytest_cudagate.optimize.evaluator import finite
from pytest_cudagate.host.scrub import Scrubber
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.boundary.schema import problems as schema_problems
from pytest_cudagate.optimize.budgets import STOP_REASONS
from pytest_cudagate.optimize.heatmap import write_heatmaps
from pytest_cudagate.optimize.report import render
from pytest_cudagate.trust import collect_manifest, instance_manifest
from pytest_cudagate.optimize.loop import geomean

FORMAT = 1
_RUN = re.compile(r"^run-(\d+)$")


def allocate(results: Path) -> Path:
    """A new ``run-NNN`` folder below ``results`` (created exclusively: two runs never share one)."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in results.iterdir() if (m := _RUN.match(p.name))]
    number = max(numbers, default=0) + 1
    while True:
        folder = results / f"run-{number:03d}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            number += 1


def _json_safe(value):
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class AuditPack:
    def __init__(self, results: Path, *, suite, program, device: dict | None = None, proposer: dict | None = None,
                 settings: dict | None = None, trust: str = "", on_problem=None):
        self.dir = allocate(results)
        self.suite, self.program = suite, program
        self.device = device or {}
        self.proposer = proposer or {}
        self.settings = settings or {}
        self.trust = trust
        self.scrubber = Scrubber()
        self.calls = 0
        self.problems: list[str] = []  # schema violations of what was written (a bug of ours: reported, not fatal)
        self.on_problem = on_problem or (lambda message: None)
        self.optimizer = None
        self.git = git_state(suite.root)
        self.summary: dict = {}
        self.history: dict = {}

    @property
    def name(self) -> str:
        return self.dir.name

    # -- writing -------------------------------------------------------------------------------------
    def write_text(self, name: str, text: str) -> Path:
        path = self.dir / name
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(self.scrubber.text(text))
        os.replace(tmp, path)
        return path

    def write_bytes(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
        return path

    def write_json(self, name: str, document, schema: str | None = None) -> Path:
        document = self.scrubber.data(_json_safe(document))
        if schema:
            found = schema_problems(document, schema)
            if found:
                message = f"{name} does not match schemas/{schema}.schema.json: {found[0]}"
                self.problems.append(message)
                self.on_problem(message)
        return self.write_text(name, json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False) + "\n")

    # -- the loop's hooks ------------------------------------------------------------------------------
    def record_call(self, record: dict) -> str:
        self.calls += 1
        name = f"model-{self.calls:03d}.json"
        self.write_json(name, {"format": FORMAT, "call": self.calls, "run": self.name, **record}, "optimize-model-call")
        if self.optimizer is not None:
            self.optimizer.call_recorded(name)
        return name

    def begin(self, optimizer) -> None:
        self.optimizer = optimizer
        self.write_json("history.json", history_doc(self, optimizer), "optimize-history")
        self.write_json("summary.json", summary_doc(self, optimizer, status="running"), "optimize-summary")

    def attempt(self, optimizer, attempt) -> None:
        self.write_json("history.json", history_doc(self, optimizer), "optimize-history")
        self.write_json("summary.json", summary_doc(self, optimizer, status="running"), "optimize-summary")

    def finish(self, optimizer) -> dict:
        files = []
        winner = optimizer.winner
        if winner is not None:
            self.write_text("best.cu", winner.candidate.text)
            files.append("best.cu")
            files += self.write_replays(winner)

        status = "interrupted" if optimizer.stop_reason == "interrupted" else "finished"
        history = history_doc(self, optimizer)
        self.write_json("history.json", history, "optimize-history")
        summary = summary_doc(self, optimizer, status=status)
        summary["files"] = files + write_heatmaps(self, summary, history)
        self.write_json("summary.json", summary, "optimize-summary")
        self.summary, self.history = summary, history
        return self.write_report()

    def record_proposal(self, proposal: dict) -> dict:
        """After ``--propose``: the review branch goes into summary.json and report.html."""
        self.summary["review_branch"] = {k: proposal[k] for k in ("branch", "commit", "base", "files", "launch_changed")}
        return self.write_report()

    def write_report(self) -> dict:
        self.write_text("report.html", render(self.summary, self.history, self.dir))
        self.summary["files"] = sorted(p.name for p in self.dir.iterdir() if p.is_file() and not p.name.startswith("."))
        self.write_json("summary.json", self.summary, "optimize-summary")
        return self.summary

    def write_replays(self, winner) -> list[str]:
        """``best-case-N.json``: ``cudagate run`` requests replaying the winner on case N (from 1)."""
        written = []
        program = winner.candidate.program(self.program)
        for number, case in replayable_cases(self.suite):
            timing = self.suite.timing.to_json() if case.kind == "performance" else None
            request = run_request(self.suite, program, [case], output_dir=Path("outputs"), timing=timing, expected=True,
                                  source_text=winner.candidate.text)
            request["output_dir"] = "outputs"
            for entry in request["cases"]:  # paths in a request file are relative to it
                for spec in entry["buffers"].values():
                    if "input" in spec:
                        spec["input"] = _relative(spec["input"], self.dir)
                entry["expected"] = {k: _relative(v, self.dir) for k, v in entry.get("expected", {}).items()}
            name = f"best-case-{number}.json"
            self.write_json(name, request, "harness-request")
            written.append(name)
        return written


def replayable_cases(suite) -> list[tuple[int, object]]:
    """``(N, case)`` for each case a ``best-case-N.json`` can replay: N is the case's place in the suite.
    A generated case has none: its arrays live only as long as the optimize run (a 2048³ matmul's are
    48 MB); the gate draws them again from the signed seed when the winner, proposed, is gated."""
    return [(number, case) for number, case in enumerate(suite.cases, start=1) if not case.generated]


def _relative(path: str, start: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), start.resolve())).as_posix()


# -- documents -------------------------------------------------------------------------------------------

def attempt_json(a) -> dict:
    cand = a.candidate
    evaluation = a.evaluation
    return {
        "attempt": a.index, "round": a.round, "repair": a.repair,
        "origin": cand.origin if cand else None, "label": cand.label if cand else None,
        "status": "passed" if a.passed else "rejected", "stage": a.stage,
        "rejection": a.rejection,
        "candidate": cand.to_json() if cand else None,
        "compile": a.compile,
        "cases": [c.to_json() for c in evaluation.cases] if evaluation else [],
        "latency_ms": dict(a.anchored), "geomean_ms": a.geomean_ms, "speedup_vs_initial": a.speedup,
        "gpu_seconds": round(evaluation.gpu_s, 3) if evaluation else 0.0,
        "nsight": a.nsight,
        "validation": a.validation.to_json() if a.validation else None,
        "model_calls": list(a.model_calls),
        "started_at": a.started_at, "seconds": a.seconds,
    }


def history_doc(pack: AuditPack, opt) -> dict:
    return {
        "format": FORMAT, "tool_version": __version__, "run": pack.name,
        "suite": display_path(pack.suite.path), "kernel": pack.program.name,
        "ranking": "geometric mean over the visible performance cases of each case's latency, measured interleaved "
                   "with the initial kernel and expressed on the initial kernel's round-0 medians",
        "attempts": [attempt_json(a) for a in opt.attempts],
    }


def _oracle(suite) -> dict:
    try:
        manifest, problems = collect_manifest(suite)
        manifest = instance_manifest(manifest, suite)  # an instantiated suite: the instantiation optimized
        return {"reference": manifest.get("reference"), "cases": {n: c.get("files") for n, c in manifest["cases"].items()},
                "problems": problems}
    except Exception as exc:  # hashes are evidence, not a precondition
        return {"reference": None, "cases": {}, "problems": [f"could not hash the oracle: {exc}"]}


def _ratio(estimate: dict | None) -> dict | None:
    return ({k: finite(estimate.get(k)) for k in ("ratio", "low", "high")}
            | {"confidence": estimate["confidence"], "n": estimate["n"]} if estimate else None)


def _gate_summary(case: dict) -> dict:
    """The headline figures of one gate case (:meth:`CaseOutcome.to_json`) for the summary; the
    library baseline's ratio only where the suite names one (informational)."""
    latency = case.get("latency") or {}
    summary = {"passed": case["passed"], "status": case.get("status"), "warning": case.get("warning"),
               "latency_verdict": latency.get("verdict"), "ratio_vs_approved": _ratio(latency.get("estimate")),
               "approved_ms": finite((latency.get("approved") or {}).get("median")),
               "current_ms": finite((latency.get("current") or {}).get("median"))}
    library = case.get("library")
    if library:
        summary["library"] = {"label": library["label"], "ratio": _ratio(library.get("estimate")),
                              "error": library.get("error"),
                              "library_ms": finite((library.get("library") or {}).get("median"))}
    return summary


def _best_json(opt, attempt, pack) -> dict | None:
    if attempt is None:
        return None
    cases = []
    gate = {c["case"]: c for c in (attempt.validation.cases if attempt.validation else [])}
    evaluation = {c.case: c for c in attempt.evaluation.cases} if attempt.evaluation else {}
    for case in pack.suite.cases:
        ev, g = evaluation.get(case.name), gate.get(case.name)
        cases.append({
            "case": case.name, "kind": case.kind, "holdout": case.holdout,
            "search_latency_ms": attempt.anchored.get(case.name),
            "initial_ms": opt.base.get(case.name),
            "ratio_vs_initial": ev.ratio if ev else None,
            "speedup_vs_initial": (1.0 / ev.ratio["ratio"]) if ev and ev.ratio and ev.ratio.get("ratio") else None,
            "gate": _gate_summary(g) if g else None,
            "chosen": _chosen(pack, attempt.candidate, case),
        })
    ratios = [c["gate"]["ratio_vs_approved"]["ratio"] for c in cases
              if c["gate"] and c["gate"].get("ratio_vs_approved") and c["kind"] == "performance"
              and c["gate"]["ratio_vs_approved"].get("ratio")]

    g = geomean(ratios)
    return {"attempt": attempt.index, "round": attempt.round, "origin": attempt.candidate.origin,
            "label": attempt.candidate.label, "geomean_ms": attempt.geomean_ms,
            "speedup_vs_initial": attempt.speedup, "speedup_vs_approved": (1.0 / g) if g else None,
            "validated": bool(attempt.validation and attempt.validation.passed),
            "source_sha256": attempt.candidate.sha256, "defines": attempt.candidate.defines,
            **attempt.candidate.launch_json(), "gate": _gate_overview(attempt.validation), "cases": cases}


def _chosen(pack, candidate, case) -> dict:
    """What ``case`` runs in ``candidate`` and why: its class's variant or the shared default."""
    build = candidate.program(pack.program).for_case(case)
    variant = candidate.classes.get(case.shape_class)
    choice = candidate.choices.get(case.shape_class)
    try:
        launch = pack.suite.resolved(case).launch(build)
    except ExprError:
        launch = None
    if choice is not None:
        why = choice.why
    elif variant is not None:
        why = f"class {case.shape_class} variant"
    elif candidate.classes:
        why = f"shared default (class {case.shape_class} has no variant)"
    else:
        why = f"one build for every case ({candidate.label or candidate.origin})"
    return {"class": case.shape_class, "build": "variant" if variant is not None else "shared",
            "defines": dict(choice.defines if choice is not None else candidate.defines),
            "options": list(variant.options) if variant is not None else [], "launch": launch, "why": why}


def _gate_overview(validation) -> dict | None:
    """What the final gate said about this candidate as a whole (its per-case figures are in ``cases``)."""
    if validation is None:
        return None
    data = validation.to_json()
    return {k: data.get(k) for k in ("passed", "rejection", "skipped", "fresh_seed", "checks", "notes", "gpu_seconds")}


def summary_doc(pack: AuditPack, opt, *, status: str) -> dict:
    meter = opt.meter
    attempts = opt.attempts
    initial = attempts[0] if attempts else None
    best_any = opt.best if opt.best is not None and opt.best.index != 0 else None
    return {
        "format": FORMAT, "tool_version": __version__, "run": pack.name, "status": status,
        "suite": display_path(pack.suite.path), "suite_name": pack.suite.name, "kernel": pack.program.name,
        "proposer": pack.proposer, "settings": pack.settings,
        "started_at": opt.started_at, "ended_at": opt.ended_at,
        "stop_reason": opt.stop_reason, "stop_detail": opt.stop_detail,
        "outcome": opt.outcome if status != "running" else "running",
        "validation_note": opt.validation_note,
        "rounds": opt.rounds_run, "attempts": len(attempts),
        "passed_attempts": sum(1 for a in attempts if a.passed and a.index > 0),
        "rejected_attempts": sum(1 for a in attempts if not a.passed and a.index > 0),
        "repairs": sum(1 for a in attempts if a.repair > 0),
        "initial": {"geomean_ms": initial.geomean_ms if initial else None, "latency_ms": dict(opt.base)},
        "best": _best_json(opt, opt.winner, pack),
        "fastest_unvalidated": _best_json(opt, best_any, pack) if opt.winner is None and best_any is not None else None,
        "rejected_by_gate": [{"attempt": a.index, "label": a.candidate.label, "speedup_vs_initial": a.speedup,
                              "reason": a.validation.rejection if a.validation else None} for a in opt.rejected],
        "usage": {**meter.to_json(), "price_per_mtok": meter.price.to_json() if meter.price else None},
        "budgets": opt.budgets.to_json(),
        "device": pack.device, "git": pack.git, "trust": pack.trust, "oracle": _oracle(pack.suite),
        "stop_reasons": STOP_REASONS,
        "files": [],
        "best_case_files": {f"best-case-{n}.json": c.name for n, c in replayable_cases(pack.suite)}
        if opt.winner is not None else {},
        "schema_problems": list(pack.problems),
    }
