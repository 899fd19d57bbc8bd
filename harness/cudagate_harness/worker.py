"""The worker process: ``python -m cudagate_harness.worker`` reads JSON-line requests on stdin.

It owns one CUDA context for its whole life (context creation costs ~0.35 s) and caches loaded
modules, so repeated requests pay only for their launches. After a sticky fault it answers the case
and exits with :data:`~cudagate_harness.protocol.EXIT_STICKY`; the client starts a fresh one.

``compare`` is a conversation: after each chunk of interleaved rounds the worker reports the
samples and waits for the client to say ``more`` or ``stop``. The statistics that decide stay on the
client side; the worker only measures.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import PROTOCOL_VERSION, digest, library, steps, telemetry
from .compiler import CompileLimits, CompileOptionError, compile_kernel, nvrtc_version
from .driver import CudaError, Device
from dataclasses import replace

from .messages import (ABSENT, CaseReply, Checks, Chunk, CompileReply, Done, ErrorReply, Hello, Kernel, Request, from_json,
                       to_json)
from .protocol import EXIT_STICKY, GUARD_BYTES, POISON_FIRST, POISON_SECOND, SCRUB_WORDS, compile_seconds, request_timeout_s
from .request_checks import request_problems
from .runner import SIGNED, CaseInputError, CaseRun, Launchable, error_reply, load_fresh_inputs, rotation_copies, run_case
from .stopping import Settle

PAD_SOURCE = 'extern "C" __global__ void cudagate_pad() {}'
# Fills a block's whole dynamic shared memory with a pattern; launched with the most shared memory a
# block may have and one block per SM, it overwrites every SM's shared memory. volatile: stores that
# nothing reads must not be optimised away.
SCRUB_SOURCE = r"""
extern "C" __global__ void cudagate_scrub(unsigned int pattern, unsigned int words)
{
    extern __shared__ unsigned int cudagate_smem[];
    volatile unsigned int* s = cudagate_smem;
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) s[i] = pattern;
}
"""
ROLES = ("approved", "current")
# The warm-up's time floor lets an idle GPU's clocks ramp up before timed launches. A GPU whose SM
# clock still reads at least CLOCK_KEPT of what it read right after this worker's last timed launches,
# at most RAMP_MEMORY_S ago, has ramped: its warm-up is the launch count alone.
CLOCK_KEPT = 0.95
RAMP_MEMORY_S = 2.0
# A disturbed chunk's probe: each kernel alone for about this long (ms), at most this many launches a
# burst (a few more than the driver queues before the host waits), at most this often a comparison.
PROBE_MS = 100.0
MAX_PROBE_LAUNCHES = 2000
MAX_PROBES = 2
PRIOR_IDLE_S = 0.5  # how long a comparison waits for the card's clock events to clear before its first launch


class Worker:
    def __init__(self, device: Device, emit, source):
        self.device = device
        self.emit = emit
        self.source = source
        self.modules: dict[str, tuple[object, object]] = {}
        self._compiled: dict[str, tuple[object, object]] = {}  # compile inputs -> (result, function)
        self.compile_limits = CompileLimits()  # the request being served's (its timeout_s)
        self.info = device.describe()
        # Timed launches are held where the driver can (nvbench's way): the timing then excludes the
        # host's enqueueing; where it cannot, the fingerprint says so and baselines do not mix.
        self.held = device.can_hold()
        self._flush_ptr = 0
        self._flush_bytes = 0
        self._pad: Launchable | None = None
        self._digester: digest.Digester | None = None
        self._scrub = None  # the scrub callable once built; False when this device cannot run it
        self.scrub_note: str | None = None
        self.libraries: dict[str, object] = {}  # adapter -> loaded baseline, or why it cannot be (once per worker)
        self._timed_at: float | None = None  # when this worker's last timed launches ended
        self._ramped_mhz: int | None = None  # SM clock right after timed launches whose warm-up had its floor

    def send(self, reply) -> None:
        """Write one reply line: the one place a reply dataclass becomes JSON."""
        self.emit(to_json(reply))

    def library_for(self, request: Request) -> tuple[str, object, int, Settle | None] | None:
        """The request's library baseline as ``(adapter, LibraryLaunch or why none, rounds, settle)``;
        None when it names none."""
        spec = request.library
        if spec is None:
            return None
        return str(spec.adapter), library.bind(spec, self.device, self.libraries), int(spec.rounds), spec.settle

    def operation(self, functions: dict, launch):
        """A case's launch, its memset, copy and library steps included (libraries loaded once per worker)."""
        return Launchable.operation(functions, launch, lambda step: steps.build(step, self.libraries))

    def flush_l2(self) -> None:
        # Writing twice the L2's size evicts whatever the last launch left there (cold-cache timing).
        if not self._flush_ptr:
            self._flush_bytes = max(2 * self.info["l2_bytes"], 1 << 20)
            self._flush_ptr = self.device.alloc(self._flush_bytes)
        self.device.fill(self._flush_ptr, 0, self._flush_bytes)

    def pad(self) -> Launchable:
        if self._pad is None:
            result, function = self.function_for(Kernel(entry="cudagate_pad", source=PAD_SOURCE), self.device.arch)
            self._pad = Launchable(function, (1, 1, 1), (1, 1, 1), 0)
        return self._pad

    def digester(self) -> digest.Digester:
        """The timed launches' output digest (:mod:`.digest`), compiled once per worker."""
        if self._digester is None:
            result, function = self.function_for(Kernel(entry=digest.ENTRY, source=digest.SOURCE), self.device.arch)
            if function is None:
                raise CudaError("COMPILE_FAILED", "the output digest kernel", result.log)
            self._digester = digest.Digester(self.device, function, int(self.info.get("sm_count") or 1))
        return self._digester

    def scrubber(self):
        """A callable that scrubs every SM's shared memory with a poison's pattern, or None."""
        if self._scrub is None:
            try:
                result, function = self.function_for(Kernel(entry="cudagate_scrub", source=SCRUB_SOURCE), self.device.arch)
                if function is None:
                    raise RuntimeError(result.log)
                nbytes = int(self.info.get("max_shared_per_block_optin") or 48 * 1024)
                if nbytes > 48 * 1024:
                    self.device.allow_dynamic_shared(function, nbytes)
                grid = (int(self.info.get("sm_count") or 1), 1, 1)
                block = (min(1024, int(self.info.get("max_threads_per_block") or 1024)), 1, 1)
                words = np.array([nbytes // 4], dtype=np.uint32)

                def scrub(poison: int) -> None:
                    pattern = np.array([SCRUB_WORDS.get(poison, 0xFFFFFFFF)], dtype=np.uint32)
                    params = np.array([pattern.ctypes.data, words.ctypes.data], dtype=np.uint64)
                    self.device.launch(function, grid, block, nbytes, params)

                scrub(POISON_FIRST)  # once here: a device that refuses it must never fail a kernel's case
                self.device.synchronize()
                self._scrub = scrub
            except (CudaError, CompileOptionError, RuntimeError) as exc:
                if isinstance(exc, CudaError) and exc.sticky:
                    return None  # the context is lost: the case's next CUDA call reports it as a fault
                self._scrub = False
                self.scrub_note = f"shared memory could not be scrubbed on this device ({exc}); uninitialised " \
                                  "shared-memory reads are left to the determinism check"
        return self._scrub or None

    def state(self) -> dict:
        return telemetry.device_state(self.device.ordinal, self.info["pci_bus_id"])

    def timed_state(self, floored: bool) -> dict:
        """:meth:`state` right after timed launches. ``floored``: their warm-up had its time floor, so
        their SM clock is the one a ramped GPU holds, which :meth:`warmup_floor_ms` compares with (a
        clock read after a skipped floor never becomes the reference: it could slide case by case)."""
        state = self.state()
        self._timed_at = time.perf_counter()
        if floored:
            clock = state.get("sm_clock_mhz")
            self._ramped_mhz = int(clock) if clock else None
        return state

    def warmup_floor_ms(self, requested: float) -> float:
        """The warm-up time floor for timed launches about to start: ``requested``, or 0 when the GPU
        has kept the clock it held after a floored warm-up (see :data:`CLOCK_KEPT`). Without a clock
        reading (no NVML, or no floored timed launches yet) the floor stays."""
        if (requested <= 0 or self._ramped_mhz is None or self._timed_at is None
                or time.perf_counter() - self._timed_at > RAMP_MEMORY_S):
            return requested
        now = self.sm_clock()
        return 0.0 if now and now >= CLOCK_KEPT * self._ramped_mhz else requested

    def sm_clock(self) -> int | None:
        """The SM clock now (MHz), one NVML query; None without NVML."""
        return telemetry.sm_clock_mhz(self.device.ordinal, self.info["pci_bus_id"])

    def function_for(self, kernel: Kernel, arch: str):
        # Every case of a compare request names the approved kernel again: compile each exact input
        # set once per worker (the on-disk cache would still read and hash the cubin every time).
        memo = json.dumps([kernel.source, kernel.entry, arch, kernel.source_name, list(kernel.options), kernel.headers,
                           kernel.compiler], sort_keys=True)
        if memo in self._compiled:
            result, function = self._compiled[memo]
            return replace(result, cache_hit=True, seconds=0.0), function
        result = compile_kernel(kernel.source, entry=kernel.entry, arch=arch, source_name=kernel.source_name,
                                options=list(kernel.options), headers=dict(kernel.headers), limits=self.compile_limits,
                                compiler=kernel.compiler)
        if not result.ok:
            return result, None
        if result.key not in self.modules:
            self.modules[result.key] = self.device.load(result.cubin, result.lowered_name)
        self._compiled[memo] = (result, self.modules[result.key][1])
        return result, self.modules[result.key][1]

    def compiled(self, rid, kernel: Kernel, arch: str | None, role: str | None = None) -> dict | None:
        """Compile and load ``kernel``, emitting its compile line: its functions by entry (every entry
        of a kernel of steps, its first's result in the line), or None on failure."""
        arch = arch or self.device.arch + kernel.arch_suffix
        role = role or ABSENT
        functions, shown = {}, None
        try:
            for entry in kernel.entries or (kernel.entry,):
                result, function = self.function_for(replace(kernel, entry=entry), arch)
                if shown is None or function is None:  # the first entry's line, or the one that failed
                    shown = result
                if function is None:
                    break
                functions[entry] = function
        except (CompileOptionError, CudaError) as exc:  # refused option, or a cubin the driver rejects
            self.send(CompileReply(id=rid, ok=False, arch=arch, log=str(exc), role=role))
            return None
        self.send(CompileReply(id=rid, **shown.to_json(), role=role))
        return functions if shown.ok else None

    def handle(self, request: dict) -> None:
        """Serve one request line's object: checked (a ``run``), then read into a :class:`Request`."""
        rid = request.get("id")
        op = request.get("op")
        # This request's compiles stop in time to be answered before its client's watchdog ends the worker.
        timeout = request_timeout_s(request)
        self.compile_limits = (CompileLimits(compile_seconds(timeout), f"inside the request's {timeout:g} s timeout")
                               if timeout is not None else CompileLimits())
        problems = request_problems(request) if op == "run" else []
        if problems:
            self.send(ErrorReply(id=rid, message="refused run request: " + "; ".join(problems[:5])))
            return
        if op not in ("run", "compile", "compare"):
            self.send(ErrorReply(id=rid, message=f"unknown op {op!r}"))
            return
        try:
            if op == "compare":
                self.compare(from_json(Request, request))
            else:
                self.run(from_json(Request, request))
        except (KeyError, TypeError, ValueError) as exc:
            self.send(ErrorReply(id=rid, message=f"malformed {op} request: {exc!r}"))
            return
        self.send(Done(id=rid))

    def run(self, request: Request) -> None:
        functions = self.compiled(request.id, request.kernel, request.arch)
        if request.op != "run" or functions is None:
            return
        base = Path(request.base_dir)
        output_dir = Path(request.output_dir)
        timing = request.timing
        pad = self.pad() if timing and timing.pad_max else None
        checks = request.checks
        scrub = self.scrubber() if checks.scrub_shared else None
        baseline = self.library_for(request) if timing else None
        for case in request.cases:
            reply = run_case(self.device, self.operation(functions, case.launch), request.signature, case,
                             base=base, timing=timing, output_dir=output_dir, flush=self.flush_l2, pad=pad,
                             scrub=scrub, checks=checks, library=baseline, state=self.timed_state if timing else None,
                             floor=self.warmup_floor_ms, hold=self.held,
                             digester=self.digester() if timing and checks.timed_outputs else None)
            self.answer(request.id, self._note(reply, checks))

    def _note(self, reply: CaseReply, checks: Checks) -> CaseReply:
        if checks.scrub_shared and self.scrub_note and reply.status == "ok":
            return replace(reply, notes=[*(reply.notes or []), self.scrub_note])
        return reply

    def compare(self, request: Request) -> None:
        """Validate both kernels, then time them interleaved, chunk by chunk, until told to stop.

        A share of each chunk's rounds (``timing.fresh_share``) runs on the case's fresh input sets
        marked ``timed``, both kernels on the same set, so a kernel that recognises the signed inputs
        is timed on inputs it cannot know too; the chunk says which rounds were fresh. A chunk that
        NVML saw disturbed by the card's own state (a clock event, a clock change, heat) brings on a
        probe (:meth:`_probe`): each kernel alone, to tell which of them causes it."""
        rid, functions = request.id, {}
        for role in ROLES:
            functions[role] = self.compiled(rid, getattr(request.kernels, role), request.arch, role)
            if functions[role] is None:
                return
        case, timing = request.case, request.timing
        kernels = [self.operation(functions[role], getattr(request.launches, role)) for role in ROLES]
        cold = timing.cold
        batch = int(timing.batch)
        pad_max = int(timing.pad_max)
        checks = request.checks
        base = Path(request.base_dir)
        current = ROLES.index("current")
        baseline = self.library_for(request)
        timed_sets = [spec for spec in case.fresh if spec.timed]
        share = float(timing.fresh_share) if timed_sets else 0.0
        start = time.perf_counter()
        prior = self._prior()
        try:
            with CaseRun(self.device, request.signature, case, base, self.flush_l2, self.pad(),
                         seed=int(timing.seed), copies=rotation_copies(request.signature, case, timing.rotate, batch),
                         guard=GUARD_BYTES if checks.guards else 0, timed_outputs=checks.timed_outputs,
                         scrub=self.scrubber() if checks.scrub_shared else None, hold=self.held,
                         digester=self.digester() if checks.timed_outputs else None) as run:
                for kernel in kernels:
                    run.prepare(kernel)
                firsts = []
                for index, kernel in enumerate(kernels):
                    with run.phase(f"validation launch 1 of the {ROLES[index]} kernel"):
                        firsts.append(run.validation_launch(kernel, POISON_FIRST))
                        run.expect(kernel, index)
                    run.check_guards(f"validation launch 1 of the {ROLES[index]} kernel", who=index)
                # What each kernel's timed launches must write on each input set: launch 1 on it.
                references = {SIGNED: firsts}
                for spec in timed_sets:
                    label = str(spec.label)
                    run.add_inputs(label, load_fresh_inputs(request.signature, case, spec, base))
                    run.use_inputs(label)
                    references[label] = []
                    for index, kernel in enumerate(kernels):
                        phase = f"validation launch of the {ROLES[index]} kernel on fresh inputs ({label})"
                        with run.phase(phase):
                            references[label].append(run.validation_launch(kernel, POISON_FIRST))
                            run.expect(kernel, index)
                        run.check_guards(phase, who=index)
                    run.check_inputs(f"the validation launches on fresh inputs ({label})", who=None)
                run.use_inputs(SIGNED)
                with run.phase("the warm-up launches"):
                    floor = self.warmup_floor_ms(float(timing.warmup_ms))
                    run.warm_up(kernels, int(timing.warmup), floor)

                def checked(what: str) -> None:
                    """What the timed launches on the active input set wrote, and the guards."""
                    run.timed_check_launch(current, kernels[current], cold=cold, pad_max=pad_max, batch=batch)
                    for index in range(len(kernels)):
                        run.check_timed(index, references[run.inputs][index])
                    run.check_guards(what, who=None)

                rounds, number, probes = int(timing.chunk), 0, 0
                while rounds > 0:
                    fresh_rounds = min(rounds - 1, max(1, round(rounds * share))) if share > 0 else 0
                    parts = [(SIGNED, rounds - fresh_rounds)]
                    if fresh_rounds:
                        parts.append((str(timed_sets[number % len(timed_sets)].label), fresh_rounds))
                        if run.inputs != SIGNED:  # the set left in place goes first: one switch a chunk
                            parts.reverse()
                    before = self.state()
                    t0 = time.perf_counter()
                    samples, order, fresh = [[], []], [], []
                    for label, count in parts:
                        if label != run.inputs:
                            # Outside the measured wall time: the set's checks before its inputs go.
                            wall = time.perf_counter()
                            checked("the interleaved timed launches")
                            run.check_inputs("the interleaved timed launches", who=None)
                            run.use_inputs(label)
                            t0 += time.perf_counter() - wall
                        got, firsts_of = run.time_rounds(kernels, count, cold=cold, batch=batch, pad_max=pad_max)
                        for kept, new in zip(samples, got):
                            kept.extend(new)
                        order += firsts_of
                        fresh += [label != SIGNED] * count
                    wall = time.perf_counter() - t0
                    after = self.timed_state(floored=floor > 0)
                    # Outside the measured wall time: what the timed launches wrote, and the guards.
                    checked("the interleaved timed launches")
                    disturbances, probe = telemetry.disturbances(before, after), ABSENT
                    if probes < MAX_PROBES and telemetry.card_reasons(disturbances):
                        probes += 1
                        probe = self._probe(run, kernels, samples)
                    self.send(Chunk(id=rid, approved=samples[0], current=samples[1], first=[ROLES[i] for i in order],
                                    wall_s=wall, state=after, disturbances=disturbances,
                                    fresh=fresh if fresh_rounds else ABSENT, prior=prior if number == 0 else ABSENT,
                                    probe=probe))
                    number += 1
                    with run.clock("waiting"):  # the host's decision: its time, not the worker's
                        rounds = self._next_rounds()
                run.check_inputs("the interleaved timed launches", who=None)
                run.use_inputs(SIGNED)
                # After the verdict's rounds, so the library changes neither their samples nor their budget.
                library_entry = (run.time_library(kernels[current], baseline, timing, Path(request.output_dir))
                                 if baseline else None)
                seconds = []
                for index, kernel in enumerate(kernels):
                    with run.phase(f"validation launch 2 of the {ROLES[index]} kernel"):
                        seconds.append(run.validation_launch(kernel, POISON_SECOND))
                    run.check_guards(f"validation launch 2 of the {ROLES[index]} kernel", who=index)
                output_dir = Path(request.output_dir)
                body = {"status": "ok", **run.outputs(firsts[current], seconds[current], output_dir)}
                approved = ROLES.index("approved")
                body["approved"] = run.outputs(firsts[approved], seconds[approved], output_dir, prefix="approved.")
                fresh_bodies = [run.fresh_launch(kernels[current], spec, base, output_dir, index=current)
                                for spec in case.fresh]
                if fresh_bodies:
                    body["fresh"] = fresh_bodies
                body.update(run.findings(current, output_dir))
                body["approved"].update(run.findings(approved, output_dir, prefix="approved."))
                if library_entry is not None:
                    body["library"] = library_entry
                reply = self._note(CaseReply(**body), checks)
        except (CaseInputError, CudaError) as exc:
            reply = error_reply(exc)
        self.answer(rid, replace(reply, case=case.name, seconds=time.perf_counter() - start))

    def _prior(self) -> list[str]:
        """What NVML finds wrong before either kernel runs, once the card has idled up to
        :data:`PRIOR_IDLE_S` (a clock event a kernel left behind clears as the card idles; one that
        stays comes from outside the comparison)."""
        deadline = time.perf_counter() + PRIOR_IDLE_S
        while True:
            state = self.state()
            reasons = telemetry.disturbances(state, state)
            if not reasons or time.perf_counter() >= deadline:
                return reasons
            time.sleep(PRIOR_IDLE_S / 10)

    def _probe(self, run: CaseRun, kernels: list[Launchable], samples: list[list[float]]) -> dict:
        """Each kernel alone, back to back, for about :data:`PROBE_MS` twice, with the card's state read
        while it runs: which of them brings on the clock events, clock drop or heat that disturbed a
        chunk (``samples``: the chunk's latencies, to size the bursts). The host decides what it means."""
        seen: dict[str, list[dict]] = {role: [] for role in ROLES}
        with run.phase("the throttle probe"):
            for index in (0, 1, 0, 1):
                median = float(np.median(samples[index])) if samples[index] else 0.0
                count = int(min(MAX_PROBE_LAUNCHES, max(1, PROBE_MS / max(median, 1e-3))))
                run.burst(kernels[index], index, count)
                seen[ROLES[index]].append(self.state())  # the last launches still run: the state they cause
                self.device.synchronize()
        return {role: {"events": sorted({event for state in states for event in telemetry.card_events(state)}),
                       "sm_clock_mhz": min((state.get("sm_clock_mhz") or 0 for state in states), default=0) or None}
                for role, states in seen.items()}

    def _next_rounds(self) -> int:
        """The client's decision after a chunk: more rounds, or 0 to stop (also when it is gone)."""
        for line in self.source:
            if line.strip():
                reply = json.loads(line)
                return int(reply.get("rounds", 0)) if reply.get("op") == "more" else 0
        return 0

    def answer(self, rid, reply: CaseReply) -> None:
        self.send(replace(reply, id=rid))
        if reply.error and reply.error.kind == "fault":
            self.send(Done(id=rid))
            sys.exit(EXIT_STICKY)


def unavailable_reason(exc: Exception) -> str:
    """Why no worker can run, in the user's words: a missing driver library is named as such rather
    than by the loader's message about where it searched."""
    if type(exc).__name__ == "DynamicLibNotFoundError":  # cuda.pathfinder: libcuda is not installed
        return "no CUDA device (driver not found)"
    return f"no CUDA device: {exc}"


def main(lines=None) -> int:
    """Serve requests from ``lines`` (default: stdin) until it ends."""
    # The protocol owns the real stdout; anything else that prints (a library, a warning) goes to
    # stderr so it can never corrupt a response line.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def emit(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    library.read_plugin_adapters()
    ordinal = int(os.environ.get("CUDAGATE_DEVICE", "0"))
    try:
        device = Device(ordinal)
        source = iter(lines if lines is not None else sys.stdin)
        worker = Worker(device, emit, source)
    except Exception as exc:  # no driver, no device, or a broken install: all mean "cannot replay"
        emit(to_json(Hello(protocol=PROTOCOL_VERSION, ok=False, pid=os.getpid(), error=unavailable_reason(exc))))
        return 0
    worker.send(Hello(protocol=PROTOCOL_VERSION, ok=True, pid=os.getpid(), device=worker.info,
                      identity=telemetry.device_identity(ordinal, worker.info["pci_bus_id"]),
                      nvrtc_version=nvrtc_version(), cuda_bindings_version=_bindings_version(), timing_hold=worker.held))
    for line in source:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            worker.send(ErrorReply(id=None, message=f"request is not JSON: {exc}"))
            continue
        worker.handle(request)
    return 0


def _bindings_version() -> str:
    try:
        from importlib.metadata import version

        return version("cuda-bindings")
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
