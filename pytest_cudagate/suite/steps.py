"""The steps of a kernel's ``steps:`` that are not launches: a memset, a copy, a library call, and the
value a buffer may be set to (a memset's ``value``, a scratch buffer's ``init``).

Each is part of the kernel's identity exactly as a launch step is: its record (``to_json``) is
pinned by an approval and signed in the manifest; it resolves per case into the worker's form
(cudagate_harness/steps.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cudagate_harness.library import ADAPTERS, StepAdapter
from cudagate_harness.protocol import LOW_PRECISION, encode, finfo, numpy_dtype, values

from pytest_cudagate.suite.expr import ExprError, evaluate, parse

SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
EXACT = ("float16", *LOW_PRECISION)  # a value for these must be one of the type's own


def element_bits(value, dtype: str) -> tuple[int | None, str | None]:
    """The bits of one ``dtype`` element holding ``value`` (a number, or inf, -inf, nan for a float
    type), or why it does not fit: an integer out of range, a float beyond the type's largest value,
    or for float16, bfloat16 and FP8 a value the type cannot hold exactly (its nearest is named)."""
    width = numpy_dtype(dtype).itemsize * 8
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        if type(value) is not int or not info.min <= value <= info.max:
            return None, f"{value!r} does not fit {dtype} ({info.min} to {info.max}); write a whole number within it"
        return value & ((1 << width) - 1), None
    if isinstance(value, str):
        if value not in SPECIAL:
            return None, f"{value!r} is not a number; write a number, or one of inf, -inf, nan"
        number = SPECIAL[value]
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{value!r} is not a number; write a number, or one of inf, -inf, nan"
    else:
        number = float(value)
    largest = float(finfo(dtype).max)
    if math.isfinite(number) and abs(number) > largest:
        return None, f"{value!r} is beyond {dtype}'s largest value {largest:g}; write a value within ±{largest:g}"
    if dtype in LOW_PRECISION:
        bits = encode(np.array([number]), dtype)
        held = float(values(bits)[0])
        word = int(bits.view(np.uint16 if dtype == "bfloat16" else np.uint8)[0])
    else:
        held_array = np.array([number], dtype=numpy_dtype(dtype))
        held, word = float(held_array[0]), int(held_array.view(f"<u{width // 8}")[0])
    if dtype in EXACT and not (held == number or (math.isnan(held) and math.isnan(number))):
        if math.isinf(number):
            return None, f"{dtype} has no infinity; write its largest value {largest:g} (or nan)"
        return None, f"{value!r} is not a {dtype} value (the nearest is {held!r}); write {held!r}"
    return word, None


@dataclass(frozen=True)
class MemsetStep:
    """Every element of ``buffer`` set to ``value`` (``bits``: one element of the buffer's type)."""

    buffer: str
    value: str | float | int
    bits: int
    kind: str = "memset"

    def resolve(self, scalars: dict) -> dict:
        return {"memset": {"buffer": self.buffer, "bits": self.bits}}

    def to_json(self) -> dict:
        return {"memset": {"buffer": self.buffer, "value": self.value, "bits": self.bits}}

    def names(self) -> frozenset[str]:
        return frozenset()

    @property
    def params(self) -> tuple[str, ...]:
        return (self.buffer,)

    @property
    def writes(self) -> tuple[str, ...]:
        return (self.buffer,)


@dataclass(frozen=True)
class CopyStep:
    """The first ``count`` elements (an expression; the loader's default: the source's size) of
    ``source`` copied into ``target``."""

    source: str
    target: str
    count: str
    kind: str = "copy"

    def resolve(self, scalars: dict) -> dict:
        return {"copy": {"from": self.source, "to": self.target, "count": evaluate(self.count, scalars)}}

    def to_json(self) -> dict:
        return {"copy": {"from": self.source, "to": self.target, "count": self.count}}

    def names(self) -> frozenset[str]:
        return _names([self.count])

    @property
    def params(self) -> tuple[str, ...]:
        return (self.source, self.target)

    @property
    def writes(self) -> tuple[str, ...]:
        return (self.target,)


@dataclass(frozen=True)
class LibraryStep:
    """A call of a registered library step adapter (cudagate_harness.library.ADAPTERS): its buffer
    roles mapped to buffers, its options as written (expressions, numbers, booleans, words)."""

    adapter: str
    args: dict[str, str] = field(default_factory=dict)  # role -> buffer
    options: dict = field(default_factory=dict)
    kind: str = "library"

    def resolve(self, scalars: dict) -> dict:
        """The worker's form: every option a plain value, the adapter's defaults filled in. Raises
        :class:`ExprError` naming the option whose expression fails."""
        adapter: StepAdapter = ADAPTERS[self.adapter]
        given = {}
        for name, value in self.options.items():
            what = adapter.options[name]
            try:
                if what == "int":
                    given[name] = evaluate(value, scalars)
                elif what == "number":
                    given[name] = float(parse(value).value(scalars))
                else:
                    given[name] = value
            except ExprError as exc:
                raise ExprError(f"{self.adapter} option {name}: {exc}") from None
        return {"library": self.adapter, "args": dict(self.args), "options": adapter.complete(given)}

    def to_json(self) -> dict:
        return {"library": self.adapter, "args": dict(self.args), "options": dict(self.options)}

    def names(self) -> frozenset[str]:
        kinds = ADAPTERS[self.adapter].options if self.adapter in ADAPTERS else {}
        return _names([v for k, v in self.options.items() if kinds.get(k) in ("int", "number")])

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(self.args.values())

    @property
    def writes(self) -> tuple[str, ...]:
        adapter = ADAPTERS.get(self.adapter)
        return tuple(name for role, name in self.args.items()
                     if isinstance(adapter, StepAdapter) and adapter.buffers.get(role))


def _names(texts) -> frozenset[str]:
    found: set[str] = set()
    for text in texts:
        try:
            found |= parse(text).names
        except ExprError:
            pass
    return frozenset(found)


def from_record(raw: dict) -> MemsetStep | CopyStep | LibraryStep:
    """A non-launch step as a ledger or an approval records it (its ``to_json``)."""
    if "memset" in raw:
        body = raw["memset"]
        return MemsetStep(str(body["buffer"]), body["value"], int(body["bits"]))
    if "copy" in raw:
        body = raw["copy"]
        return CopyStep(str(body["from"]), str(body["to"]), str(body["count"]))
    return LibraryStep(str(raw["library"]), {str(k): str(v) for k, v in raw["args"].items()}, dict(raw["options"]))
