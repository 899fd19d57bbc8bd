"""Run compiled kernels on one case: allocate, poison, launch, validate, time, capture.

The order is fixed and reviewable:

1. validation launch 1 on the signed inputs: outputs poisoned with one pattern, and every SM's
   shared memory scrubbed with it just before the launch;
2. warm-ups (a random number beyond the minimum, so a kernel counting its calls cannot tell the
   last warm-up from the first timed launch) and timed launches, rotating through copies of the
   buffers; every warm-up and timed launch finds its outputs poisoned, every timed launch's outputs
   are digested on the GPU right after its event pair and the digests compared with launch 1's
   (:mod:`.digest`), and after each timing batch what the last launch on each copy wrote is
   compared with launch 1 element by element (the array the judge sees);
3. validation launch 2 (the other pattern), compared bit for bit with launch 1;
4. one launch per fresh input set, uploaded into the same buffers: a kernel that caches results by
   pointer or by call count hands back stale values here.

Every device copy of every buffer sits between guard zones of canary bytes, checked after each
phase, and inputs are compared with their host data after each phase, so a write past a buffer or
into an input is reported with the phase it happened in. Both validation launches' outputs go back
to the client, so a kernel that is only right the first time, or only right because memory still
held an earlier result, fails.

Timing follows what the H200 taught us (shared/brief/h200-timing-notes.md): each timed launch
sits alone between its own event pair, after an L2 flush (cold) and after a random 0-3 empty
launches, because small kernels' cold timings alternate by 3-5% with their position in the queue;
for two kernels the order within every round is random too, so an A/A comparison is exchangeable.
Where the driver can, each timed launch is held (the stream waits for the host until its event pair
and launch are enqueued), so no launch's time includes the host's enqueueing.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .digest import Digester, buffer_key
from .driver import CudaError, Device, check
from .library import LibraryCallError, LibraryLaunch
from .stopping import Settle, next_rounds
from .messages import (ABSENT, DEFAULT_PAD_MAX, Case, CaseError, CaseReply, Checks, FreshSet, Launch, LaunchStep, Param, Step,
                       Timing)
from .protocol import (CANARY, GUARD_BYTES, POISON_FIRST, POISON_SECOND, POISON_TIMED, all_bytes, element_words, numpy_dtype,
                       unwritten_mask)

MAX_EVENTS_IN_FLIGHT = 256  # stays well under the ~1,100-command stream queue limit
# Launches enqueued behind one hold: the driver's queue takes about a thousand before cuLaunchKernel
# blocks the host, which, with the stream waiting for that host, never returns (an H200 blocked at
# 1024 held launches of a 4-parameter kernel; benchmarks/hold_queue.py). A longer hot batch is timed
# in groups of this many, each held alone between its own event pair, its time their sum; a
# library call may enqueue a few kernels, still far inside the queue.
HELD_LAUNCHES = 64
ROTATION_BYTES = 256 << 20  # rotate through at most this much memory per case
MAX_COPIES = 4
SIGNED = ""  # the input set of the case's signed data (CaseRun.use_inputs); fresh sets go by their labels


def launch_groups(batch: int, held: bool, copies: int = 1) -> list[int]:
    """The launches of one timed launch of ``batch`` between each of its event pairs: all in one
    pair, or held, :data:`HELD_LAUNCHES` at most per pair; and never more than ``copies``, as each
    launch of a pair gets a buffer copy of its own (:meth:`CaseRun._timed_launch`)."""
    if batch <= 1:
        return [1]
    most = max(1, min(HELD_LAUNCHES if held else batch, copies))
    return [min(most, batch - first) for first in range(0, batch, most)]


def rotation_copies(signature: tuple[Param, ...], case: Case, requested: int | None, batch: int = 1) -> int:
    """How many buffer copies timed launches rotate through: ``requested``, or as many as fit; with
    ``batch`` > 1, enough for each launch of an event pair to have its own, as far as they fit."""
    sizes = {p.name: numpy_dtype(p.dtype).itemsize for p in signature if p.kind == "buffer"}
    nbytes = sum(sizes[name] * spec.padded_count for name, spec in case.buffers.items() if name in sizes)
    fit = max(1, ROTATION_BYTES // max(nbytes, 1))
    copies = int(requested) if requested else min(MAX_COPIES, fit)
    return max(1, copies, min(HELD_LAUNCHES, batch, fit) if batch > 1 else 1)


class CaseInputError(ValueError):
    """Case data that does not match the signature (wrong dtype, count or missing file)."""


class LaunchRefused(CudaError):
    """A launch configuration this device cannot run, found before launching; says which limit."""

    def __init__(self, detail: str):
        super().__init__("LAUNCH_CONFIGURATION_REFUSED", "launch configuration", detail)


_LIMITS = ("MAX_THREADS_PER_BLOCK", "MAX_BLOCK_DIM_X", "MAX_BLOCK_DIM_Y", "MAX_BLOCK_DIM_Z",
           "MAX_GRID_DIM_X", "MAX_GRID_DIM_Y", "MAX_GRID_DIM_Z", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")


def device_limits(device) -> dict[str, int]:
    """The launch limits of ``device`` (read once per device object)."""
    limits = getattr(device, "_cudagate_limits", None)
    if limits is None:
        limits = {name: int(device.attribute(name)) for name in _LIMITS}
        device._cudagate_limits = limits
    return limits


def function_attribute(device, function, name: str) -> int:
    getter = getattr(device, "function_attribute", None)
    if getter is not None:
        return int(getter(function, name))
    from cuda.bindings import driver as cu

    attr = getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    return int(check(cu.cuFuncGetAttribute(attr, function), f"cuFuncGetAttribute({name})"))


def check_launch(device, kernel: Launchable) -> None:
    """Refuse, naming the limit it breaks, a launch configuration this device cannot run.

    The driver's own answer (CUDA_ERROR_INVALID_VALUE, or "too many resources requested") does not
    say which dimension or resource is at fault; this does, before anything is launched.
    """
    try:
        limits = device_limits(device)
        static = function_attribute(device, kernel.function, "SHARED_SIZE_BYTES")
        fits = function_attribute(device, kernel.function, "MAX_THREADS_PER_BLOCK")
        registers = function_attribute(device, kernel.function, "NUM_REGS")
    except CudaError as exc:
        if exc.sticky:
            raise
        return  # no limits to check against: the launch itself reports what is wrong
    except Exception:  # noqa: BLE001 - a device object without these queries (tests, old bindings)
        return
    block, grid = tuple(kernel.block), tuple(kernel.grid)
    threads = block[0] * block[1] * block[2]
    if threads > limits["MAX_THREADS_PER_BLOCK"]:
        raise LaunchRefused(f"block {list(block)} has {threads} threads; this device allows at most "
                            f"{limits['MAX_THREADS_PER_BLOCK']} per block")
    for axis, size in zip("xyz", block):
        limit = limits[f"MAX_BLOCK_DIM_{axis.upper()}"]
        if size > limit:
            raise LaunchRefused(f"block {list(block)} is {size} threads along {axis}; this device allows at most {limit}")
    if threads > fits:
        raise LaunchRefused(f"block {list(block)} has {threads} threads, but the kernel uses {registers} registers per "
                            f"thread, so at most {fits} of its threads fit in one block")
    for axis, size in zip("xyz", grid):
        limit = limits[f"MAX_GRID_DIM_{axis.upper()}"]
        if size > limit:
            raise LaunchRefused(f"grid {list(grid)} is {size} blocks along {axis}; this device allows at most {limit}")
    most = limits["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"]
    if static + kernel.shared > most:
        raise LaunchRefused(f"the launch asks for {kernel.shared} bytes of dynamic shared memory per block (plus {static} "
                            f"bytes static); this device has at most {most} bytes per block")


def synchronize_all(device) -> None:
    """Wait for all work on the device: host copies go through the legacy stream, kernels through ours."""
    own = getattr(device, "synchronize_all", None)
    if own is not None:
        own()
        return
    from cuda.bindings import driver as cu

    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


@dataclass
class Buffer:
    name: str
    dtype: np.dtype
    intent: str
    count: int
    host: np.ndarray | None  # the input (in/inout); None for pure outputs
    ptrs: list[int] = field(default_factory=list)  # one device copy per rotation slot
    bases: list[int] = field(default_factory=list)  # their allocations: guard zone, buffer, guard zone
    pristine: int = 0  # device copy of an inout buffer's input, restored before every launch
    # [rows, cols, ld] of a padded buffer: row i's cols elements start at i * ld, and the ld - cols after
    # them are padding, filled with CANARY bytes that must stay untouched. ``count`` is then rows × ld,
    # ``host`` holds the padded layout, and what goes back to the client is the logical rows × cols.
    layout: tuple[int, int, int] | None = None

    def logical(self, array: np.ndarray) -> np.ndarray:
        """The logical elements of ``array`` (the buffer's device layout), row after row."""
        if self.layout is None:
            return array
        rows, cols, ld = self.layout
        return np.ascontiguousarray(array.reshape(rows, ld)[:, :cols]).reshape(-1)

    def padded(self, array: np.ndarray) -> np.ndarray:
        """``array`` (logical) in the buffer's device layout, its padding holding CANARY bytes."""
        if self.layout is None or array.size == self.count:
            return array
        rows, cols, ld = self.layout
        out = np.full(self.count * self.dtype.itemsize, CANARY, np.uint8).view(self.dtype)
        out.reshape(rows, ld)[:, :cols] = array.reshape(rows, cols)
        return out

    def padding_changes(self, array: np.ndarray) -> np.ndarray:
        """(row, column) of each padding element of ``array`` (the device layout) that is not CANARY bytes."""
        rows, cols, ld = self.layout
        words = element_words(array).reshape(rows, ld)[:, cols:]
        found = np.argwhere(words != words.dtype.type(int.from_bytes(bytes([CANARY]) * self.dtype.itemsize, "little")))
        found[:, 1] += cols
        return found
    init: int | None = None  # a scratch buffer's initial element (its bits), set before every launch

    @property
    def written(self) -> bool:
        """An output or inout: what the kernel writes, compared and digested."""
        return self.intent in ("out", "inout")

    @property
    def poisoned(self) -> bool:
        """Filled with a poison pattern before every launch: outputs, and scratch, which is never
        compared (so a step that reads scratch its previous step never wrote reads garbage), unless
        the signature gives the scratch an initial value."""
        return self.intent == "out" or (self.intent == "scratch" and self.init is None)

    @property
    def ptr(self) -> int:
        return self.ptrs[0]

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


@dataclass
class Launchable:
    """A loaded kernel with the launch configuration it uses on this case: one launch of the whole
    signature, or the first step of a kernel of steps, whose later steps follow in ``later``. A
    kernel is launched, timed (one event pair around all its steps) and checked as one unit."""

    function: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    args: tuple[str, ...] | None = None  # the signature parameters it takes, in order; None: all
    later: tuple[Launchable, ...] = ()

    @classmethod
    def of(cls, function, launch: Launch | LaunchStep) -> Launchable:
        return cls(function, tuple(int(v) for v in launch.grid), tuple(int(v) for v in launch.block),
                   int(launch.shared_bytes))

    @classmethod
    def operation(cls, functions: dict[str, object], launch: Launch | tuple[Step, ...],
                  other: Callable[[object], object] | None = None) -> Launchable | Operation:
        """A case's launch (:data:`~cudagate_harness.protocol` form): one launch of the kernel's entry
        (``functions`` holds one), or its steps, each of the function of its entry; ``other`` makes
        a step that is no launch (a memset, copy or library call: :func:`cudagate_harness.steps.build`)."""
        if isinstance(launch, Launch):
            (function,) = functions.values()
            return cls.of(function, launch)
        steps = [replace(cls.of(functions[step.entry], step), args=tuple(step.args)) if isinstance(step, LaunchStep)
                 else other(step) for step in launch]
        if not all(isinstance(step, Launchable) for step in steps):
            return Operation(tuple(steps))
        return replace(steps[0], later=tuple(steps[1:]))

    @property
    def launches(self) -> tuple[Launchable, ...]:
        """Its launches in order: itself, then its later steps."""
        return (self, *self.later)

    @property
    def sequence(self) -> tuple[Launchable, ...]:
        """What it enqueues, in order: here its launches (see :class:`Operation`)."""
        return self.launches


@dataclass
class Operation:
    """A kernel's steps where some are no launch but a memset, a copy or a library call
    (:mod:`.steps`): enqueued in order on the stream, like a kernel of launches."""

    sequence: tuple  # Launchable, or a step with enqueue(device, buffers, slot)

    @property
    def launches(self) -> tuple[Launchable, ...]:
        """Its kernel launches (each checked against the device's limits before anything runs)."""
        return tuple(step for step in self.sequence if isinstance(step, Launchable))


def pack_arguments(signature: tuple[Param, ...], buffers: dict[str, Buffer], scalars: dict, slot: int = 0,
                   args: tuple[str, ...] | None = None) -> tuple[np.ndarray, list]:
    """The ``kernelParams`` array: one pointer per parameter (``args``, in their order; default the
    whole signature), each to that parameter's bytes.

    Returns the array and the storage it points into, which must stay alive until the launch.
    """
    storage: list[np.ndarray] = []
    if args is not None:
        named = {param.name: param for param in signature}
        signature = [named[name] for name in args]
    for param in signature:
        if param.kind == "buffer":
            storage.append(np.array([buffers[param.name].ptrs[slot]], dtype=np.uint64))
        else:
            storage.append(np.array([scalars[param.name]], dtype=numpy_dtype(param.dtype)))
    return np.array([item.ctypes.data for item in storage], dtype=np.uint64), storage


def read_input(case: Case, param: Param, path: Path, count: int) -> np.ndarray:
    """An input's data file, checked against the signature's dtype and the case's element count."""
    dtype = numpy_dtype(param.dtype)
    try:
        host = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:  # EOFError: an empty file
        raise CaseInputError(f"case {case.name!r}: cannot read {path}: {exc}") from None
    if host.dtype != dtype:
        raise CaseInputError(f"case {case.name!r}: {path} holds {host.dtype}, signature says {param.dtype}")
    if host.size != count:
        raise CaseInputError(f"case {case.name!r}: {path} holds {host.size} elements, the size expression gives {count}")
    return np.ascontiguousarray(host.reshape(-1))


def load_buffers(signature: tuple[Param, ...], case: Case, base: Path) -> dict[str, Buffer]:
    buffers = {}
    for param in signature:
        if param.kind != "buffer":
            continue
        name = param.name
        spec = case.buffers.get(name)
        if spec is None:
            raise CaseInputError(f"case {case.name!r} gives no size for buffer {name!r}")
        dtype = numpy_dtype(param.dtype)
        layout = spec.layout
        layout = tuple(int(v) for v in layout) if layout and layout[2] > layout[1] else None  # ld = cols: no padding
        buf = Buffer(name, dtype, param.intent, spec.padded_count if layout else int(spec.count), None,
                     layout=layout, init=param.init)
        if param.intent in ("in", "inout"):
            if not spec.input:
                raise CaseInputError(f"case {case.name!r}: input buffer {name!r} has no data file")
            buf.host = buf.padded(read_input(case, param, base / spec.input, int(spec.count)))
        buffers[name] = buf
    return buffers


def load_fresh_inputs(signature: tuple[Param, ...], case: Case, spec: FreshSet, base: Path) -> dict[str, np.ndarray]:
    """The input arrays of one fresh input set (one of ``case.fresh``), by buffer name."""
    arrays = {}
    for param in signature:
        if param.kind != "buffer" or param.intent not in ("in", "inout"):
            continue
        name = param.name
        path = spec.inputs.get(name)
        if not path:
            raise CaseInputError(f"case {case.name!r}: fresh input set {spec.label!r} has no data for {name!r}")
        arrays[name] = read_input(case, param, base / path, int(case.buffers[name].count))
    return arrays


def _step(name: str):
    """Count a CaseRun method's wall time under ``name`` (see :meth:`CaseRun.clock`)."""
    def wrap(method):
        @functools.wraps(method)
        def inner(self, *args, **kwargs):
            with self.clock(name):
                return method(self, *args, **kwargs)
        return inner
    return wrap


class CaseRun:
    """One case's buffers on one device, shared by every kernel launched on it.

    Timed launches rotate through ``copies`` copies of the buffers at different addresses: a cold
    small kernel's time depends on where its data sits (L2 slices, memory channels), so one fixed
    placement would bias a run's median in a way the next process, with other addresses, does not
    share. Use as a context manager: buffers are allocated on entry and always freed on exit.

    What the checks found accumulates here, attributed to a kernel by its index in the launch list
    (``None`` when several kernels ran in the phase), and :meth:`findings` hands it to the answer.
    """

    def __init__(self, device: Device, signature: tuple[Param, ...], case: Case, base: Path,
                 flush: Callable[[], None] | None = None, pad: Launchable | None = None, seed: int = 0,
                 copies: int = 1, *, guard: int = GUARD_BYTES, scrub: Callable[[int], None] | None = None,
                 timed_outputs: bool = True, hold: bool = False, digester: Digester | None = None):
        self.device = device
        self.hold = hold  # timed launches are held (see _timed_launch)
        self.signature = signature
        self.case = case
        self.buffers = load_buffers(signature, case, base)
        self.flush = flush
        self.pad = pad
        self.rng = np.random.default_rng(seed)
        self.copies = max(1, copies)
        # (copy, a launch's args) -> its kernelParams and the storage they point into, kept alive with the run
        self.params: dict[tuple[int, tuple[str, ...] | None], tuple[np.ndarray, list]] = {}
        self._slot = 0
        self.guard = max(0, int(guard))
        self.scrub = scrub
        self.timed_outputs = timed_outputs
        self.digester = digester if timed_outputs else None
        # Drawn per case run, never seeded: a kernel cannot aim wrong outputs at a digest collision.
        key = int.from_bytes(os.urandom(8), "little")
        # The buffers a launch writes (outputs and inouts), each with its key: worked out once, as the
        # digest runs after every timed launch.
        self._digested = [(buf, buffer_key(key, i)) for i, buf in enumerate(b for b in self.buffers.values() if b.written)]
        # The digest is computed into one device word and copied at once, in the stream, into pinned
        # host memory: a later launch of the kernel cannot rewrite an earlier launch's digest there.
        self._digest_word = 0
        self._digests_host: np.ndarray | None = None
        self.expected: dict[int, tuple[int, int]] = {}  # id(kernel) -> (its index, launch 1's digest)
        self.digests: dict[int, dict] = {}  # kernel index -> {"launches", "differing", "first"}
        self.jitter = np.random.default_rng()  # warm-up counts no kernel can predict (never seeded)
        self.guard_hits: dict[tuple[str, str], dict] = {}
        self.padding_hits: dict[str, dict] = {}  # per padded buffer: the first padding element written
        self.input_writes: dict[str, dict] = {}
        self.timed: dict[int, dict] = {}
        self.last_writer: dict[int, int] = {}  # rotation slot -> index of the kernel that wrote it last
        self.seconds: dict[str, float] = {}  # wall time per kind of step, for the cost of each defence
        # Input sets kept on the device (label -> input name -> its device copy and host data), and
        # the one every copy of the inputs holds now; the digests timed launches must match, per set.
        self.inputs = SIGNED
        self._sets: dict[str, dict[str, tuple[int, np.ndarray]]] = {}
        self._expected_sets: dict[str, dict[int, tuple[int, int]]] = {SIGNED: self.expected}

    @contextmanager
    def phase(self, name: str):
        """Attribute a CUDA error raised inside to ``name`` (kept by :func:`error_reply`)."""
        try:
            yield
        except CudaError as exc:
            if getattr(exc, "phase", None) is None:
                exc.phase = name
            raise

    @contextmanager
    def clock(self, step: str):
        """Add the wall time spent inside to ``self.seconds[step]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - start

    def __enter__(self) -> CaseRun:
        dev = self.device
        try:
            for buf in self.buffers.values():
                if buf.intent == "inout":
                    buf.pristine = dev.alloc(buf.nbytes)
                    dev.upload(buf.pristine, buf.host)
                for _ in range(self.copies):
                    base = dev.alloc(buf.nbytes + 2 * self.guard)
                    buf.bases.append(base)
                    buf.ptrs.append(base + self.guard)
                    if self.guard:
                        dev.fill(base, CANARY, self.guard)
                        dev.fill(base + self.guard + buf.nbytes, CANARY, self.guard)
                    if buf.layout is not None:  # the padding's pattern; the poison then fills the rows only
                        dev.fill(buf.ptrs[-1], CANARY, buf.nbytes)
                    if buf.intent == "in":
                        dev.upload(buf.ptrs[-1], buf.host)
            if self.digester is not None:
                self._digest_word = dev.alloc(8)
            synchronize_all(dev)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _params(self, slot: int, args: tuple[str, ...] | None) -> np.ndarray:
        """The packed arguments of a launch taking ``args`` on copy ``slot``, packed once."""
        packed = self.params.get((slot, args))
        if packed is None:
            packed = self.params[(slot, args)] = pack_arguments(self.signature, self.buffers, self.case.scalars,
                                                                slot, args)
        return packed[0]

    def __exit__(self, *exc) -> None:
        for buf in self.buffers.values():
            for ptr in [*buf.bases, buf.pristine]:
                if ptr:
                    self.device.free(ptr)
            buf.ptrs, buf.bases, buf.pristine = [], [], 0
        for stored in self._sets.values():
            for ptr, _ in stored.values():
                self.device.free(ptr)
        self._sets = {}
        if self._digest_word:
            self.device.free(self._digest_word)
            self._digest_word = 0
            self.digester.forget()  # a later allocation may reuse these addresses
        if self._digests_host is not None:
            self.device.free_pinned(self._digests_host)
            self._digests_host = None

    def add_inputs(self, label: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep input set ``label`` (``arrays``: a fresh set's inputs by name) on the device beside
        the signed one, for timed rounds on it (:meth:`use_inputs`)."""
        if not self._sets:
            self._sets[SIGNED] = self._store({name: buf.host for name, buf in self.buffers.items() if buf.host is not None})
        self._sets[label] = self._store(arrays)

    def _store(self, arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, np.ndarray]]:
        stored = {}
        try:
            for name, array in arrays.items():
                array = self.buffers[name].padded(array)
                ptr = self.device.alloc(self.buffers[name].nbytes)
                stored[name] = (ptr, array)
                self.device.upload(ptr, array)
        except BaseException:
            for ptr, _ in stored.values():
                self.device.free(ptr)
            raise
        return stored

    def use_inputs(self, label: str) -> None:
        """Put input set ``label`` (:data:`SIGNED`, or one of :meth:`add_inputs`) into every copy of
        every input (an inout buffer's pristine copy, restored before each launch), and the digests
        recorded on that set (:meth:`expect`) in force. What a kernel wrote into the inputs of the
        set it leaves is overwritten: check them first (:meth:`check_inputs`)."""
        if label == self.inputs:
            return
        dev = self.device
        for name, (ptr, _) in self._sets[label].items():
            buf = self.buffers[name]
            for target in [buf.pristine] if buf.intent == "inout" else buf.ptrs:
                dev.copy(target, ptr, buf.nbytes)
        synchronize_all(dev)
        self.inputs = label
        self.expected = self._expected_sets.setdefault(label, {})

    def _host(self, buf: Buffer) -> np.ndarray:
        """The data every copy of input ``buf`` holds now: the active input set's."""
        return self._sets[self.inputs][buf.name][1] if self._sets else buf.host

    def _digest(self, slot: int) -> None:
        """Enqueue the digest of what copy ``slot``'s written buffers hold into the digest word."""
        self.device.fill(self._digest_word, 0, 8)
        for buf, key in self._digested:
            self.digester.add(buf.ptrs[slot], buf.nbytes, key, self._digest_word)

    def _digests_for(self, words: int) -> np.ndarray:
        """Pinned host words for ``words`` digests of one timing batch."""
        if self._digests_host is None or self._digests_host.size < words:
            if self._digests_host is not None:
                self.device.free_pinned(self._digests_host)
                self._digests_host = None
            self._digests_host = self.device.pinned(words)
        return self._digests_host

    def expect(self, kernel: Launchable, index: int) -> None:
        """Take what validation launch 1 of kernel ``index`` left on the first copy as the digest
        every timed launch of ``kernel`` must match. Call right after that launch."""
        if self.digester is None:
            return
        self._digest(0)
        self.device.synchronize()
        value = self.device.download(self._digest_word, np.zeros(1, np.uint64))
        self.device.fill(self._digest_word, 0, 8)  # not left where a kernel could copy it from
        self.expected[id(kernel)] = (index, int(value[0]))
        self.digests.setdefault(index, {"launches": 0, "differing": 0})

    def _compare_digests(self, launched: list[tuple[int, int]], got: np.ndarray | None) -> None:
        """Every timed launch's digest (``launched``: its kernel's index and expected digest, in the
        order of ``got``) against validation launch 1's. After the batch's synchronisation."""
        if not launched:
            return
        for (index, expected), value in zip(launched, got[:len(launched)].tolist()):
            record = self.digests[index]
            record["launches"] += 1
            if value != expected:
                record["differing"] += 1
                record.setdefault("first", record["launches"])

    def prepare(self, kernel: Launchable) -> None:
        for step in kernel.launches:
            check_launch(self.device, step)
            if step.shared > 48 * 1024:  # above 48 KiB a kernel must opt in to dynamic shared memory
                self.device.allow_dynamic_shared(step.function, step.shared)

    def _poison(self, slot: int, byte: int) -> None:
        for buf in self.buffers.values():
            if not buf.poisoned:
                continue
            if buf.layout is None:
                self.device.fill(buf.ptrs[slot], byte, buf.nbytes)
            else:  # the rows only: the padding keeps its pattern
                rows, cols, ld = buf.layout
                size = buf.dtype.itemsize
                self.device.fill2d(buf.ptrs[slot], ld * size, byte, cols * size, rows)

    def _restore(self, slot: int = 0) -> None:
        """Before every launch of the kernel: an inout buffer's input back in place, and a scratch
        buffer with an initial value set to it (the harness's reset, outside any event pair)."""
        for buf in self.buffers.values():
            if buf.intent == "inout":
                self.device.copy(buf.ptrs[slot], buf.pristine, buf.nbytes)
            elif buf.init is not None:
                self.device.set_elements(buf.ptrs[slot], buf.init, buf.dtype.itemsize, buf.count)

    def _launch(self, kernel: Launchable | LibraryLaunch, slot: int = 0) -> None:
        if isinstance(kernel, LibraryLaunch):  # enqueued on the same stream, on the same copy of the buffers
            kernel.enqueue({name: buf.ptrs[slot] for name, buf in self.buffers.items()}, self.case.scalars)
            return
        for step in kernel.sequence:
            if isinstance(step, Launchable):
                self.device.launch(step.function, step.grid, step.block, step.shared, self._params(slot, step.args))
            else:
                step.enqueue(self.device, self.buffers, slot)

    @_step("validation")
    def validation_launch(self, kernel: Launchable, poison: int | None) -> dict[str, np.ndarray]:
        """One launch on the first copy; every buffer comes back.

        Outputs are filled with ``poison`` and every SM's shared memory is scrubbed with it first;
        ``None`` leaves memory as allocated (the sanitizer run: initcheck then sees unwritten outputs).
        """
        return self._validation_launch(kernel, poison)

    def _validation_launch(self, kernel: Launchable, poison: int | None) -> dict[str, np.ndarray]:
        dev = self.device
        self._restore()
        if poison is not None:
            self._poison(0, poison)
            if self.scrub is not None:
                with self.clock("scrub"):
                    self.scrub(poison)
        self._launch(kernel)
        dev.synchronize()
        return {name: buf.logical(dev.download(buf.ptr, np.empty(buf.count, buf.dtype)))
                for name, buf in self.buffers.items() if buf.intent != "scratch"}

    @_step("warm_up")
    def warm_up(self, kernels: list[Launchable], count: int, min_ms: float = 0.0) -> None:
        """``count`` launches of each kernel plus a random number more (up to ``count`` again),
        then more until ``min_ms`` of wall time has passed. Each finds its outputs poisoned, as a
        timed launch does.

        The time floor matters for µs kernels: ten launches are over before an idle GPU's clocks
        have ramped up, and run-to-run medians then differ by several percent. The random extra
        count means a kernel that counts its calls cannot know where the timed launches begin.
        """
        count += int(self.jitter.integers(0, count + 1))
        start = time.perf_counter()
        launched = 0
        while launched < count or (time.perf_counter() - start) * 1000 < min_ms:
            for _ in range(max(count, 1) if launched < count else 64):
                slot = launched % self.copies
                for index, kernel in enumerate(kernels):
                    self._restore(slot)
                    if self.timed_outputs:
                        self._poison(slot, POISON_TIMED)
                    self._launch(kernel, slot)
                    self.last_writer[slot] = index
                launched += 1
            self.device.synchronize()

    @_step("probe")
    def burst(self, kernel: Launchable, index: int, count: int) -> None:
        """Enqueue ``count`` launches of kernel ``index`` alone, back to back, each finding its inputs
        restored and outputs poisoned as a warm-up does; not waited for (the caller reads the card's
        state while they run, then synchronizes)."""
        for number in range(count):
            slot = number % self.copies
            self._restore(slot)
            if self.timed_outputs:
                self._poison(slot, POISON_TIMED)
            self._launch(kernel, slot)
            self.last_writer[slot] = index

    def _timed_launch(self, kernel: Launchable, slot: int, pairs: list, groups: list[int], *, cold: bool,
                      pad_max: int) -> list[int]:
        """One timed launch: restore, poison, flush, pad, then ``groups`` (:func:`launch_groups`) of
        launches, each between its event pair of ``pairs`` (the launch's time is their sum). Held
        (:attr:`hold`), the stream waits for the host until each pair and its launches are enqueued.
        Returns the buffer copies written, one per launch, in launch order.

        Each launch of a pair has a copy of its own, from ``slot`` on, restored and poisoned before
        the pair: a launch that found the previous launch's outputs could check they are there and
        return at once, timed as a fraction of the work with right outputs.

        Unheld, a GPU that has drained its queue records the start event at once and then idles
        until the host's next call enqueues the kernel: a µs kernel then reads several µs slower in
        some launches and not in others (seen on the H200 as two modes, 5 and 15 µs, for a 5 µs
        softmax), and by how much depends on the host, not the kernel."""
        dev = self.device
        written: list[int] = []
        for number, ((start, end), size) in enumerate(zip(pairs, groups, strict=True)):
            slots = [(slot + j) % self.copies for j in range(size)]
            for copy in slots:
                self._restore(copy)
                if self.timed_outputs:
                    self._poison(copy, POISON_TIMED)  # before the flush: the cold cache state is unchanged
            if number == 0:
                if cold and self.flush:
                    self.flush()
                for _ in range(int(self.rng.integers(0, pad_max + 1)) if self.pad else 0):
                    self._launch(self.pad)
            if self.hold:
                dev.hold()
            try:
                dev.record(start)
                for copy in slots:
                    self._launch(kernel, copy)
                dev.record(end)
            finally:
                if self.hold:
                    dev.release()  # even after a failed enqueue: a stream left waiting would hang the worker
            written += slots
        return written

    @_step("timing")
    def time_rounds(self, kernels: list[Launchable], rounds: int, *, cold: bool, pad_max: int = DEFAULT_PAD_MAX,
                    batch: int = 1) -> tuple[list[list[float]], list[int]]:
        """Time ``rounds`` rounds; each round times every kernel once, in random order.

        Returns one sample list per kernel (ms per launch) and, per round, the index of the kernel
        that went first. ``batch`` > 1 (hot cache only) puts that many launches in one event pair
        for kernels too short for one pair to resolve (in groups, held: :meth:`_timed_launch`).
        """
        if cold and batch > 1:
            raise ValueError("batching launches in one event pair needs hot-cache timing: a flush cannot sit between them")
        dev = self.device
        samples: list[list[float]] = [[] for _ in kernels]
        firsts: list[int] = []
        per_round = len(kernels)
        groups = launch_groups(batch, self.hold, self.copies)
        per_launch = len(groups)
        rounds_per_batch = max(1, MAX_EVENTS_IN_FLIGHT // (per_round * per_launch))
        pairs = [(dev.event(), dev.event()) for _ in range(min(rounds, rounds_per_batch) * per_round * per_launch)]
        try:
            remaining = rounds
            while remaining:
                todo = min(remaining, rounds_per_batch)
                slots = []
                launched: list[tuple[int, int]] = []  # per digest: (kernel index, expected digest)
                host = self._digests_for(todo * per_round * batch) if self.expected else None
                done = rounds - remaining
                # The stream is checked after every batch, so a fault is reported with its rounds.
                with self.phase(f"the timed launches (rounds {done + 1}-{done + todo})"):
                    for _ in range(todo):
                        order = self.rng.permutation(per_round) if per_round > 1 else [0]
                        firsts.append(int(order[0]))
                        slot = self._slot % self.copies  # both kernels of a round use the same copy
                        self._slot += 1
                        for index in order:
                            mine = pairs[len(slots) * per_launch:(len(slots) + 1) * per_launch]
                            written = self._timed_launch(kernels[index], slot, mine, groups, cold=cold,
                                                         pad_max=pad_max)
                            self.last_writer.update(dict.fromkeys(written, int(index)))
                            slots.append((int(index), mine))
                            expected = self.expected.get(id(kernels[index]))
                            for copy in written if expected is not None else ():  # after the event pairs
                                self._digest(copy)
                                dev.download_async(self._digest_word, host[len(launched):len(launched) + 1])
                                launched.append(expected)
                    dev.synchronize()
                self._compare_digests(launched, host)
                for index, mine in slots:
                    samples[index].append(sum(dev.elapsed_ms(start, end) for start, end in mine) / batch)
                remaining -= todo
        finally:
            for start, end in pairs:
                dev.destroy_event(start)
                dev.destroy_event(end)
        return samples, firsts

    def time_settled(self, kernels: list[Launchable], rounds: int, settle: Settle | None,
                     figure: Callable[[list[list[float]]], list[float]], **how) -> list[list[float]]:
        """At most ``rounds`` rounds as :meth:`time_rounds` times them (``how``: its keywords), in the
        blocks :func:`~cudagate_harness.stopping.next_rounds` asks for: with ``settle``, fewer once it
        holds for ``figure(samples)`` (a kernel's own latencies, or per-round ratios)."""
        samples: list[list[float]] = [[] for _ in kernels]
        while todo := next_rounds(settle, rounds, samples, figure):
            more, _ = self.time_rounds(kernels, todo, **how)
            for kept, new in zip(samples, more):
                kept.extend(new)
        return samples

    def time_library(self, kernel: Launchable, baseline: tuple[str, LibraryLaunch | str, int, Settle | None], timing: Timing,
                     output_dir: Path) -> dict:
        """The library baseline ``(adapter, library, rounds, settle)`` beside ``kernel`` (the current
        kernel, after its own timed launches were checked): one validation launch of the library, then
        the warm-up and ``rounds`` interleaved rounds of the two exactly as the gate times kernels (flush,
        pads, random order, same buffer copy per round): one measurement block, however many rounds
        the kernel's own decision took, or fewer once ``settle`` holds for the per-round ratios of a
        long kernel (:meth:`time_settled`). The kernel's verdict never sees these samples. Both are held
        (:meth:`Device.hold`), and without a hold the library is not timed: a library call spends
        microseconds on the host (ctypes, the library's dispatch) that a kernel launch does not, and
        unheld, µs kernels would read as that much faster than the library.

        ``library`` is a string when there is no baseline to run (why); every failure of the library
        is said in the entry's ``error``, never as the case's error, unless the context is lost.
        """
        adapter, library, rounds, settle = baseline
        entry: dict = {"adapter": adapter}
        if not self.hold:
            entry["error"] = ("not timed: a library baseline needs held launches, and this driver cannot hold a "
                              "stream (no stream memory operations)")
            return entry
        problem = library if isinstance(library, str) else library.problem(self.buffers, self.case.scalars)
        if problem:
            entry["error"] = problem
            return entry
        cold = timing.cold
        try:
            with self.phase("the library baseline's validation launch"):
                first = self._validation_launch(library, POISON_FIRST)
            with self.phase("the library baseline's warm-up launches"):
                # No time floor: the kernel's timed launches just ran, so the clocks have ramped.
                self.warm_up([kernel, library], int(timing.warmup))
            samples = self.time_settled([kernel, library], rounds, settle, ratios, cold=cold,
                                        pad_max=int(timing.pad_max), batch=int(timing.batch))
        except (LibraryCallError, CudaError) as exc:
            if isinstance(exc, CudaError) and exc.sticky:
                raise
            entry["error"] = str(exc)
            return entry
        finally:
            self.last_writer.clear()  # the kernels' copies were checked before; these are the library's rounds
        # The kernel ran in these rounds too, so what the guard zones and inputs show is the kernel's
        # finding as much as the library's (who=None): its verdict sees it, and the column does not
        # blame the library for it.
        self.check_guards("the library baseline's launches", who=None)
        self.check_inputs("the library baseline's launches", who=None)
        entry.update({"current_ms": samples[0], "library_ms": samples[1],
                      **self.outputs(first, first, output_dir, prefix="library.")})
        return entry

    @_step("timed_output_check")
    def timed_check_launch(self, index: int, kernel: Launchable, *, cold: bool, pad_max: int = DEFAULT_PAD_MAX,
                           batch: int = 1) -> None:
        """If no copy was last written by kernel ``index`` (two kernels share the copies), one more
        launch of it exactly like a timed one, its time discarded, so its timed output gets checked."""
        if not self.timed_outputs or index in self.last_writer.values():
            return
        dev = self.device
        slot = int(self.jitter.integers(0, self.copies))
        groups = launch_groups(batch, self.hold, self.copies)
        pairs = [(dev.event(), dev.event()) for _ in groups]
        try:
            with self.phase("the timed launches (a checked launch)"):
                self._timed_launch(kernel, slot, pairs, groups, cold=cold, pad_max=pad_max)
                dev.synchronize()
        finally:
            for start, end in pairs:
                dev.destroy_event(start)
                dev.destroy_event(end)
        self.last_writer[slot] = index

    @_step("timed_output_check")
    def check_timed(self, index: int, reference: dict[str, np.ndarray]) -> None:
        """Compare what the last timed launch of kernel ``index`` left in each copy with
        ``reference`` (its validation launch 1, same inputs); those copies are then forgotten."""
        if not self.timed_outputs:
            return
        record = self.timed.setdefault(index, {"checked": 0, "outputs": {}})
        slots = sorted(s for s, w in self.last_writer.items() if w == index)
        if not slots:
            return
        dev = self.device
        with self.phase("the check of the timed launches' outputs"):
            dev.synchronize()
            for slot in slots:
                del self.last_writer[slot]
                record["checked"] += 1
                for buf in self.buffers.values():
                    if not buf.written:
                        continue
                    got = buf.logical(dev.download(buf.ptrs[slot], np.empty(buf.count, buf.dtype)))
                    ref = reference[buf.name]
                    differing = _changed(got, ref)
                    unwritten = 0
                    if differing and buf.intent == "out":
                        unwritten = int(np.count_nonzero(all_bytes(got, POISON_TIMED) & ~all_bytes(ref, POISON_TIMED)))
                    entry = record["outputs"].setdefault(buf.name, {"differing": 0, "unwritten": 0, "array": None})
                    entry["unwritten"] = max(entry["unwritten"], unwritten)
                    if differing > entry["differing"]:
                        entry["differing"], entry["array"] = differing, got

    @_step("guard_zones")
    def check_guards(self, phase: str, who: int | None = 0, slots: list[int] | None = None) -> None:
        """Look at every guard zone (of ``slots``, default all copies); record and re-arm changed ones."""
        if not self.guard:
            return
        dev = self.device
        with self.phase(f"the guard-zone check after {phase}"):
            dev.synchronize()
            for buf in self.buffers.values():
                for slot in range(len(buf.bases)) if slots is None else slots:
                    for side, addr in (("before", buf.bases[slot]), ("after", buf.ptrs[slot] + buf.nbytes)):
                        zone = dev.download(addr, np.empty(self.guard, np.uint8))
                        changed = np.flatnonzero(zone != CANARY)
                        if not changed.size:
                            continue
                        nearest = int(changed[0]) if side == "after" else int(self.guard - 1 - changed[-1])
                        hit = self.guard_hits.setdefault((buf.name, side), {
                            "buffer": buf.name, "side": side, "bytes": 0, "nearest": nearest, "phase": phase, "who": who})
                        hit["bytes"] = max(hit["bytes"], int(changed.size))
                        hit["nearest"] = min(hit["nearest"], nearest)
                        dev.fill(addr, CANARY, self.guard)
                    if buf.layout is not None:
                        self._check_padding(buf, slot, phase, who)

    def _check_padding(self, buf: Buffer, slot: int, phase: str, who: int | None) -> None:
        """Record padding elements of copy ``slot`` of ``buf`` that no longer hold CANARY bytes (the
        first in row order), and re-arm them."""
        array = self.device.download(buf.ptrs[slot], np.empty(buf.count, buf.dtype))
        changed = buf.padding_changes(array)
        if not len(changed):
            return
        hit = self.padding_hits.setdefault(buf.name, {"elements": 0, "row": int(changed[0][0]),
                                                      "column": int(changed[0][1]), "phase": phase, "who": who})
        hit["elements"] = max(hit["elements"], len(changed))
        self.device.upload(buf.ptrs[slot], buf.padded(buf.logical(array)))

    @_step("input_check")
    def check_inputs(self, phase: str, who: int | None = 0) -> None:
        """Compare every copy of every input buffer with its host data; restore changed ones."""
        dev = self.device
        restored = False
        with self.phase(f"the input check after {phase}"):
            dev.synchronize()
            for buf in self.buffers.values():
                if buf.intent != "in":
                    continue
                host = self._host(buf)
                for ptr in buf.ptrs:  # the padding is the guard-zone check's
                    changed = _changed(buf.logical(dev.download(ptr, np.empty(buf.count, buf.dtype))),
                                       buf.logical(host))
                    if changed:
                        entry = self.input_writes.setdefault(buf.name, {"elements": 0, "phase": phase, "who": who})
                        entry["elements"] = max(entry["elements"], changed)
                        dev.upload(ptr, host)
                        restored = True
            if restored:
                synchronize_all(dev)

    @_step("fresh_inputs")
    def fresh_launch(self, kernel: Launchable, spec: FreshSet, base: Path, output_dir: Path, *, index: int = 0,
                     prefix: str = "") -> dict:
        """Upload one fresh input set into the first copy's buffers (same addresses) and launch once."""
        label = str(spec.label)
        arrays = load_fresh_inputs(self.signature, self.case, spec, base)
        dev = self.device
        phase = f"fresh inputs ({label})"
        with self.phase(phase):
            dev.synchronize()
            for name, array in arrays.items():
                buf = self.buffers[name]
                dev.upload(buf.pristine if buf.intent == "inout" else buf.ptr, buf.padded(array))
            synchronize_all(dev)
            result = self._validation_launch(kernel, POISON_FIRST)
        self.check_guards(phase, who=index, slots=[0])
        case_dir = output_dir / self.case.name
        case_dir.mkdir(parents=True, exist_ok=True)
        entry: dict = {"label": label, "outputs": {}, "inputs_modified": {}}
        if spec.atol_scale is not None:
            entry["atol_scale"] = spec.atol_scale
        if spec.description is not None:
            entry["description"] = spec.description
        if spec.expected:
            entry["expected"] = {name: str(base / path) for name, path in spec.expected.items()}
        for name, buf in self.buffers.items():
            if buf.intent == "in":
                changed = _changed(result[name], arrays[name])
                if changed:
                    entry["inputs_modified"][name] = changed
            if not buf.written:
                continue
            path = case_dir / f"{prefix}fresh.{_SAFE.sub('_', label)}.{name}.npy"
            np.save(path, result[name])
            entry["outputs"][name] = {"path": str(path)}
        return entry

    def findings(self, index: int, output_dir: Path, prefix: str = "") -> dict:
        """What the guard zones, the timed-output checks and the input checks found for kernel ``index``."""
        body: dict = {"checks": {"guards": bool(self.guard), "scrub_shared": self.scrub is not None,
                                 "timed_outputs": self.timed_outputs},
                      "step_seconds": {step: round(s, 6) for step, s in sorted(self.seconds.items())}}
        guards: dict = {}
        for hit in self.guard_hits.values():
            if hit["who"] in (index, None):
                guards.setdefault(hit["buffer"], {})[hit["side"]] = {k: hit[k] for k in ("bytes", "nearest", "phase")}
        if guards:
            body["guards"] = guards
        padding = {name: {k: hit[k] for k in ("elements", "row", "column", "phase")}
                   for name, hit in self.padding_hits.items() if hit["who"] in (index, None)}
        if padding:
            body["padding"] = padding
        writes = {name: {"elements": w["elements"], "phase": w["phase"]}
                  for name, w in self.input_writes.items() if w["who"] in (index, None)}
        if writes:
            body["input_writes"] = writes
        record = self.timed.get(index)
        if record is not None:
            case_dir = output_dir / self.case.name
            case_dir.mkdir(parents=True, exist_ok=True)
            outputs = {}
            for name, entry in record["outputs"].items():
                item = {"differing": entry["differing"], "unwritten": entry["unwritten"]}
                if entry["array"] is not None:
                    item["path"] = str(case_dir / f"{prefix}{name}.timed.npy")
                    np.save(item["path"], entry["array"])
                outputs[name] = item
            body["timed"] = {"checked": record["checked"], "outputs": outputs}
            if index in self.digests:
                body["timed"]["digests"] = dict(self.digests[index])
        return body

    def outputs(self, first: dict, second: dict, output_dir: Path, prefix: str = "") -> dict:
        """Save outputs and report unwritten elements, launch-to-launch differences, input writes."""
        case_dir = output_dir / self.case.name
        case_dir.mkdir(parents=True, exist_ok=True)
        outputs, inputs_modified = {}, {}
        for name, buf in self.buffers.items():
            if buf.intent == "in":
                host = buf.logical(buf.host)
                changed = max(_changed(first[name], host), _changed(second[name], host))
                if changed:
                    inputs_modified[name] = changed
            if not buf.written:
                continue
            path = case_dir / f"{prefix}{name}.npy"
            np.save(path, first[name])
            differing = _changed(first[name], second[name])
            entry = {"path": str(path), "differing_second_launch": differing,
                     "unwritten": int(np.count_nonzero(unwritten_mask(first[name], second[name])))}
            if differing:
                entry["second_path"] = str(case_dir / f"{prefix}{name}.second.npy")
                np.save(entry["second_path"], second[name])
            outputs[name] = entry
        return {"outputs": outputs, "inputs_modified": inputs_modified}


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def ratios(samples: list[list[float]]) -> list[float]:
    """Per-round latency ratios of the first kernel to the second (a kernel to its library)."""
    return [a / b if b > 0 else float("inf") for a, b in zip(samples[0], samples[1])]


def own(samples: list[list[float]]) -> list[float]:
    """The one kernel's own latencies (a kernel timed alone)."""
    return samples[0]


def _changed(a: np.ndarray, b: np.ndarray) -> int:
    """Elements whose bytes differ (NaN-safe, -0.0 differs from 0.0): compared as unsigned words."""
    if a is b:
        return 0
    x, y = element_words(a), element_words(b)
    if np.array_equal(x, y):
        return 0  # the common case, without a copy
    return int(np.count_nonzero(x != y))


def error_reply(exc: Exception) -> CaseReply:
    if isinstance(exc, CaseInputError):
        return CaseReply(status="error", error=CaseError(kind="input", code="BAD_CASE_DATA", message=str(exc)))
    kind = "fault" if exc.sticky else ("oom" if exc.code == "CUDA_ERROR_OUT_OF_MEMORY" else "launch")
    return CaseReply(status="error", error=CaseError(kind=kind, code=exc.code, message=str(exc),
                                                     phase=getattr(exc, "phase", None) or ABSENT))


def run_case(device: Device, kernel: Launchable, signature: tuple[Param, ...], case: Case, *, base: Path,
             timing: Timing | None, output_dir: Path, flush=None, pad: Launchable | None = None,
             scrub: Callable[[int], None] | None = None, checks: Checks = Checks(),
             library: tuple[str, LibraryLaunch | str, int, Settle | None] | None = None,
             state: Callable[[bool], dict] | None = None, floor: Callable[[float], float] | None = None,
             hold: bool = False, digester: Digester | None = None) -> CaseReply:
    """Validate ``kernel`` on one case (and time it if ``timing``); errors become an error body.

    ``library``: ``(adapter, baseline or why none, rounds, settle)``, timed beside the kernel after its own
    timed launches (:meth:`CaseRun.time_library`) when the case is timed. ``timing.settle``: the kernel
    timed alone may stop before ``timing.repeat`` launches once its run level is settled
    (:meth:`CaseRun.time_settled`); ``timing.repeat`` in the answer is the launches timed.

    ``state(floored)``: the GPU's NVML state, read right after the kernel's timed launches (``timing.state``),
    so a disturbance the host judges the run by is the one around those launches, not one caused by
    the library's rounds that follow. ``floor(ms)``: the warm-up time floor to use instead of
    ``timing.warmup_ms``, decided just before the warm-up (the worker's, from the GPU's clock).
    ``hold``: the timed launches are held (:meth:`CaseRun._timed_launch`). ``digester``: every timed
    launch's outputs are digested and compared with validation launch 1's (:mod:`.digest`).

    ``checks`` switches worker-side defences off (see :class:`~cudagate_harness.messages.Checks`);
    a case with ``sanitize: true`` gets one plain launch (no poison, guards or scrub) for
    compute-sanitizer to watch.
    """
    start = time.perf_counter()
    sanitize = bool(case.sanitize)
    try:
        copies = rotation_copies(signature, case, timing.rotate, int(timing.batch)) if timing and not sanitize else 1
        guard = GUARD_BYTES if checks.guards and not sanitize else 0
        with CaseRun(device, signature, case, base, flush, pad, seed=int(timing.seed) if timing else 0,
                     copies=copies, guard=guard, timed_outputs=checks.timed_outputs,
                     scrub=scrub if checks.scrub_shared and not sanitize else None, hold=hold,
                     digester=digester if timing and not sanitize else None) as run:
            run.prepare(kernel)
            if sanitize:
                with run.phase("the launch under compute-sanitizer"):
                    first = run.validation_launch(kernel, None)
                body = {"status": "ok", **run.outputs(first, first, output_dir)}
            else:
                with run.phase("validation launch 1"):
                    first = run.validation_launch(kernel, POISON_FIRST)
                    run.expect(kernel, 0)
                run.check_guards("validation launch 1")
                body = {"status": "ok"}
                if timing:
                    asked = float(timing.warmup_ms)
                    warmup_ms = floor(asked) if floor is not None else asked
                    with run.phase("the warm-up launches"):
                        run.warm_up([kernel], int(timing.warmup), warmup_ms)
                    samples = run.time_settled([kernel], int(timing.repeat), timing.settle, own, cold=timing.cold,
                                               pad_max=int(timing.pad_max), batch=int(timing.batch))
                    after = {"state": state(warmup_ms > 0)} if state is not None else {}
                    run.check_timed(0, first)
                    run.check_guards("the timed launches")
                    run.check_inputs("the timed launches")
                    body["timing"] = {"samples_ms": samples[0], "warmup": int(timing.warmup), "warmup_ms": warmup_ms,
                                      "repeat": len(samples[0]), "cache": timing.cache, "held": hold,
                                      **after}
                    if library is not None:
                        body["library"] = run.time_library(kernel, library, timing, output_dir)
                if checks.second_launch:
                    with run.phase("validation launch 2"):
                        second = run.validation_launch(kernel, POISON_SECOND)
                    run.check_guards("validation launch 2")
                else:  # a trusted reference computing expected outputs: one launch is enough
                    second = first
                body.update(run.outputs(first, second, output_dir))
                fresh = [run.fresh_launch(kernel, spec, base, output_dir) for spec in case.fresh]
                if fresh:
                    body["fresh"] = fresh
                body.update(run.findings(0, output_dir))
        reply = CaseReply(**body)
    except (CaseInputError, CudaError) as exc:
        reply = error_reply(exc)
    return replace(reply, case=case.name, seconds=time.perf_counter() - start)
