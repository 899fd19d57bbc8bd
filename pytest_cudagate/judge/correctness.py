"""Turn one worker answer for one case into a correctness verdict a reviewer can read."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from pytest_cudagate.host.cpu import cores
from pytest_cudagate.judge.elementwise import OutputCheck, check_output
from pytest_cudagate.suite.model import DEFAULT_CHECKS, Checks, Tolerance
from pytest_cudagate.boundary.wire import TIME, derived, json_field

_ERROR_TITLES = {
    "fault": "the kernel faulted",
    "timeout": "timeout",
    "crash": "the harness worker crashed",
    "launch": "the launch was refused",
    "oom": "out of device memory",
    "input": "bad case data",
    "compile": "compile error",
}


@dataclass
class CaseVerdict:
    kernel: str = json_field(hidden=True)
    case: str = json_field(hidden=True)
    passed: bool
    problems: list[str] = field(default_factory=list)
    error_kind: str | None = None
    samples_ms: list[float] | None = json_field(hidden=True, default=None)  # the item's samples_ms
    # What was relaxed or skipped: shown with the outcome (its notes), never failing.
    notes: list[str] = json_field(hidden=True, default_factory=list)
    # Worker time per step (the defences' cost).
    step_seconds: dict[str, float] = json_field(hidden=True, default_factory=dict)
    comparisons: list[OutputCheck] = field(default_factory=list)

    @property
    @derived(after="error_kind", per_run=TIME)
    def median_ms(self) -> float | None:
        return float(np.median(self.samples_ms)) if self.samples_ms else None

    @property
    @derived(after="error_kind")
    def rel_norm(self) -> float | None:
        return max((c.rel_norm for c in self.comparisons), default=None)

    def describe(self) -> str:
        """The header, then what went wrong on the signed inputs, then every other finding."""
        header = f"{self.kernel} × {self.case}: {'passed' if self.passed else 'FAILED'}"
        return "\n".join([header, *(c.describe() for c in self.comparisons if not c.ok), *self.problems])


def judge_case(kernel: str, case: str, body: dict, expected: dict[str, np.ndarray],
          tolerance: dict[str, Tolerance], shapes: dict[str, tuple[int, ...]] | None = None, *,
          checks: Checks | None = None) -> CaseVerdict:
    """Check every output of both validation launches, of the timed launches and of the fresh input
    sets, the guard zones and the inputs; name each way the kernel failed."""
    shapes = shapes or {}
    checks = checks or DEFAULT_CHECKS
    if body.get("status") != "ok":
        error = body.get("error", {})
        kind = error.get("kind", "error")
        title = _ERROR_TITLES.get(kind, kind) + (f" during {error['phase']}" if error.get("phase") else "")
        return CaseVerdict(kernel, case, False, [f"{title}: {error.get('message', 'no detail')}"], error_kind=kind)
    verdict = CaseVerdict(kernel, case, True, samples_ms=(body.get("timing") or {}).get("samples_ms"),
                          notes=list(body.get("notes", [])), step_seconds=dict(body.get("step_seconds", {})))
    modified = body.get("inputs_modified", {})
    for name, changed in sorted(modified.items()):
        verdict.problems.append(f"the kernel wrote into input buffer {name!r} ({changed} elements changed)")
    for name, write in sorted(body.get("input_writes", {}).items()):
        if name not in modified:
            verdict.problems.append(f"the kernel wrote into input buffer {name!r} during {write['phase']} "
                                    f"({write['elements']} elements changed)")
    verdict.problems += _guard_problems(body.get("guards", {}))
    verdict.problems += padding_problems(body.get("padding", {}))
    fresh = _check_fresh(body.get("fresh", []), tolerance, shapes, checks)  # meanwhile, the signed outputs
    firsts, signed_ok = {}, {}
    between = "after the timed launches" if body.get("timing") else "on a second launch on the same inputs"
    for name, out in sorted(body.get("outputs", {}).items()):
        if name not in expected:
            continue
        first = np.load(out["path"], allow_pickle=False)
        firsts[name] = first
        result = check_output(name, first, expected[name], tolerance[name], shapes.get(name), out.get("unwritten", 0),
                         output_scale=checks.output_scale)
        verdict.comparisons.append(result)
        signed_ok[name] = result.ok
        differing = out.get("differing_second_launch", 0)
        if differing and result.ok:
            second = np.load(out["second_path"], allow_pickle=False)
            again = check_output(name, second, expected[name], tolerance[name], shapes.get(name),
                            output_scale=checks.output_scale)
            if not again.ok:
                why = ("it had written into its input " + ", ".join(repr(n) for n in sorted(modified))
                       + ", so the second launch ran on other data") if modified else \
                      "the kernel is stateful (caches results or counts calls)"
                verdict.problems.append(f"output {name!r} was right on the first launch but wrong {between}: {why}\n"
                                        + _indent(again.describe()))
            elif checks.determinism == "bitwise":
                verdict.problems.append(
                    f"output {name!r} is not deterministic: {differing} elements differ bitwise between two "
                    f"launches on the same inputs (a race, uninitialised memory, or atomics order)")
            else:
                verdict.notes.append(f"output {name!r}: {differing} elements differed bitwise between two launches on "
                                     f"the same inputs, both within tolerance (allowed by checks.determinism: tolerance)")
    _judge_timed(verdict, body.get("timed"), expected, tolerance, shapes, checks, signed_ok)
    _judge_fresh(verdict, fresh, firsts, signed_ok)
    verdict.passed = not verdict.problems and all(c.ok for c in verdict.comparisons)
    return verdict


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _guard_problems(guards: dict) -> list[str]:
    problems = []
    for name, sides in sorted(guards.items()):
        for side, hit in sorted(sides.items()):
            where = "past the end of" if side == "after" else "before the start of"
            edge = "after its end" if side == "after" else "before its start"
            problems.append(f"the kernel wrote {where} buffer {name!r}: {hit['bytes']} canary bytes of its guard zone "
                            f"changed, the nearest {hit['nearest']} bytes {edge} (found after {hit['phase']})")
    return problems


def padding_problems(padding: dict) -> list[str]:
    """One line per padded buffer whose padding (the elements past each row's end, up to its leading
    dimension) the kernel wrote, naming the first such element."""
    return [f"the kernel wrote into the padding of buffer {name!r}: row {hit['row']}, column {hit['column']} "
            f"({hit['elements']} padding element(s) changed, found after {hit['phase']}); only columns below the "
            "row length may be written" for name, hit in sorted(padding.items())]


def _judge_timed(verdict: CaseVerdict, timed: dict | None, expected, tolerance, shapes, checks: Checks,
                 signed_ok: dict) -> None:
    """What the last timed launch on each buffer copy wrote, against launch 1 and the expected output
    (only where launch 1 was right: otherwise that is the finding)."""
    if not timed:
        return
    checked = timed.get("checked", 0)
    for name, out in sorted(timed.get("outputs", {}).items()):
        if name not in expected or not signed_ok.get(name, False):
            continue
        if out.get("unwritten"):
            verdict.problems.append(
                f"output {name!r}: {out['unwritten']} elements were not written by the timed launches (they still "
                f"held the poison pattern; {checked} timed launch(es) checked): the kernel does less work when timed")
            continue
        if not out.get("differing") or not out.get("path"):
            continue
        actual = np.load(out["path"], allow_pickle=False)
        result = check_output(name, actual, expected[name], tolerance[name], shapes.get(name), output_scale=checks.output_scale)
        if not result.ok:
            verdict.problems.append(
                f"output {name!r} was wrong after the timed launches ({checked} checked), though right on validation "
                f"launch 1: the kernel behaves differently when timed (it counts calls or detects the timing loop)\n"
                + _indent(result.describe()))
        elif checks.determinism == "bitwise":
            verdict.problems.append(
                f"output {name!r} is not deterministic: {out['differing']} elements written by a timed launch differ "
                f"bitwise from validation launch 1 on the same inputs (a race, uninitialised memory, or atomics order)")
        else:
            verdict.notes.append(f"output {name!r}: timed launches differed bitwise from launch 1 within tolerance "
                                 f"(allowed by checks.determinism: tolerance)")
    _judge_digests(verdict, timed.get("digests"), checks, all(signed_ok.get(name, False) for name in expected))


def _judge_digests(verdict: CaseVerdict, digests: dict | None, checks: Checks, launch1_ok: bool) -> None:
    """Every timed launch's outputs, digested on the GPU, against validation launch 1's digest: a
    kernel wrong on one launch in 64 is caught on that launch, not only if it was the last on a copy."""
    if not digests or not digests.get("differing"):
        return
    count = f"{digests['differing']} of {digests['launches']} timed launches (the first: timed launch {digests.get('first')})"
    if checks.determinism != "bitwise":
        verdict.notes.append(f"{count} wrote outputs that differ bitwise from validation launch 1 (allowed by "
                             "checks.determinism: tolerance; the last launch on each buffer copy is judged against the "
                             "tolerance)")
    elif launch1_ok:  # otherwise the wrong launch 1 is the finding
        verdict.problems.append(
            f"{count} wrote outputs that differ bitwise from validation launch 1 on the same inputs: every timed "
            "launch must write what the validated launch wrote (the kernel counts calls or detects the timing loop, "
            "or is not deterministic)")


_POOL: ThreadPoolExecutor | None = None
_BESIDE: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Threads for the fresh sets' checks: numpy releases the GIL in their loads and array loops, so
    a large case's outputs are checked side by side (the same checks, each alone)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, cores()), thread_name_prefix="cudagate-judge")
    return _POOL


def in_background(function, *args) -> Future:
    """``function(*args)`` started in a thread of its own pool, beside the caller's checks: never
    queued behind (or waiting on) the fresh sets' checks in :func:`_pool`, whatever the host's cores."""
    global _BESIDE
    if _BESIDE is None:
        _BESIDE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cudagate-judge-beside")
    return _BESIDE.submit(function, *args)


def _check_one(name: str, actual_path: str, expected_path: str, tolerance: Tolerance, shape, output_scale: bool):
    actual = np.load(actual_path, allow_pickle=False)
    want = np.load(expected_path, allow_pickle=False)
    return actual, check_output(name, actual, want, tolerance, shape, output_scale=output_scale)


def _check_fresh(fresh: list[dict], tolerance, shapes, checks: Checks) -> list[tuple[dict, list[tuple[str, Future]]]]:
    """Each fresh input set with its outputs' checks against the reference's outputs for it, started
    in :func:`_pool` (atol scaled with the output's RMS, see defences/fresh_inputs.py)."""
    started = []
    for entry in fresh:
        expected_paths = entry.get("expected") or {}
        scales = entry.get("atol_scale") or {}
        futures = []
        for name, out in sorted((entry.get("outputs") or {}).items()):
            if name not in expected_paths or name not in tolerance:
                continue
            scale = float(scales.get(name, 1.0)) if isinstance(scales, dict) else float(scales)
            tol = dataclasses.replace(tolerance[name], atol=tolerance[name].atol * scale)
            futures.append((name, _pool().submit(_check_one, name, out["path"], expected_paths[name], tol,
                                                 shapes.get(name), checks.output_scale)))
        started.append((entry, futures))
    return started


def _judge_fresh(verdict: CaseVerdict, fresh: list[tuple[dict, list[tuple[str, Future]]]], firsts: dict,
                 signed_ok: dict) -> None:
    """Each fresh input set's outputs against the reference's outputs for it. Where the kernel is
    already wrong on the signed inputs, one line says it is wrong on the fresh ones too."""
    also: dict[str, list[str]] = {}
    for entry, futures in fresh:
        label = entry.get("label", "fresh")
        what = entry.get("description") or label
        for name, changed in sorted((entry.get("inputs_modified") or {}).items()):
            verdict.problems.append(f"the kernel wrote into input buffer {name!r} on fresh inputs ({label}): "
                                    f"{changed} elements changed")
        for name, future in futures:
            actual, result = future.result()
            if result.ok:
                continue
            if not signed_ok.get(name, True):
                also.setdefault(name, []).append(label)
                continue
            stale = ""
            signed = firsts.get(name)
            if signed is not None and signed.size == actual.size and np.array_equal(
                    signed.reshape(-1).view(np.uint8), actual.reshape(-1).view(np.uint8)):
                stale = ("\n  its output on the fresh inputs is bit for bit its output on the signed inputs: the kernel "
                         "returned a cached result (keyed by pointer or by call count) instead of computing")
            verdict.problems.append(f"wrong on fresh inputs ({what}), checked against the reference:\n"
                                    + _indent(result.describe()) + stale)
    for name, labels in sorted(also.items()):
        verdict.problems.append(f"output {name!r} is wrong on the fresh inputs too ({', '.join(labels)})")
