"""Compile a suite program on the host (NVRTC needs no GPU), through the per-user on-disk cache.

The log that comes back is scrubbed of secret environment values before anyone prints or stores it.
A compile for the gate's items is limited by the case timeout (``timeout_s``), as the worker's is,
and one that failed is not started again in this process (:func:`~cudagate_harness.compiler.compile_kernel`).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from cudagate_harness.compiler import CompileLimits, CompileOptionError, CompileResult, compile_kernel, nvrtc_version
from cudagate_harness.params import ParamInfoError, entry_params, signature_problems

from pytest_cudagate.host.cpu import cores
from pytest_cudagate.host.paths import command
from pytest_cudagate.host.scrub import Scrubber
from pytest_cudagate.suite.includes import IncludeError
from pytest_cudagate.worker.requests import KernelVersion, current_version, shown_log
from pytest_cudagate.suite.model import Case, Param, Program, Suite


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
                                limits=CompileLimits.case_timeout(timeout_s))
    except CompileOptionError as exc:
        result = CompileResult(ok=False, arch=target, key="", cache_hit=False, seconds=0.0, log=str(exc))
    result.log = Scrubber().text(shown_log(version.name, version.source_path or version.name, result.log))
    return result


def parameter_problems(program: Program, result: CompileResult, signature: tuple[Param, ...], arch: str, *,
                       timeout_s: float | None = None) -> list[str]:
    """How each compiled entry's own parameter list (read from its cubin) differs from what it is
    passed, one line each: the whole ``signature``, or for each step of a kernel of steps the
    parameters it names (its other entries compiled for ``arch`` as :func:`compile_program` does).
    Empty when they agree or the build did not compile (its log says why). On the host, so a kernel
    whose parameters would be read wrongly on a GPU fails before it reaches one."""
    if not program.steps:
        return _layout_problems(result, [p.protocol() for p in signature], "the signature")
    named = {p.name: p.protocol() for p in signature}
    problems = []
    for number, step in enumerate(program.steps, 1):
        built = result if step.entry == program.entry else compile_program(program, arch, timeout_s=timeout_s,
                                                                            entry=step.entry)
        if not built.ok and built is not result:
            problems.append(f"step {number} ({step.entry}): does not compile: {built.log.strip().splitlines()[0]}")
        problems += [f"step {number} ({step.entry}): {p}"
                     for p in _layout_problems(built, [named[a] for a in step.args], "the step")]
    return problems


def suite_builds(suite: Suite) -> list[Program]:
    """Each kernel's builds its cases run (one per class variant in use), then a CUDA reference."""
    builds = [build for kernel in suite.kernels for build in kernel.builds(suite.cases)]
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
    except ParamInfoError as exc:
        return [f"its parameters cannot be read from the cubin NVRTC produced: {exc}"]
    return signature_problems(layout, passed, source)


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
    kernel's options and the cubin's SHA-256 for ``arch`` + its suffix. None when it does not compile
    (within ``timeout_s``, as :func:`compile_program`). A kernel with class variants records its
    shared build (the variants differ by options only)."""
    result = compile_version(version, arch, timeout_s=timeout_s)
    if not result.ok or result.cubin is None:
        return None
    return {"nvrtc_version": nvrtc_version(), "options": list(version.options),
            "cubin_sha256": {result.arch: hashlib.sha256(result.cubin).hexdigest()}}
