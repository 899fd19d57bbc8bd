"""The typed form of a suite file (``cudagate.yaml``): what flows from the loader to everything else."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import DTYPES, numpy_dtype, unit_roundoff

from pytest_cudagate.suite import device
from pytest_cudagate.suite.expr import ExprError, evaluate, parse, parse_condition
from pytest_cudagate.suite.instantiate import label
from pytest_cudagate.suite.steps import CopyStep, LibraryStep, MemsetStep, element_bits, from_record
from pytest_cudagate.boundary.wire import json_field

INT_DTYPES = tuple(name for name in DTYPES if numpy_dtype(name).kind in "iu")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "buffer" or "scalar"
    dtype: str
    intent: str | None = None  # in / out / inout / scratch, buffers only
    size: str | None = None
    shape: tuple[str, ...] | None = None
    # `ld:` of a 2-D buffer: its rows sit this many elements apart on the device (an expression at
    # least the row length); the elements between a row's end and the next row are padding the
    # kernel must leave untouched. Case files, the reference and the judge see the logical shape.
    ld: str | None = None
    # A scratch buffer's initial value (`init:`, as written): set before every run of the kernel,
    # outside the timed region, instead of the poison. None: poisoned. Signed only where given.
    init: str | float | int | None = None

    @property
    def is_output(self) -> bool:
        return self.intent in ("out", "inout")

    @property
    def is_input(self) -> bool:
        return self.intent in ("in", "inout")

    @property
    def is_scratch(self) -> bool:
        """A workspace the kernel's steps share: poisoned before every run, never compared, never
        shown to the reference."""
        return self.intent == "scratch"

    def protocol(self) -> dict:
        entry = {"name": self.name, "kind": self.kind, "dtype": self.dtype}
        if self.kind == "buffer":
            entry["intent"] = self.intent
        if self.init is not None:
            entry["init"] = element_bits(self.init, self.dtype)[0]
        return entry


@dataclass(frozen=True)
class Launch:
    grid: tuple[str, ...]
    block: tuple[str, ...]
    shared_bytes: str = "0"

    def resolve(self, scalars: dict) -> dict:
        def dims(exprs):
            values = [evaluate(e, scalars) for e in exprs]
            return values + [1] * (3 - len(values))

        return {"grid": dims(self.grid), "block": dims(self.block),
                "shared_bytes": evaluate(self.shared_bytes, scalars)}

    def to_json(self) -> dict:
        return {"grid": list(self.grid), "block": list(self.block), "shared_bytes": self.shared_bytes}

    def names(self) -> frozenset[str]:
        """The names the expressions read; an expression that does not parse adds none (resolving
        the launch says why)."""
        found: set[str] = set()
        for text in (*self.grid, *self.block, self.shared_bytes):
            try:
                found |= parse(text).names
            except ExprError:
                pass
        return frozenset(found)

    @classmethod
    def from_record(cls, raw: dict) -> Launch:
        """A launch as a ledger records it (expressions as text or integers)."""
        return cls(tuple(str(e) for e in raw["grid"]), tuple(str(e) for e in raw["block"]),
                   str(raw.get("shared_bytes", "0")))

    def with_constants(self, values: dict[str, int]) -> Launch:
        """This launch with each name in ``values`` (tunables) replaced by its integer value.

        An integer (parenthesised when negative) stands where a name stood, so precedence cannot
        change, and a launch that uses none of the names comes back with identical text.
        """
        if not values:
            return self
        spelled = {name: str(v) if v >= 0 else f"({v})" for name, v in values.items()}

        def substitute(text: str) -> str:
            return re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: spelled.get(m.group(0), m.group(0)), str(text))

        return Launch(tuple(substitute(e) for e in self.grid), tuple(substitute(e) for e in self.block),
                      substitute(self.shared_bytes))


@dataclass(frozen=True)
class Step:
    """One launch of a multi-launch operation: an entry of the kernel's source, the signature's
    parameters it takes, in its own order, and its launch configuration."""

    entry: str
    args: tuple[str, ...]
    launch: Launch

    def to_json(self) -> dict:
        return {"entry": self.entry, "args": list(self.args), **self.launch.to_json()}

    def resolve(self, scalars: dict) -> dict:
        return {"entry": self.entry, "args": list(self.args), **self.launch.resolve(scalars)}

    def names(self) -> frozenset[str]:
        return self.launch.names()

    @property
    def params(self) -> tuple[str, ...]:
        return self.args

    @property
    def writes(self) -> tuple[str, ...]:
        """What it may write: every parameter it takes (a launch's writes are not known before it runs)."""
        return self.args


AnyStep = Step | MemsetStep | CopyStep | LibraryStep


@dataclass(frozen=True)
class Steps:
    """The launch of a kernel given as ``steps:``: its launches in order, timed as one unit between
    one event pair. It stands where a :class:`Launch` stands (resolved per case, pinned by an approval,
    signed in the manifest), so the number, order, entries and arguments of the steps are all part of
    the kernel's identity. A step may also be a memset, a copy or a library call (suite/steps.py),
    enqueued between the launches on the same stream."""

    steps: tuple[AnyStep, ...]

    def resolve(self, scalars: dict) -> list[dict]:
        return [s.resolve(scalars) for s in self.steps]

    def to_json(self) -> list[dict]:
        return [s.to_json() for s in self.steps]

    def names(self) -> frozenset[str]:
        return frozenset().union(*(s.names() for s in self.steps))

    def with_constants(self, values: dict[str, int]) -> Steps:
        return Steps(tuple(replace(s, launch=s.launch.with_constants(values)) if isinstance(s, Step) else s
                           for s in self.steps))

    @property
    def launches(self) -> tuple[Step, ...]:
        """The kernel launches among the steps, in order."""
        return tuple(s for s in self.steps if isinstance(s, Step))

    @property
    def entries(self) -> list[str]:
        """The distinct entries the steps launch, in order of first use."""
        return list(dict.fromkeys(s.entry for s in self.launches))


def launch_from_record(raw: dict | list) -> Launch | Steps:
    """A launch as a ledger or a request records it: one launch, or a kernel's steps."""
    if isinstance(raw, list):
        return Steps(tuple(Step(str(s["entry"]), tuple(str(a) for a in s["args"]), Launch.from_record(s))
                           if "entry" in s else from_record(s) for s in raw))
    return Launch.from_record(raw)


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0  # a bfloat16 or float8 output's: default_rtol(dtype) when the suite leaves it out
    nan: str = "fail"
    max_rel_norm: float | None = None
    # Also pass within this many units in the last place of the output's type. Left out of a report
    # while unset, so reports of suites without it read as they did before it existed.
    ulp: int | None = json_field(default=None, omit_default=True)


# A low-precision output's rtol when its tolerance leaves rtol out: 4u, two units in the last place
# where they are widest (just above a power of two one ulp is 2u relative), so a kernel whose float32
# result rounds the other way than the reference's passes, with one more ulp for accumulation order.
DEFAULT_RTOL_UNITS = 4


def default_rtol(dtype: str) -> float:
    """The rtol a bfloat16 or float8 output gets when its tolerance names none: bfloat16 2^-6,
    float8_e4m3fn 2^-2, float8_e5m2 2^-1 (u = 2^-8, 2^-4, 2^-3)."""
    return DEFAULT_RTOL_UNITS * unit_roundoff(dtype)


@dataclass(frozen=True)
class Distribution:
    distribution: str = "uniform"
    low: float = -1.0
    high: float = 1.0
    mean: float = 0.0
    std: float = 1.0
    adversarial_max: float | None = None  # the largest |value| an adversarial fresh set may give the input
    # outliers: the base distribution's draws with k values of each row (or block of ``per`` elements)
    # replaced by ±scale·u, u uniform in [0.5, 1]
    base: Distribution | None = None
    k: int | None = None
    scale: float | None = None
    per: str | int | None = None

    def group(self, shape: tuple[int, ...]) -> int:
        """How many elements share an outlier distribution's k outliers: a row (the last dimension) or a block."""
        return (shape[-1] if shape else 1) if self.per in (None, "row") else int(self.per)


def default_bounds(distribution: str, dtype: str) -> tuple[float, float]:
    """low and high where a suite gives none (schemas/suite.schema.json, $defs/distribution): uniform
    in [-1, 1]; integers in [-100, 100], unsigned [0, 100] (three values of [-1, 1] test little)."""
    if distribution == "integers":
        return (0 if dtype.startswith("u") else -100), 100
    return -1.0, 1.0


# A kernel timed alone takes 3 blocks: its run level (10th percentile) from 300 launches lands within
# 1.2% of the level from 1000 on the examples' H200 approval runs, against an interval of about
# ±8.6% for an unchanged kernel (benchmarks/run_level_rounds.py).
BASELINE_BLOCKS = 3


@dataclass(frozen=True)
class Timing:
    """How a kernel is timed. ``repeat`` has one meaning on every path: the timed launches of one
    measurement block. The interleaved comparison's first chunk is one block (``repeat`` rounds of one
    launch of each kernel; later chunks grow within the gate's budget), the optimizer times one block
    per case, a kernel without an approved version is timed for one block, and a kernel timed alone
    (a stored baseline, or a kernel identical to its approval) for :attr:`baseline_rounds`."""

    warmup: int = 10
    repeat: int = 100
    cache: str = "cold"
    warmup_ms: float = 50.0  # keep warming up until the clocks have ramped (see harness runner)
    batch: int = 1  # launches per event pair; hot cache only

    @property
    def baseline_rounds(self) -> int:
        return BASELINE_BLOCKS * self.repeat

    def to_json(self) -> dict:
        return {"warmup": self.warmup, "repeat": self.repeat, "cache": self.cache, "warmup_ms": self.warmup_ms,
                "batch": self.batch}


SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck")


@dataclass(frozen=True)
class Checks:
    """The gate's defences against kernels that game it (``checks:`` in the suite); all on by default.

    A suite relaxes one explicitly, and every outcome of the suite then says so (docs/hardening.md).
    """

    determinism: str = "bitwise"  # "tolerance": launches on the same inputs may differ within tolerance
    fresh_inputs: int = 2  # fresh input sets per case, checked against the reference; 0 switches them off
    adversarial_inputs: bool = True  # every second fresh set has extreme magnitudes, signed zeros, ...
    guard_zones: bool = True  # canary zones around every buffer
    output_scale: bool = True  # a trivial output (zeros, a constant) must not pass a loose tolerance
    timed_outputs: bool = True  # what the timed launches wrote is checked
    fresh_timing: bool = True  # a share of an interleaved comparison's rounds runs on a fresh input set
    scrub_shared: bool = True  # shared memory is scrubbed before each validation launch
    sanitizer: tuple[str, ...] = SANITIZER_TOOLS  # compute-sanitizer tools, run once per kernel

    def relaxations(self) -> dict:
        """The settings that differ from the defaults, as written in the suite (empty: none)."""
        default = Checks()
        out = {}
        for name in ("determinism", "fresh_inputs", "adversarial_inputs", "guard_zones", "output_scale",
                     "timed_outputs", "fresh_timing", "scrub_shared", "sanitizer"):
            value = getattr(self, name)
            if value != getattr(default, name):
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def describe_relaxations(self) -> list[str]:
        """One line per relaxation, for every outcome of a suite that relaxes its checks."""
        lines = []
        for name, value in self.relaxations().items():
            what = {
                "determinism": "launches on the same inputs may differ bit for bit within tolerance",
                "fresh_inputs": "no fresh inputs are checked" if not self.fresh_inputs
                else f"{self.fresh_inputs} fresh input set(s) per case instead of {Checks.fresh_inputs}",
                "adversarial_inputs": "fresh inputs use the suite's distributions only, no adversarial values",
                "guard_zones": "no guard zones: writes past a buffer are not detected",
                "output_scale": "outputs are not judged against their own scale (zeros may pass a loose tolerance)",
                "timed_outputs": "what the timed launches wrote is not checked",
                "fresh_timing": "latency is timed on the signed inputs only: a kernel that recognises them is "
                                "not timed on any other",
                "scrub_shared": "shared memory is not scrubbed before validation launches",
                "sanitizer": "compute-sanitizer does not run" if not self.sanitizer
                else f"compute-sanitizer runs {', '.join(self.sanitizer)} only",
            }[name]
            if isinstance(value, list):
                shown = "[" + ", ".join(value) + "]" if value else "off"
            else:
                shown = str(value).lower() if isinstance(value, bool) else value
            lines.append(f"checks relaxed by the suite (checks.{name}: {shown}): {what}")
        return lines


DEFAULT_CHECKS = Checks()


@dataclass(frozen=True)
class Variant:
    """A kernel's build and launch for the cases of one shape class (``classes:`` in the suite).

    Its options come after the kernel's (a later ``-DNAME=value`` wins), and its launch, when
    given, replaces the kernel's launch for the class's cases; a case's ``launch_overrides``
    entry still wins over both (see :meth:`Program.for_case`).
    """

    options: tuple[str, ...] = ()
    launch: Launch | None = None

    def to_json(self) -> dict:
        return {"options": list(self.options), **({"launch": self.launch.to_json()} if self.launch else {})}


@dataclass(frozen=True)
class LibraryBaseline:
    """``library_baseline:`` of a kernel: a registered adapter (cudagate_harness.library.ADAPTERS)
    and the parameter each of its roles reads, timed beside the kernel for information only."""

    adapter: str
    args: dict[str, str]  # role -> parameter name

    def to_json(self) -> dict:
        return {"adapter": self.adapter, "args": dict(self.args)}


@dataclass(frozen=True)
class Program:
    """CUDA source compiled and launched the same way for a kernel or a CUDA reference.

    A kernel with ``classes`` (per-class variants) is several builds of one source: resolve the
    build a case runs with :meth:`for_case` (or :meth:`for_class`), the one place that decides it.
    """

    name: str
    source: Path
    entry: str  # a stepped kernel's: its first step's
    options: tuple[str, ...]
    launch: Launch | Steps
    launch_overrides: dict[str, Launch] = field(default_factory=dict)
    arch_suffix: str = ""
    # `cudagate optimize --proposer autotune` only: -D constants and the values to search (the first
    # is the default, which the launch above already has substituted for the name), the launch
    # it tunes with, whose expressions may use the tunables' names, and the source it builds
    # candidates from when that is not ``source`` (a template file). Not signed: they change nothing
    # the gate runs (trust/manifest.py signs a kernel's entry and launches only).
    tunables: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tuning_launch: Launch | None = None
    tuning_overrides: dict[str, Launch] = field(default_factory=dict)
    tuning_source: Path | None = None
    classes: dict[str, Variant] = field(default_factory=dict)  # shape class -> its variant
    variant: str | None = None  # set by for_class: the class whose variant this build is
    # Informational only (never a verdict), so not signed, as tunables are not: the manifest signs a
    # kernel's entry and launches, and a pull request that edits the mapping changes only a column.
    library_baseline: LibraryBaseline | None = None
    # The project's include folders ([tool.cudagate] include), searched for quoted includes after the
    # suite: their headers travel with the kernel like the suite's, and count in its identity.
    include: tuple[Path, ...] = ()
    # auto, nvcc or nvrtc (cudagate_harness.compiler.chosen): pinned by an approval like the options.
    compiler: str = "auto"
    # `requires:`: conditions over a case's scalars; a case that breaks one is absent for this kernel
    # (skipped, never approved or judged). Signed in the manifest where given.
    requires: tuple[str, ...] = ()
    # `outputs:`: the outputs this kernel is judged on; None: every output of the signature. Signed
    # in the manifest where given.
    judged: tuple[str, ...] | None = None
    # The suite's derived scalars (Suite.derivations), which `requires` may read too.
    derived: tuple[tuple[str, str, str | None], ...] = ()

    def skip_reason(self, case: Case) -> str | None:
        """Why ``case`` is absent for this kernel: the first of its ``requires`` the case breaks, with
        the values of the scalars it reads (derived ones too); None when the case meets them all."""
        scalars = derive(case.scalars, self.derived) if self.requires and self.derived else case.scalars
        for text in self.requires:
            condition = parse_condition(text)
            if not condition.holds(scalars):
                values = ", ".join(f"{name}={scalars[name]}" for name in sorted(condition.names))
                return f"kernel {self.name} requires {text} ({values}): case {case.name} is not one of its cases"
        return None

    def runs(self, case: Case) -> bool:
        return self.skip_reason(case) is None

    def for_class(self, shape_class: str) -> Program:
        """The build the cases of ``shape_class`` run: the kernel's options plus the class variant's,
        launched with the variant's launch (``launch_overrides`` of a case still win); the kernel
        as declared (the shared default) when the class has no variant."""
        if not self.classes:
            return self
        variant = self.classes.get(shape_class)
        if variant is None:
            return replace(self, classes={})
        return replace(self, options=self.options + variant.options, launch=variant.launch or self.launch,
                       classes={}, variant=shape_class)

    def for_case(self, case: Case) -> Program:
        return self.for_class(case.shape_class)

    @property
    def shared(self) -> Program:
        """The build of cases whose class has no variant (and the one whose source all variants share)."""
        return replace(self, classes={}) if self.classes else self

    def builds(self, cases) -> list[Program]:
        """The distinct builds ``cases`` run, in case order (the shared build when there are no cases)."""
        found: list[Program] = []
        for program in [self.for_case(c) for c in cases] or [self.shared]:
            if program not in found:
                found.append(program)
        return found

    @property
    def build_name(self) -> str:
        """The kernel's name, and for a class variant's build its class and all its options."""
        return f"{self.name} (variant of class {self.variant}: options {list(self.options)})" if self.variant else self.name

    @property
    def steps(self) -> tuple[AnyStep, ...]:
        """The kernel's steps in order (launches, memsets, copies, library calls), or () for a single
        launch of the whole signature."""
        return self.launch.steps if isinstance(self.launch, Steps) else ()

    @property
    def launch_steps(self) -> tuple[Step, ...]:
        """The kernel launches among its steps (the entries compiled and checked against their args)."""
        return self.launch.launches if isinstance(self.launch, Steps) else ()

    @property
    def entries(self) -> list[str]:
        """Every entry the kernel launches (one unless it has steps)."""
        return self.launch.entries if isinstance(self.launch, Steps) else [self.entry]

    def launch_for(self, case: str) -> Launch | Steps:
        """The launch of the case named ``case`` on this build (a case's override wins)."""
        if self.classes:
            raise ValueError(f"{self.name} has class variants: resolve the case's build with for_case() first")
        return self.launch_overrides.get(case, self.launch)


@dataclass(frozen=True)
class Reference:
    program: Program | None = None  # a trusted CUDA kernel, or
    python: str | None = None  # FILE.py:FUNCTION relative to the suite


DEFAULT_CLASS = "default"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # correctness / performance
    scalars: dict
    holdout: bool = False
    seed: int | None = None
    shape_class: str = DEFAULT_CLASS  # `class:` in the suite: selects cases (--cuda-gate-class, -k)
    generated: bool = False  # no stored arrays: drawn and computed at run time (suite/generated.py)
    constant_ok: bool = False  # a maintainer accepts that a constant output may pass (e.g. one element)


def derivations(signature, derived: dict[str, str]) -> tuple[tuple[str, str, str | None], ...]:
    """Each of ``derived`` as (name, expression, the type ``signature`` gives it or None)."""
    types = {p.name: p.dtype for p in signature if p.kind == "scalar"}
    return tuple((name, text, types.get(name)) for name, text in derived.items())


def derive(scalars: dict, derivations: tuple[tuple[str, str, str | None], ...]) -> dict:
    """``scalars`` followed by each derived scalar ``(name, expression, dtype)``, evaluated over those
    before it; one the signature declares (``dtype``) takes its type (a whole number for an integer
    type, a float otherwise). Raises :class:`ExprError` naming the derived scalar that fails."""
    values = dict(scalars)
    for name, text, dtype in derivations:
        try:
            value = parse(text).value(values)
        except ExprError as exc:
            raise ExprError(f"derived scalar {name}: {exc}") from None
        if dtype is not None and np.issubdtype(numpy_dtype(dtype), np.integer):
            if isinstance(value, float) and not value.is_integer():
                raise ExprError(f"derived scalar {name} = {text!r} gives {value}, but {name} is {dtype}: "
                                "write a whole-number expression (// or cdiv divide to one)")
            value = int(value)
        elif dtype is not None:
            value = float(value)
        values[name] = value
    return values


@dataclass(frozen=True)
class Suite:
    path: Path
    name: str
    signature: tuple[Param, ...]
    reference: Reference
    kernels: tuple[Program, ...]
    cases: tuple[Case, ...]
    tolerance: dict[str, Tolerance]
    inputs: dict[str, Distribution]
    timing: Timing
    threshold: float
    data_dir: Path
    description: str = ""
    # `derived:` scalar name -> its expression over the case's scalars, in the order they are
    # evaluated (each after the derived scalars it reads). Signed only where given (trust/manifest.py).
    derived: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def buffers(self) -> tuple[Param, ...]:
        return tuple(p for p in self.signature if p.kind == "buffer")

    @property
    def outputs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.signature if p.is_output)

    def kernel(self, name: str) -> Program:
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        names = [k.name for suite in self.instances for k in suite.kernels]
        raise KeyError(f"suite {self.name!r} has no kernel {name!r} (kernels: {', '.join(names)})")

    # An instantiated suite file (`instantiate:`, suite/instantiate.py) loads as one Suite per
    # instantiation, each knowing all of them. Not fields: the manifest signs fields, and signs an
    # instantiated suite's instantiations as a whole (trust/manifest.py).
    @property
    def instances(self) -> tuple[Suite, ...]:
        """Every instantiation of the suite file, this one among them; (self,) for a plain suite."""
        return self.__dict__.get("_instances", (self,))

    @property
    def instantiate(self) -> dict[str, tuple[str, ...]]:
        """The suite file's ``instantiate:`` (each variable's types); {} for a plain suite."""
        return self.__dict__.get("_instantiation", ({}, {}))[0]

    @property
    def types(self) -> dict[str, str]:
        """This instantiation's type of each variable; {} for a plain suite."""
        return self.__dict__.get("_instantiation", ({}, {}))[1]

    @property
    def label(self) -> str:
        """This instantiation's name (``T=bfloat16``); "" for a plain suite."""
        return label(self.types)

    @property
    def ident(self) -> str:
        """The suite file and instantiation (``path[T=bfloat16]``): what keys a run's state per suite,
        as each instantiation has arrays of its own."""
        return f"{self.path}[{self.label}]" if self.label else str(self.path)

    def instance_of(self, kernel: str) -> Suite:
        """The instantiation whose kernels include ``kernel`` (``gelu[T=bfloat16]``); this suite where
        none does (its :meth:`kernel` then says which names there are)."""
        return next((suite for suite in self.instances if any(k.name == kernel for k in suite.kernels)), self)

    @property
    def all_kernels(self) -> tuple[Program, ...]:
        """The kernels of every instantiation (this suite's kernels for a plain suite)."""
        return tuple(k for suite in self.instances for k in suite.kernels)

    def case(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"suite {self.name!r} has no case {name!r}")

    def scalars(self, case: Case) -> dict:
        """The case's scalars followed by the suite's derived ones (:func:`derive`). Raises
        :class:`ExprError` naming the derived scalar that fails."""
        return derive(case.scalars, self.derivations)

    @property
    def derivations(self) -> tuple[tuple[str, str, str | None], ...]:
        """Each derived scalar as (name, expression, its signature type or None), in evaluation order."""
        return derivations(self.signature, self.derived)

    def counts(self, case: Case) -> dict[str, int]:
        scalars = self.scalars(case)
        return {p.name: evaluate(p.size, scalars) for p in self.buffers}

    def layout(self, param: Param, case: Case) -> list[int] | None:
        """A padded buffer's [rows, cols, ld] on ``case`` (the worker's ``layout``); None without ``ld``."""
        if param.ld is None:
            return None
        rows, cols = self.shape(param, case)
        return [rows, cols, evaluate(param.ld, self.scalars(case))]

    def shape(self, param: Param, case: Case) -> tuple[int, ...]:
        scalars = self.scalars(case)
        if param.shape:
            return tuple(evaluate(e, scalars) for e in param.shape)
        return (evaluate(param.size, scalars),)

    def case_dir(self, case: Case) -> Path:
        """The case's signed folder (a generated case keeps only its digests and sample there)."""
        return self.data_dir / case.name

    def arrays_dir(self, case: Case) -> Path:
        """Where the case's input and expected-output arrays are: its signed folder, or for a
        generated case the folder it was materialised into this run (see :meth:`use_arrays`)."""
        if case.generated:
            return self.__dict__.get("_arrays", {}).get(case.name, self.case_dir(case))
        return self.case_dir(case)

    def use_arrays(self, case: Case, folder: Path) -> None:
        """Point a generated case at the folder its verified arrays were written to."""
        self.__dict__.setdefault("_arrays", {})[case.name] = folder  # not a field: the manifest signs fields
        self.__dict__.get("_resolved", {}).pop(case.name, None)

    def input_path(self, case: Case, param: Param) -> Path:
        return self.arrays_dir(case) / f"{param.name}.npy"

    def expected_path(self, case: Case, param: Param) -> Path:
        return self.arrays_dir(case) / "expected" / f"{param.name}.npy"

    def resolved(self, case: Case) -> ResolvedCase:
        """``case`` with every expression evaluated, built once per case of this suite."""
        cache = self.__dict__.setdefault("_resolved", {})  # not a field: the manifest signs fields
        known = cache.get(case.name)
        if known is not None and known.case == case:
            return known
        resolved = ResolvedCase(
            case=case, counts=self.counts(case), shapes={p.name: self.shape(p, case) for p in self.buffers},
            inputs={p.name: self.input_path(case, p) for p in self.buffers if p.is_input},
            expected={p.name: self.expected_path(case, p) for p in self.outputs}, scalars=self.scalars(case))
        if known is None and any(c == case for c in self.cases):
            cache[case.name] = resolved
        return resolved

    @property
    def checks(self) -> Checks:
        """The suite's ``checks:`` (defaults when absent).

        Deliberately not a dataclass field: trust/manifest.py signs every Suite field, so a new
        field would change the manifest of every signed suite. Relaxations are signed through
        ``Checks.relaxations()`` instead (see pytest_cudagate/hardening.py).
        """
        return self.__dict__.get("_checks", DEFAULT_CHECKS)


@dataclass(frozen=True)
class ResolvedCase:
    """One case of a suite with its expressions evaluated (:meth:`Suite.resolved`): what the
    request builder, the gate, the judge and the optimizer read instead of re-deriving it."""

    case: Case
    counts: dict[str, int]  # elements per buffer
    shapes: dict[str, tuple[int, ...]]  # per buffer
    inputs: dict[str, Path]  # the signed input files, per input buffer
    expected: dict[str, Path]  # the signed expected outputs, per output buffer
    scalars: dict  # the case's scalars and the suite's derived ones (Suite.scalars)

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def kind(self) -> str:
        return self.case.kind

    def launch(self, of: Program | Launch | Steps) -> dict | list[dict]:
        """The grid, block and dynamic shared bytes of ``of`` (a program: its launch for this case);
        for a kernel of steps, one such launch per step with its entry and arguments. Device facts
        are the held GPU's (suite/device.py)."""
        launch = of.for_case(self.case).launch_for(self.case.name) if isinstance(of, Program) else of
        return launch.resolve(device.with_facts(self.scalars))

    def expected_outputs(self) -> dict[str, np.ndarray]:
        """The signed expected outputs, as stored (the one place they are read for judging)."""
        return load_arrays(self.expected)


def judged(suite: Suite, kernel: str, resolved: ResolvedCase) -> tuple[dict[str, np.ndarray], dict[str, Tolerance]]:
    """The expected outputs and tolerances ``kernel``'s versions are judged on in ``resolved``: the
    outputs its ``outputs:`` names, else every output. The judge compares only what it is given, so an
    output left out is neither compared nor counted for unwritten elements (its guard zones stay)."""
    program = next((k for k in suite.kernels if k.name == kernel), None)
    names = set(program.judged) if program is not None and program.judged is not None else set(resolved.expected)
    expected = load_arrays({name: path for name, path in resolved.expected.items() if name in names})
    return expected, {name: tol for name, tol in suite.tolerance.items() if name in names}


def load_arrays(paths: dict[str, str | Path]) -> dict[str, np.ndarray]:
    """``.npy`` files by name, never unpickling."""
    return {name: np.load(path, allow_pickle=False) for name, path in paths.items()}


def manifest_entry(suite: Suite) -> dict | None:
    """What the signed manifest holds for the suite's ``checks:``: its relaxations, or None when it
    relaxes nothing (so every suite signed before ``checks`` existed keeps its signature)."""
    return suite.checks.relaxations() or None
