"""What a model is told: the task, the rules, the visible cases and the evidence of earlier rounds.

Never in a prompt: holdout cases (names, shapes or existence beyond "there are hidden cases"),
expected outputs or the values a failing kernel got wrong (a mismatch is described by count,
index and error size), input data, file paths of case data, keys or tokens.
"""

from __future__ import annotations

import json

from cudagate_harness.library import ADAPTERS

from pytest_cudagate.suite.model import Suite
from pytest_cudagate.optimize.candidate import SYSTEM_HEADERS, allowed_headers, c_prototype
from pytest_cudagate.optimize.nsight import describe

MAX_LOG_CHARS = 3000
MAX_SOURCE_IN_PROMPT = 24_000


def us(ms: float | None) -> str:
    return "–" if ms is None else f"{ms * 1000:.2f} µs"


def library_label(program) -> str:
    adapter = program.library_baseline.adapter
    return ADAPTERS[adapter].label if adapter in ADAPTERS else adapter


def library_note(vs: dict | None) -> str:
    """A case's multiple of the suite's library baseline, as the model reads it ("" without a baseline)."""
    if not vs:
        return ""
    if vs.get("ratio") is None:
        return f"; × {vs['label']}: no ratio ({(vs.get('error') or 'not measured')[:300]})"
    return (f"; {vs['ratio']:.3f}× {vs['label']} (derived via the initial kernel, {vs['confidence']:.0%} interval "
            f"[{vs['low']:.3f}, {vs['high']:.3f}]; {vs['label']} median {us(vs.get('library_ms'))})")


def initial_vs_library(vs: dict | None) -> str:
    """The initial kernel's own multiple of the library baseline, measured beside it ("" without one)."""
    if not vs:
        return ""
    ratio = vs.get("initial_vs_library")
    if not ratio or ratio.get("ratio") is None:
        return f"; × {vs['label']}: no ratio ({(vs.get('error') or 'not measured')[:300]})"
    return (f"; {vs['label']} {us(vs.get('library_ms'))}, the initial kernel takes {ratio['ratio']:.3f}× its time "
            f"({ratio['confidence']:.0%} CI [{ratio['low']:.3f}, {ratio['high']:.3f}], interleaved)")


def shape_classes(visible) -> list[str]:
    """The visible cases' shape classes, in case order; more than one makes class variants worth offering."""
    return list(dict.fromkeys(c.shape_class for c in visible))


def system_prompt(suite: Suite, program, device: str, visible) -> str:
    scalars = ", ".join(p.name for p in suite.signature if p.kind == "scalar")
    classes = shape_classes(visible)
    shipped = [c for c in classes if c in program.classes]
    variants = ("- Shape classes: the cases fall into classes (" + ", ".join(classes) + "). class_variants builds the "
                "same source again for one class's cases with extra -DNAME=value options only (a later -D overrides an "
                "#ifndef-guarded #define) and its own launch: use it when that class's shapes want other tiles "
                "(otherwise []). Without an entry, a class runs the shared build and launch"
                + (f"; the initial kernel has variants for {', '.join(shipped)} (its launch shows them), and leaving "
                   "a class out drops its variant." if shipped else ".")
                if len(classes) > 1 or shipped else
                "- class_variants: always [] for this kernel (its cases are one shape class).")
    dtypes = {p.name: p.dtype for p in suite.signature}
    tolerance = "; ".join(f"{name}: |actual - expected| <= {t.atol:g} + {t.rtol:g}·|expected|"
                          + (f", or within {t.ulp} ulp of expected in {dtypes[name]}" if t.ulp is not None else "")
                          for name, t in suite.tolerance.items() if program.judged is None or name in program.judged)
    requires = (f" Only cases where {' and '.join(program.requires)} are run (its preconditions)."
                if program.requires else "")
    local = sorted(allowed_headers(program))
    return "\n".join([
        f"You optimise one CUDA kernel for latency on {device}. You write only CUDA C++ device code and launch "
        "configurations; nothing else you write is run, and there is no host code.",
        "",
        "Rules (a candidate that breaks one is rejected):",
        f"- Keep the entry exactly: {c_prototype(suite, program.entry)}",
        f"- What it computes: {suite.description or suite.name}. Buffer shapes: "
        + "; ".join(f"{p.name} {list(p.shape) if p.shape else p.size} ({p.dtype}, {p.intent})" for p in suite.buffers) + ".",
        "- Correct for every legal value of the scalars, not only the cases shown: hidden cases with other shapes "
        "and fresh random inputs decide whether a candidate is accepted. Never special-case the shapes shown."
        + requires,
        f"- Tolerance{'' if program.judged is None else ' (the outputs judged)'}: {tolerance}. Write every output "
        "element; never write into input buffers; two launches on "
        "the same inputs must give bit-identical outputs (no atomics whose order changes results).",
        f"- Includes: only <{'>, <'.join(sorted(SYSTEM_HEADERS))}>"
        + (" and " + ", ".join(f'"{h}"' for h in local) if local else "") + ". No dynamic parallelism, no host code.",
        f"- Launch: grid and block are lists of 1 to 3 integer expressions over the scalars ({scalars}) using "
        "integers, + - * / // % and cdiv(a, b), min, max; shared_bytes is the dynamic shared memory in bytes "
        "(an expression, \"0\" if none). launch_overrides replaces the launch for a named case (normally []).",
        variants,
        "- Timing: each performance case is timed cold (L2 flushed) as the median of 100 launches, interleaved "
        "with the initial kernel; candidates are ranked by the geometric mean over the performance cases."
        + (f" The library baseline {library_label(program)} is timed once per case beside the initial kernel; a "
           "candidate's multiple of it is derived through the initial kernel (for information; ranking is as above)."
           if program.library_baseline else ""),
        "",
        "Answer with one JSON object of the given schema: title (a few words), idea (one or two sentences), "
        "source (the complete .cu file), launch, launch_overrides, class_variants.",
    ])


def _attempt_line(a) -> str:
    label = a.candidate.label if a.candidate is not None else ""
    head = f"attempt {a.index} (round {a.round}{', ' + label if label else ''})"
    if a.passed:
        return f"{head}: passed, geomean {us(a.geomean_ms)}, {a.speedup:.2f}× the initial kernel"
    reason = (a.rejection_for_model or a.rejection or "").splitlines()[0][:160]
    return f"{head}: rejected at {a.stage}: {reason}"


def visible_launch(candidate, visible) -> dict:
    """The candidate's launch as a proposer may see it: overrides and class variants of hidden cases
    left out (the suite's own entries for them ride along unchanged; see ``static_problems``)."""
    names, classes = {c.name for c in visible}, {c.shape_class for c in visible}
    launch = candidate.launch_json()
    launch["launch_overrides"] = {k: v for k, v in launch["launch_overrides"].items() if k in names}
    if "classes" in launch:
        launch["classes"] = {k: v for k, v in launch["classes"].items() if k in classes}
    return launch


def _source_block(title: str, candidate, visible) -> str:
    text = candidate.text
    if len(text) > MAX_SOURCE_IN_PROMPT:
        text = text[:MAX_SOURCE_IN_PROMPT] + "\n// ... (cut)"
    return f"{title} (launch {json.dumps(visible_launch(candidate, visible))}):\n```cuda\n{text}\n```"


def _evidence(a, best) -> list[str]:
    lines = [_attempt_line(a)]
    if a.stage == "compile" or (a.stage == "static" and a.rejection_for_model):
        lines.append(((a.rejection_for_model or "")[-MAX_LOG_CHARS:]))
    elif not a.passed and a.rejection_for_model:
        lines.append(a.rejection_for_model[-MAX_LOG_CHARS:])
    if a.evaluation is not None and a.passed:
        for c in a.evaluation.cases:
            if c.kind != "performance" or c.latency_ms is None:
                continue
            ratio = c.ratio or {}
            vs_best = ""
            if best is not None and best is not a and best.anchored.get(c.case) and a.anchored.get(c.case):
                vs_best = f", {a.anchored[c.case] / best.anchored[c.case]:.3f}× the current best"
            lines.append(f"  case {c.case}: median {us(c.latency_ms)} (initial {us(c.initial_ms)} in the same run; "
                         f"ratio {ratio.get('ratio', 0):.3f}, 99% CI [{ratio.get('low') or 0:.3f}, "
                         f"{ratio.get('high') or 0:.3f}]{vs_best}{library_note(c.vs_library)})")
        res = (a.evaluation.compile or {}).get("resources") or {}
        if res:
            lines.append(f"  compile: {res.get('registers', '?')} registers, {res.get('spill_store_bytes', 0)} B spill "
                         f"stores, {res.get('shared_static_bytes', 0)} B static shared")
    if a.nsight:
        lines.append("  " + describe(a.nsight, ((a.evaluation and a.evaluation.compile) or {}).get("resources")))
    return lines


def round_prompt(context, suite: Suite, visible, description: str = "") -> str:
    initial, best = context.initial, context.best
    parts = [f"Round {context.round} of {context.max_rounds}."]
    if description:
        parts.append(f"Notes from the engineer: {description}")
    parts.append("Cases you may see (there are hidden ones too):")
    for case in visible:
        a = initial.evaluation.case(case.name) if initial.evaluation else None
        timing = (f", initial kernel {us(a.latency_ms)}{initial_vs_library(a.vs_library)}"
                  if a is not None and a.latency_ms is not None else "")
        shape_class = f"class {case.shape_class}, " if len(shape_classes(visible)) > 1 else ""
        parts.append(f"- {case.name}: {case.kind}, {shape_class}" + ", ".join(f"{k}={v}" for k, v in case.scalars.items())
                     + timing)
    parts.append("")
    parts.append(_source_block("The initial kernel", initial.candidate, visible))
    if best is not None and best is not initial:
        parts.append(_source_block(f"The current best (attempt {best.index}, {best.speedup:.2f}× the initial)",
                                   best.candidate, visible))
    history = [a for a in context.history if a.round >= 1]
    if history:
        parts.append("")
        parts.append("All attempts so far:")
        parts += [_attempt_line(a) for a in history]
        last_round = max(a.round for a in history)
        parts.append("")
        parts.append(f"Evidence from round {last_round}:")
        for a in [a for a in history if a.round == last_round]:
            parts += _evidence(a, best)
    parts.append("")
    parts.append("Propose one new candidate that should be faster than the current best and still correct.")
    return "\n".join(parts)


def repair_prompt(problem: str) -> str:
    return ("That answer could not be used:\n" + problem[-MAX_LOG_CHARS:] +
            "\nAnswer again with the complete JSON object (all fields, the whole source).")
