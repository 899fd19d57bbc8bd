"""Compile a suite program on the host (NVRTC needs no GPU), through the per-user on-disk cache.

The log that comes back is scrubbed of secret environment values before anyone prints or stores it.
A compile for the gate's items is limited by the case timeout (``timeout_s``), as the worker's is,
and one that failed is not started again in this process (:func:`~cudagate_harness.compiler.compile_kernel`).
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cudagate_harness.compiler import (CompileLimits, CompileOptionError, CompileResult, compile_kernel, nvrtc_version,
                                       parse_resources)
from cudagate_harness import symbols
from cudagate_harness.params import ParamInfoError, entry_params, signature_problems

from pytest_cudagate.host.cpu import cores
from pytest_cudagate.host.paths import command
from pytest_cudagate.host.scrub import Scrubber
from pytest_cudagate.suite.includes import IncludeError
from pytest_cudagate.worker.requests import KernelVersion, current_version, shown_log
from pytest_cudagate.suite.model import Case, Param, Program, Suite


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def entry_resources(result: CompileResult) -> dict:
    """ptxas's resource use for the entry ``result`` looked up (registers, spills, static shared memory,
    ...). ptxas reports every kernel of the source in turn, and ``result.resources`` is read from the
    whole log, so it holds the first kernel's: read the entry's own section. Static shared memory is
    0 where ptxas says nothing of it (it names only a nonzero size)."""
    marks = list(_PTXAS_ENTRY.finditer(result.log))
    found = dict(result.resources)
    for number, mark in enumerate(marks):
        if mark.group(1) == result.lowered_name:
            end = marks[number + 1].start() if number + 1 < len(marks) else len(result.log)
            found = parse_resources(result.log[mark.end():end])
            break
    if "registers" in found:
        found.setdefault("shared_static_bytes", 0)
    return found


# Cache keys this process compiled rather than read from the on-disk cache, with the seconds each took:
# a compile item reads back what compile_ahead built a moment before, and its facts show that cold time.
_COLD: dict[str, float] = {}


@dataclass(frozen=True)
class BuildFacts:
    """What compiling one entry of one build came to, as reports show it: ptxas's registers, spills
    and static shared memory (None where the compile failed), the compiler, and the seconds this run
    spent compiling it (None: it came from the compile cache of an earlier run)."""

    suite: str
    kernel: str
    variant: str | None  # the shape class of a class variant's build
    entry: str
    arch: str
    compiler: str
    ok: bool
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    shared_static_bytes: int | None
    compile_s: float | None

    @classmethod
    def of(cls, suite: str, program: Program, entry: str, result: CompileResult) -> BuildFacts:
        res = entry_resources(result)
        return cls(suite, program.name, program.variant, entry, result.arch, result.compiler, result.ok,
                   res.get("registers"), res.get("spill_store_bytes"), res.get("spill_load_bytes"),
                   res.get("shared_static_bytes"), None if result.cache_hit and result.key not in _COLD
                   else _COLD.get(result.key, result.seconds))


def compile_program(program: Program, arch: str, source_text: str | None = None, *,
                    timeout_s: float | None = None, entry: str | None = None) -> CompileResult:
    """Compile ``program`` for ``arch`` + its suffix, looking up ``entry`` (default: its first),
    stopped after ``timeout_s`` (the case timeout; None: the compiler's default); a refused option or
    include becomes a failed result. A kernel of steps compiles once per entry (each is a name
    expression of its own), then from the cache."""
    if program.classes:
        raise ValueError(f"{program.name} has class variants: compile program.for_case(case) (one build)")
    try:
        version = current_version(program, source_text)
    except IncludeError as exc:
        return CompileResult(ok=False, arch=arch + program.arch_suffix, key="", cache_hit=False, seconds=0.0,
                             log=Scrubber().text(str(exc)))
    return compile_version(version, arch, timeout_s=timeout_s, entry=entry)


def compile_version(version: KernelVersion, arch: str, case: Case | None = None, *, timeout_s: float | None = None,
                    entry: str | None = None) -> CompileResult:
    """:func:`compile_program` of a version: the build ``case`` runs (None: the shared build)."""
    target = arch + version.arch_suffix
    spec = version.kernel(case)
    try:
        result = compile_kernel(spec["source"], entry=entry or spec["entry"], arch=target, source_name=spec["source_name"],
                                options=spec["options"], headers=spec["headers"],
                                limits=CompileLimits.case_timeout(timeout_s), compiler=version.compiler)
    except CompileOptionError as exc:
        result = CompileResult(ok=False, arch=target, key="", cache_hit=False, seconds=0.0, log=str(exc))
    result.log = Scrubber().text(shown_log(version.name, version.source_path or version.name, result.log,
                                           version.header_paths))
    if result.key and not result.cache_hit:
        _COLD[result.key] = result.seconds
    return result


def entry_builds(program: Program, result: CompileResult, arch: str, *,
                 timeout_s: float | None = None) -> dict[str, CompileResult]:
    """Each entry of ``program`` compiled: its first entry's ``result``, and for a kernel of steps each
    other entry it launches (a name expression of its own) compiled as :func:`compile_program` does."""
    return {entry: result if entry == program.entry else compile_program(program, arch, timeout_s=timeout_s, entry=entry)
            for entry in program.entries}


def parameter_problems(program: Program, result: CompileResult, signature: tuple[Param, ...], arch: str, *,
                       timeout_s: float | None = None, built: dict[str, CompileResult] | None = None) -> list[str]:
    """How each compiled entry's own parameter list (read from its cubin) differs from what it is
    passed, one line each: the whole ``signature``, or for each step of a kernel of steps the
    parameters it names (its other entries compiled for ``arch`` as :func:`compile_program` does).
    Empty when they agree or the build did not compile (its log says why). On the host, so a kernel
    whose parameters would be read wrongly on a GPU fails before it reaches one. ``built``: the
    entries already compiled (:func:`entry_builds`)."""
    if not program.steps:
        return _layout_problems(result, [p.protocol() for p in signature], "the signature")
    named = {p.name: p.protocol() for p in signature}
    built = built or entry_builds(program, result, arch, timeout_s=timeout_s)
    problems = []
    for number, step in enumerate(program.steps, 1):
        if step not in program.launch_steps:  # a memset, copy or library call: no parameters to check
            continue
        step_result = built[step.entry]
        if not step_result.ok and step_result is not result:
            problems.append(f"step {number} ({step.entry}): does not compile: {step_result.log.strip().splitlines()[0]}")
        problems += [f"step {number} ({step.entry}): {p}"
                     for p in _layout_problems(step_result, [named[a] for a in step.args], "the step")]
    return problems


def suite_builds(suite: Suite) -> list[Program]:
    """Each kernel's builds its cases run (one per class variant in use; a case its `requires` exclude
    runs none), then a CUDA reference."""
    builds = [build for kernel in suite.kernels for build in kernel.builds([c for c in suite.cases if kernel.runs(c)])]
    return builds + ([suite.reference.program] if suite.reference.program else [])


def signature_refusals(suite: Suite, arch: str) -> tuple[list[str], list[str]]:
    """``cudagate sign``'s parameter check: one line per parameter of a build that cannot take the
    suite's signature (the fix last), and notes on the builds that do not compile here (not checked)."""
    problems, notes = [], []
    for program in suite_builds(suite):
        result = compile_program(program, arch)
        if not result.ok:
            notes.append(f"{program.build_name}: does not compile for {result.arch} here, so its parameters are not "
                         f"checked against the signature (`{command('cudagate', 'check', suite.path)}` says why)")
            continue
        problems += [f"{program.build_name}: {mismatch_heading(program)}: {problem}"
                     for problem in parameter_problems(program, result, suite.signature, arch)]
    if problems:
        problems.append("fix: make the kernel's parameters those the signature lists (in order, by type), or the "
                        f"signature the kernel's, then run `{command('cudagate', 'sign', suite.path)}`")
    return problems, notes


def mismatch_heading(program: Program, *, loud: bool = False) -> str:
    """What a parameter mismatch is said of: the entry and the suite's signature, or a kernel of
    steps' entries and their args (``loud``: NOT in capitals, as `cudagate check` prints it)."""
    if not program.steps:
        return f"entry {program.entry!r} {'does NOT' if loud else 'does not'} take the parameters the suite's signature lists"
    entries = ", ".join(repr(e) for e in program.entries)
    return f"steps {entries} {'do NOT' if loud else 'do not'} take the parameters their args list"


def _layout_problems(result: CompileResult, passed: list[dict], source: str) -> list[str]:
    if not result.ok or result.cubin is None or result.lowered_name is None:
        return []
    try:
        layout = entry_params(result.cubin, result.lowered_name)
        kernel, _ = symbols.find(result.cubin, result.lowered_name)
    except ParamInfoError as exc:
        return [f"its parameters cannot be read from the cubin {result.compiler or 'the compiler'} produced: {exc}"]
    # A C++ entry's mangled name spells its parameters' C types; an extern "C" one's says nothing (sizes only).
    types = kernel.params if kernel is not None and kernel.params is not None else ()
    return signature_problems(layout, passed, source) + symbols.type_problems(types, layout, passed, source)


def compile_builds(program: Program, cases, arch: str, source_text: str | None = None, *,
                   timeout_s: float | None = None) -> list[tuple[Program, CompileResult]]:
    """Every build ``cases`` run (one per class variant in use, see :meth:`Program.builds`), compiled."""
    return [(build, compile_program(build, arch, source_text, timeout_s=timeout_s)) for build in program.builds(cases)]


def compile_ahead(programs: list[tuple[Program, list]], arch: str, *, timeout_s: float | None = None) -> None:
    """Compile every ``(program, cases)`` build at once into the on-disk cache (each NVRTC run is a
    child process of its own), so that the compile items that follow, one by one, read it back (a
    failure, from this process's memory). A program that cannot even be read (a header that is not
    UTF-8, say) is left to its compile item, which fails saying why."""
    def one(job: tuple[Program, list]) -> None:
        try:
            compile_builds(job[0], job[1], arch, timeout_s=timeout_s)
        except Exception:  # noqa: BLE001 - only a head start: the item meets the same error and reports it
            pass

    with ThreadPoolExecutor(max_workers=cores(), thread_name_prefix="cudagate-compile") as pool:
        list(pool.map(one, programs))


def build_record(version: KernelVersion, arch: str, *, timeout_s: float | None = None) -> dict | None:
    """How ``version`` builds here, as an approval's ``build`` records it: the NVRTC version, the
    compiler that built it with its exact version, the kernel's options and the cubin's SHA-256 for
    ``arch`` + its suffix. None when it does not compile
    (within ``timeout_s``, as :func:`compile_program`). A kernel with class variants records its
    shared build (the variants differ by options only)."""
    result = compile_version(version, arch, timeout_s=timeout_s)
    if not result.ok or result.cubin is None:
        return None
    return {"nvrtc_version": nvrtc_version(), "compiler": result.compiler, "options": list(version.options),
            "cubin_sha256": {result.arch: hashlib.sha256(result.cubin).hexdigest()}}
