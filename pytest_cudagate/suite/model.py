"""The typed form of a suite file (``cudagate.yaml``): what flows from the loader to everything else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .expr import evaluate


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "buffer" or "scalar"
    dtype: str
    intent: str | None = None  # in / out / inout, buffers only
    size: str | None = None
    shape: tuple[str, ...] | None = None

    @property
    def is_output(self) -> bool:
        return self.intent in ("out", "inout")

    @property
    def is_input(self) -> bool:
        return self.intent in ("in", "inout")

    def protocol(self) -> dict:
        entry = {"name": self.name, "kind": self.kind, "dtype": self.dtype}
        if self.kind == "buffer":
            entry["intent"] = self.intent
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


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0
    nan: str = "fail"
    max_rel_norm: float | None = None


@dataclass(frozen=True)
class Distribution:
    distribution: str = "uniform"
    low: float = -1.0
    high: float = 1.0
    mean: float = 0.0
    std: float = 1.0


@dataclass(frozen=True)
class Timing:
    warmup: int = 10
    repeat: int = 100
    cache: str = "cold"
    warmup_ms: float = 50.0  # keep warming up until the clocks have ramped (see harness runner)
    batch: int = 1  # launches per event pair; hot cache only

    def to_json(self) -> dict:
        return {"warmup": self.warmup, "repeat": self.repeat, "cache": self.cache, "warmup_ms": self.warmup_ms,
                "batch": self.batch}


@dataclass(frozen=True)
class Program:
    """CUDA source compiled and launched the same way for a kernel or a CUDA reference."""

    name: str
    source: Path
    entry: str
    options: tuple[str, ...]
    launch: Launch
    launch_overrides: dict[str, Launch] = field(default_factory=dict)
    arch_suffix: str = ""

    def launch_for(self, case: str) -> Launch:
        return self.launch_overrides.get(case, self.launch)


@dataclass(frozen=True)
class Reference:
    program: Program | None = None  # a trusted CUDA kernel, or
    python: str | None = None  # FILE.py:FUNCTION relative to the suite


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # correctness / performance
    scalars: dict
    holdout: bool = False
    seed: int | None = None


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
        raise KeyError(f"suite {self.name!r} has no kernel {name!r} (kernels: {', '.join(k.name for k in self.kernels)})")

    def case(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"suite {self.name!r} has no case {name!r}")

    def counts(self, case: Case) -> dict[str, int]:
        return {p.name: evaluate(p.size, case.scalars) for p in self.buffers}

    def shape(self, param: Param, case: Case) -> tuple[int, ...]:
        if param.shape:
            return tuple(evaluate(e, case.scalars) for e in param.shape)
        return (evaluate(param.size, case.scalars),)

    def case_dir(self, case: Case) -> Path:
        return self.data_dir / case.name

    def input_path(self, case: Case, param: Param) -> Path:
        return self.case_dir(case) / f"{param.name}.npy"

    def expected_path(self, case: Case, param: Param) -> Path:
        return self.case_dir(case) / "expected" / f"{param.name}.npy"
