"""The worker protocol's messages as typed dataclasses: a request, and each kind of line the worker
answers with. ``schemas/harness-request`` and ``schemas/harness-response`` are their formal contract;
tests/harness/test_messages.py keeps every class's fields and its schema object's properties the same.

A request is turned into a :class:`Request` once, by :func:`from_json`, after
:func:`~cudagate_harness.request_checks.request_problems` has accepted its dict, so these classes do not
check their values again. A reply is built as its dataclass and becomes a JSON object at the one place a
worker writes a line (:func:`to_json`). A field ending in ``_`` is its key without it (``from``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any, Union

from .stopping import Settle


class _Absent:
    """A reply field left out of its line (None is written: JSON null)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
DEFAULT_PAD_MAX = 3  # idle pad kernels launched at random before each timed launch


# -- the request ---------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Kernel:
    name: str = ""
    entry: str
    source: str
    source_name: str = "kernel.cu"
    source_path: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    options: tuple[str, ...] = ()
    arch_suffix: str = ""
    entries: tuple[str, ...] = ()  # a kernel of steps: every entry its steps launch
    compiler: str = "auto"


@dataclass(frozen=True, kw_only=True)
class Param:
    name: str
    kind: str
    dtype: str
    intent: str | None = None
    init: int | None = None  # a scratch buffer's initial element (its bits)


@dataclass(frozen=True, kw_only=True)
class BufferSpec:
    count: int
    input: str | None = None
    layout: tuple[int, ...] | None = None  # [rows, cols, ld] of a padded row-major buffer

    @property
    def padded_count(self) -> int:
        """The elements the buffer takes on the device: ``count``, or with a ``layout`` rows × ld,
        padding included."""
        return self.layout[0] * self.layout[2] if self.layout else self.count


@dataclass(frozen=True, kw_only=True)
class Launch:
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class LaunchStep:
    entry: str
    args: tuple[str, ...]
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class MemsetFill:
    buffer: str
    bits: int


@dataclass(frozen=True, kw_only=True)
class MemsetStep:
    memset: MemsetFill


@dataclass(frozen=True, kw_only=True)
class CopyRange:
    from_: str
    to: str
    count: int


@dataclass(frozen=True, kw_only=True)
class CopyStep:
    copy: CopyRange


@dataclass(frozen=True, kw_only=True)
class LibraryStep:
    library: str
    args: dict[str, str]  # role -> buffer
    options: dict


Step = Union[LaunchStep, MemsetStep, CopyStep, LibraryStep]
Operation = Union[Launch, tuple[Step, ...]]  # one launch of the whole signature, or a kernel's steps


@dataclass(frozen=True, kw_only=True)
class FreshSet:
    label: str = "fresh"
    inputs: dict[str, str] = field(default_factory=dict)  # an input it lacks fails that case alone
    timed: bool = False
    description: str | None = None
    expected: dict[str, str] | None = None
    atol_scale: dict[str, float] | None = None


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    scalars: dict
    buffers: dict[str, BufferSpec]
    launch: Operation
    expected: dict[str, str] = field(default_factory=dict)
    tolerance: dict | None = None
    shapes: dict | None = None
    sanitize: bool = False
    fresh: tuple[FreshSet, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Timing:
    warmup: int | None = None  # required where used (run with timing, compare)
    repeat: int | None = None
    cache: str = "cold"
    warmup_ms: float = 0.0
    batch: int = 1
    pad_max: int = DEFAULT_PAD_MAX
    seed: int = 0
    chunk: int = 100
    fresh_share: float = 0.0
    rotate: int | None = None
    settle: Settle | None = None

    @property
    def cold(self) -> bool:
        return self.cache == "cold"


@dataclass(frozen=True, kw_only=True)
class LibrarySpec:
    adapter: str
    rounds: int
    args: dict[str, str]  # role -> signature parameter
    settle: Settle | None = None


@dataclass(frozen=True, kw_only=True)
class Checks:
    """The worker-side defences a request may switch off; each on when absent."""

    guards: bool = True
    scrub_shared: bool = True
    timed_outputs: bool = True
    second_launch: bool = True  # off only for a trusted reference computing expected outputs


@dataclass(frozen=True, kw_only=True)
class Kernels:
    approved: Kernel
    current: Kernel


@dataclass(frozen=True, kw_only=True)
class Launches:
    approved: Operation
    current: Operation


@dataclass(frozen=True, kw_only=True)
class Request:
    op: str
    protocol: int | None = None
    id: int | str | None = None
    suite: str | None = None
    arch: str | None = None
    kernel: Kernel | None = None
    signature: tuple[Param, ...] | None = None
    cases: tuple[Case, ...] | None = None
    timing: Timing | None = None
    timeout_s: float | None = None
    output_dir: str | None = None
    base_dir: str = "."
    library: LibrarySpec | None = None
    checks: Checks = Checks()
    kernels: Kernels | None = None  # compare
    launches: Launches | None = None
    case: Case | None = None

    def __post_init__(self):
        # What the op needs (the schema's allOf): the worker reads these without asking.
        missing = [name for name in _NEEDS.get(self.op, ()) if getattr(self, name) is None]
        if missing:
            raise TypeError(f"a {self.op} request needs {', '.join(missing)}")


_NEEDS = {"run": ("kernel", "signature", "cases"), "compile": ("kernel",),
          "compare": ("kernels", "launches", "signature", "case", "timing")}


# -- the replies: optional fields are ABSENT (left out of the line) unless given ------------------

@dataclass(frozen=True, kw_only=True)
class Hello:
    type: str = "hello"
    protocol: int
    ok: bool
    pid: int = ABSENT
    device: dict = ABSENT
    identity: dict = ABSENT
    nvrtc_version: str = ABSENT
    cuda_bindings_version: str = ABSENT
    timing_hold: bool = ABSENT
    error: str = ABSENT


@dataclass(frozen=True, kw_only=True)
class CompileReply:
    type: str = "compile"
    id: int | str | None = None
    ok: bool
    arch: str = ABSENT
    key: str = ABSENT
    cache_hit: bool = ABSENT
    seconds: float = ABSENT
    log: str = ABSENT
    lowered_name: str | None = ABSENT
    resources: dict = ABSENT
    compiler: str = ABSENT
    role: str = ABSENT


@dataclass(frozen=True, kw_only=True)
class CaseError:
    kind: str
    code: str = ABSENT
    message: str
    phase: str = ABSENT


@dataclass(frozen=True, kw_only=True)
class CaseReply:
    type: str = "case"
    id: int | str | None = None
    status: str
    error: CaseError = ABSENT
    timing: dict = ABSENT
    library: dict = ABSENT
    outputs: dict = ABSENT
    inputs_modified: dict = ABSENT
    approved: dict = ABSENT  # compare: the approved kernel's outputs and findings
    fresh: list = ABSENT
    checks: dict = ABSENT
    step_seconds: dict = ABSENT
    guards: dict = ABSENT
    padding: dict = ABSENT
    input_writes: dict = ABSENT
    timed: dict = ABSENT
    case: str = ABSENT
    seconds: float = ABSENT
    notes: list = ABSENT


@dataclass(frozen=True, kw_only=True)
class Chunk:
    type: str = "chunk"
    id: int | str | None = None
    approved: list
    current: list
    first: list
    wall_s: float
    state: dict
    disturbances: list
    fresh: list = ABSENT
    prior: list = ABSENT
    probe: dict = ABSENT


@dataclass(frozen=True, kw_only=True)
class Done:
    type: str = "done"
    id: int | str | None = None


@dataclass(frozen=True, kw_only=True)
class ErrorReply:
    type: str = "error"
    id: int | str | None = None
    message: str


# -- dict <-> dataclass --------------------------------------------------------------------------

def from_json(cls, data):
    """``cls`` from a JSON object: each field from its key, following the field's type into nested
    classes, tuples (from lists), dicts of classes and unions of them (the first whose required keys
    are all there). An absent key, or null for a field with a default, gives the default, and an empty
    object for an optional class is None (``timing: {}`` is no timing, as a request always meant); a
    missing or null required key, a number or text of another type, or a value of the wrong shape is a
    TypeError (the worker's malformed request), raised before anything is compiled or launched."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected an object, not {type(data).__name__}")
    hints, given = _hints(cls), {}
    for f in fields(cls):
        key = f.name.rstrip("_")
        value = data.get(key)
        if value is None and _has_default(f):
            continue
        if value is None:
            raise TypeError(f"{cls.__name__}.{key}: {'null' if key in data else 'missing'}, and it has no default")
        try:
            given[f.name] = _value(hints[f.name], value)
        except TypeError as error:
            raise TypeError(f"{cls.__name__}.{key}: {error}") from None
    return cls(**given)


def to_json(message) -> dict:
    """A reply (or any message) as its JSON object, keys in the order of its fields, those left
    ABSENT out; nested messages and tuples converted, dicts and lists written as they are."""
    return {f.name.rstrip("_"): _json(value) for f in fields(message)
            if (value := getattr(message, f.name)) is not ABSENT}


def _json(value):
    if is_dataclass(value):
        return to_json(value)
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _has_default(f) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


# JSON's types for the plain field types; a bool is no number here.
_SCALARS = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
_WANTED = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}


def _value(hint, value):
    if value is None:
        return None
    if hint in _SCALARS:
        if not isinstance(value, _SCALARS[hint]) or (hint is not bool and isinstance(value, bool)):
            raise TypeError(f"{repr(value)[:40]} is not {_WANTED[hint]}")
        return value
    if is_dataclass(hint):
        return from_json(hint, value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, not {type(value).__name__}")
        return tuple(_value(args[0], v) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected an object, not {type(value).__name__}")
        return {k: _value(args[1], v) for k, v in value.items()}
    if origin in (Union, types.UnionType):
        options = [option for option in args if option is not type(None)]
        if value == {} and len(options) == 1 and is_dataclass(options[0]):
            return None
        for option in options:
            if len(options) == 1 or _fits(option, value):
                return _value(option, value)
        raise TypeError(f"{str(value)[:80]!r} is none of {', '.join(map(_name, options))}")
    return value


def _name(hint) -> str:
    return hint.__name__ if is_dataclass(hint) else str(hint)


def _fits(hint, value) -> bool:
    if is_dataclass(hint):
        return isinstance(value, Mapping) and all(f.name.rstrip("_") in value for f in fields(hint)
                                                  if not _has_default(f))
    origin = typing.get_origin(hint)
    if origin is tuple:
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, Mapping)
    return True
