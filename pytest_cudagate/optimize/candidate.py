"""A candidate: CUDA source and a launch configuration, and the checks it passes before any GPU time.

A proposer writes only CUDA source and launch expressions. Nothing it writes is executed on the
host: the source goes to NVRTC and the GPU, and launch expressions are integer expressions over the
case's scalars, parsed by the suite's whitelist (never ``eval``). Includes are the one way source
text could reach the host's files (NVRTC reads what an ``#include`` names, and a compile error
quotes it back). The compiler is confined (``cudagate_harness.confine``), and before that a candidate
may include only the headers the shipped kernel includes and a fixed list of CUDA toolkit headers,
found by the same directive scan that decides which suite headers travel with a request.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace

from cudagate_harness.compiler import CompileOptionError, check_options
from cudagate_harness.protocol import DTYPES

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.suite.includes import directives, local_headers
from pytest_cudagate.suite.expr import ExprError, parse
from pytest_cudagate.suite import device
from pytest_cudagate.suite.model import Launch, Program, Suite, Variant

MAX_SOURCE_CHARS = 200_000
AUTOTUNE_COMMENT = "// cudagate optimize --proposer autotune: tunables of this build"
# What Candidate.text puts before the source: nothing, or the comment and one guarded #define per tunable.
AUTOTUNE_HEADER = re.compile(rf"(?:{re.escape(AUTOTUNE_COMMENT)}(?:\n#ifndef (\w+)\n#define \1 -?\d+\n#endif)*\n)?")
# A proposer's class variant may only set macros: -DNAME or -DNAME=value, a bounded number of them.
VARIANT_OPTION = re.compile(r"-D[A-Za-z_]\w*(=[^\x00-\x1f\x7f]*)?")
MAX_VARIANT_OPTIONS = 32
MAX_VARIANT_OPTION_CHARS = 256
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 227 * 1024  # sm_90's opt-in maximum per block
# Toolkit headers a kernel may include with <...>: device-side libraries only.
SYSTEM_HEADERS = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_runtime.h", "mma.h", "cuda_pipeline.h",
    "cuda_pipeline_primitives.h", "cooperative_groups.h", "cooperative_groups/reduce.h",
    "cooperative_groups/memcpy_async.h", "cuda/pipeline", "cuda/barrier", "cuda/atomic", "cuda/std/cstdint",
    "cuda/std/limits", "cuda/std/type_traits", "cuda/std/utility", "cuda/std/array", "cuda/std/cmath",
    "cuda/annotated_ptr", "cuda_awbarrier.h", "cuda_awbarrier_primitives.h", "sm_90_rt.h", "crt/math_functions.h",
    "stdint.h", "cstdint", "limits.h", "climits", "float.h", "cfloat", "math.h", "cmath", "type_traits",
})


class CandidateError(ValueError):
    """A candidate that cannot be compiled or launched as given; the message says what to fix."""


@dataclass(frozen=True)
class ClassChoice:
    """What a per-class winner chose for one shape class, and why (for the audit pack)."""

    defines: dict[str, int]  # the tunables this class's cases run with
    variant: bool  # True: a class variant; False: the shared default
    why: str

    def to_json(self) -> dict:
        return {"defines": dict(self.defines), "variant": self.variant, "why": self.why}


@dataclass
class Candidate:
    """One proposal. ``defines`` (autotune) are baked into the source as ``#ifndef``-guarded
    ``#define`` lines, so what is timed is exactly what ``best.cu`` holds and what a review branch
    ships, and a class variant's ``-DNAME=value`` options override them for its class's cases.
    ``classes`` are those variants (the suite's ``classes:``); ``choices`` says per class what
    an autotune per-class winner picked and why."""

    source: str
    launch: Launch
    launch_overrides: dict[str, Launch] = field(default_factory=dict)
    defines: dict[str, int] = field(default_factory=dict)
    origin: str = ""  # initial / openai / autotune / replay
    label: str = ""  # short, for people: a proposal file's name, a tunable setting, a model's title
    notes: str = ""  # the proposer's own words (a model's summary of its idea)
    classes: dict[str, Variant] = field(default_factory=dict)
    choices: dict[str, ClassChoice] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The source as compiled: the defines first (each overridable by a -D option), then the source."""
        if not self.defines:
            return self.source
        lines = [AUTOTUNE_COMMENT]
        lines += [f"#ifndef {name}\n#define {name} {value}\n#endif" for name, value in self.defines.items()]
        return "\n".join(lines) + "\n" + self.source

    def is_own_source(self, program: Program) -> bool:
        """Is this the suite's own kernel or tuning template (after at most the autotune header of
        ``#define`` defaults)? Such text may include what the suite's file includes. Decided from the
        text, so a replayed audit pack is held to the rules its attempts were searched under."""
        if self.origin in ("initial", "autotune"):
            return True
        for path in (program.source, program.tuning_source):
            own = path.read_text(encoding="utf-8") if path is not None else None
            if own is not None and self.text.endswith(own) and AUTOTUNE_HEADER.fullmatch(self.text[:len(self.text) - len(own)]):
                return True
        return False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def key(self) -> str:
        """Identity of the builds and launches: two equal keys time the same thing."""
        blob = json.dumps({"text": self.text, **self.launch_json()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def program(self, base: Program) -> Program:
        """``base`` (the suite's kernel) with this launch and these class variants; source comes as
        text, options stay."""
        return replace(base, launch=self.launch, launch_overrides=dict(self.launch_overrides), tunables={},
                       tuning_launch=None, tuning_overrides={}, tuning_source=None, classes=dict(self.classes))

    def launch_json(self) -> dict:
        return {"launch": self.launch.to_json(),
                "launch_overrides": {k: v.to_json() for k, v in sorted(self.launch_overrides.items())},
                **({"classes": {k: v.to_json() for k, v in sorted(self.classes.items())}} if self.classes else {})}

    def to_json(self) -> dict:
        return {"origin": self.origin, "label": self.label, "notes": self.notes, "defines": dict(self.defines),
                "source_sha256": self.sha256, "source": self.text, **self.launch_json(),
                **({"choices": {k: c.to_json() for k, c in sorted(self.choices.items())}} if self.choices else {})}

    @classmethod
    def initial(cls, program: Program) -> Candidate:
        return cls(source=program.source.read_text(encoding="utf-8"), launch=program.launch,
                   launch_overrides=dict(program.launch_overrides), origin="initial", label="initial kernel",
                   classes=dict(program.classes))


def launch_from_json(raw: dict, what: str = "launch") -> Launch:
    """A :class:`Launch` from ``{grid: [...], block: [...], shared_bytes: ...}`` (expressions as text)."""
    if not isinstance(raw, dict):
        raise CandidateError(f"{what}: expected an object with grid, block and shared_bytes")
    grid, block = raw.get("grid"), raw.get("block")
    for name, dims in (("grid", grid), ("block", block)):
        if not isinstance(dims, list) or not 1 <= len(dims) <= 3:
            raise CandidateError(f"{what}.{name}: expected a list of 1 to 3 integer expressions, got {dims!r}")
        for dim in dims:
            if isinstance(dim, bool) or not isinstance(dim, (str, int)) or (isinstance(dim, str) and not dim.strip()):
                raise CandidateError(f"{what}.{name}: {dim!r} is not an integer expression")
    shared = raw.get("shared_bytes", 0)
    if shared is None or (isinstance(shared, str) and not shared.strip()):
        shared = 0
    if isinstance(shared, bool) or not isinstance(shared, (str, int)):
        raise CandidateError(f"{what}.shared_bytes: {shared!r} is not an integer expression")
    return Launch(tuple(str(d) for d in grid), tuple(str(d) for d in block), str(shared))


def classes_from_json(raw, what: str = "classes") -> dict[str, Variant]:
    """Per-class variants from ``{CLASS: {options: ["-DNAME=value", ...], launch: {...}}}`` (the suite's
    ``classes:``), with the options the compiler refuses (include paths, pre-includes) refused here."""
    if not isinstance(raw, dict):
        raise CandidateError(f"{what}: expected an object mapping a shape class to {{options, launch}}")
    variants = {}
    for name, entry in raw.items():
        where = f"{what}[{name}]"
        if not isinstance(entry, dict):
            raise CandidateError(f"{where}: expected an object with options (a list such as [\"-DBM=64\"]) "
                                 "and an optional launch")
        options = entry.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise CandidateError(f"{where}.options: expected a list of strings such as [\"-DBM=64\"], got {options!r}")
        if len(options) > MAX_VARIANT_OPTIONS:
            raise CandidateError(f"{where}.options: {len(options)} options; at most {MAX_VARIANT_OPTIONS}")
        for option in options:
            if len(option) > MAX_VARIANT_OPTION_CHARS or not VARIANT_OPTION.fullmatch(option):
                raise CandidateError(f"{where}.options: {option[:80]!r} is not a macro definition; a variant sets "
                                     f"macros only, as -DNAME or -DNAME=value (at most {MAX_VARIANT_OPTION_CHARS} "
                                     "characters)")
        try:
            check_options(options)
        except CompileOptionError as exc:
            raise CandidateError(f"{where}.options: {exc}; remove it from the variant") from None
        launch = launch_from_json(entry["launch"], f"{where}.launch") if entry.get("launch") is not None else None
        variants[str(name)] = Variant(options=tuple(options), launch=launch)
    return variants


def c_prototype(suite: Suite, entry: str) -> str:
    """The entry's C declaration, e.g. ``extern "C" __global__ void f(const float* __restrict__ a, ...)``."""
    params = []
    for p in suite.signature:
        ctype = DTYPES[p.dtype][1]
        if p.kind == "buffer":
            params.append(f"{'const ' if p.intent == 'in' else ''}{ctype}* __restrict__ {p.name}")
        else:
            params.append(f"{ctype} {p.name}")
    return f'extern "C" __global__ void {entry}({", ".join(params)})'


def include_problems(source: str, allowed_quoted: set[str]) -> list[str]:
    """Every ``#include``-like directive that names a file outside the allowed set, found as the
    preprocessor finds them (see :func:`pytest_cudagate.suite.includes.directives`)."""
    problems = []
    for found in directives(source):
        if found.directive != "include" or (found.system is None and found.quoted is None):
            problems.append(f"line {found.line}: #{found.directive}{found.rest[:60]}: only #include of a header "
                            "named literally is allowed")
        elif found.quoted is not None and found.quoted not in allowed_quoted:
            allowed = ", ".join(sorted(allowed_quoted)) or "none"
            problems.append(f'line {found.line}: #include "{found.quoted}": the only local headers allowed are the '
                            f"ones the shipped kernel includes ({allowed})")
        elif found.system is not None and found.system not in SYSTEM_HEADERS:
            problems.append(f"line {found.line}: #include <{found.system}> is not on the list of CUDA toolkit headers "
                            f"a candidate may use ({', '.join(sorted(SYSTEM_HEADERS))})")
    return problems


def allowed_headers(program: Program) -> set[str]:
    """Local headers the shipped kernel includes (by the spelling its source uses)."""
    try:
        return set(local_headers(program.source, include=program.include))
    except (OSError, CudagateError):
        return set()


def static_problems(candidate: Candidate, suite: Suite, program: Program, visible: list, *,
                    own_source: bool = False) -> list[str]:
    """Why ``candidate`` cannot be compiled or launched as given (empty: it may go to the compiler).

    ``visible``: the cases the proposer may know of; launches are checked on those only, so a
    message never tells a proposer anything about a holdout case. ``own_source``: the source is
    the suite's own kernel file (the initial kernel, autotune), so its includes are not limited.
    """
    problems = []
    if len(candidate.text) > MAX_SOURCE_CHARS and not own_source:
        problems.append(f"the source has {len(candidate.text)} characters; at most {MAX_SOURCE_CHARS} are accepted")
    if not re.search(rf"\b{re.escape(program.entry)}\s*\(", candidate.text):
        problems.append(f"the source does not define the entry {program.entry!r}; declare it as "
                        f"{c_prototype(suite, program.entry)}")
    if not own_source:
        problems += include_problems(candidate.text, allowed_headers(program))
    scalars = {p.name for p in suite.signature if p.kind == "scalar"} | set(suite.derived) | set(device.FACTS)
    names = {c.name for c in visible}
    launches = [("launch", candidate.launch)] + [(f"launch_overrides[{k}]", v) for k, v in candidate.launch_overrides.items()]
    launches += [(f"classes[{k}].launch", v.launch) for k, v in candidate.classes.items() if v.launch]
    # The suite's own entries for hidden cases or classes stay as they are (a candidate keeps them
    # unchanged, and the initial kernel carries them); a proposer may not add or change one.
    for case, launch in candidate.launch_overrides.items():
        if case not in names and launch != program.launch_overrides.get(case):
            problems.append(f"launch_overrides names {case!r}, which is not one of the cases ({', '.join(sorted(names))})")
    classes = {c.shape_class for c in visible}
    for shape_class, variant in candidate.classes.items():
        if shape_class not in classes and variant != program.classes.get(shape_class):
            problems.append(f"classes names {shape_class!r}, which is not a class of the cases ({', '.join(sorted(classes))})")
    for what, launch in launches:
        for part, exprs in (("grid", launch.grid), ("block", launch.block), ("shared_bytes", (launch.shared_bytes,))):
            if part != "shared_bytes" and not 1 <= len(exprs) <= 3:
                problems.append(f"{what}.{part}: needs 1 to 3 dimensions, has {len(exprs)}")
            for expr in exprs:
                try:
                    unknown = sorted(parse(expr).names - scalars)
                except ExprError as exc:
                    problems.append(f"{what}.{part}: {exc}")
                    continue
                if unknown:
                    problems.append(f"{what}.{part}: {expr!r} uses {', '.join(unknown)}; launch expressions may use "
                                    f"only the scalars {', '.join(sorted(scalars))}, integers, + - * / // % and "
                                    "cdiv/min/max")
    if problems:
        return problems
    built = candidate.program(program)
    for case in visible:
        problems += launch_problems(built.for_case(case).launch_for(case.name), case, suite.scalars(case))
    return problems


def launch_problems(launch: Launch, case, scalars: dict) -> list[str]:
    """Limits of the hardware a launch breaks on ``case`` (sm_90); ``scalars``: the case's, derived ones included."""
    try:
        resolved = launch.resolve(device.with_facts(scalars))
    except ExprError as exc:
        return [f"case {case.name}: {exc}"]
    grid, block, shared = resolved["grid"], resolved["block"], resolved["shared_bytes"]
    problems = []
    where = f"case {case.name} ({', '.join(f'{k}={v}' for k, v in case.scalars.items())})"
    if min(grid + block) < 1:
        problems.append(f"{where}: grid {grid} and block {block} need every dimension >= 1")
    if block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
        problems.append(f"{where}: block {block} has {block[0] * block[1] * block[2]} threads; at most "
                        f"{MAX_THREADS_PER_BLOCK}")
    if any(b > m for b, m in zip(block, MAX_BLOCK)) or any(g > m for g, m in zip(grid, MAX_GRID)):
        problems.append(f"{where}: grid {grid} / block {block} exceed the limits {list(MAX_GRID)} / {list(MAX_BLOCK)}")
    if not 0 <= shared <= MAX_SHARED_BYTES:
        problems.append(f"{where}: shared_bytes {shared} is outside 0..{MAX_SHARED_BYTES}")
    return problems
