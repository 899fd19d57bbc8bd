"""Where a worker is started (:func:`open_worker`: client, GPU lock, fingerprint), and one gate
run's shared state: that worker (started lazily, once), the compile target, ledgers, the output
folder, and every outcome."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagate import phases

from pytest_cudagate.host import trash
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.config import DEFAULT_ARCH, DEFAULT_LOCK_TIMEOUT_S, DEFAULT_RELEASE_TAGS, DEFAULT_TIMEOUT_S
from pytest_cudagate.worker.client import HarnessClient, Worker, WorkerUnavailable
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.host.paths import RUN_PREFIX, scratch_dir
from pytest_cudagate.worker.gpulock import GpuLock
from pytest_cudagate.worker.spawn import xdist_device_env
from pytest_cudagate.suite import device
from pytest_cudagate.suite.model import Case, Program, Suite
from pytest_cudagate.trust import gate_problems
from pytest_cudagate.trust.ledger import release_verifier

if TYPE_CHECKING:  # release mode and `cudagate gate --trusted-ref` only
    from pytest_cudagate.trust.release import ReleaseSource
    from pytest_cudagate.trust.base_ref import TrustRoot
    from pytest_cudagate.worker.build import BuildFacts


@dataclass
class OpenWorker:
    """A started worker, the lock on its GPU (held until :meth:`close`), and the hardware's fingerprint."""

    client: Worker
    fingerprint: Fingerprint
    lock: GpuLock

    def close(self) -> None:
        device.use(None)
        try:
            self.client.close()
        finally:
            self.lock.release()

    def __enter__(self) -> OpenWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_worker(*, timeout_s: float = DEFAULT_TIMEOUT_S, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
                spawned: Worker | None = None) -> OpenWorker:
    """Start a worker (under pytest-xdist on gwN's GPU) and hold its GPU's lock while it runs: two
    gate runs, approvals or optimizations never time on one card at once.

    The one place a worker is started, for the pytest session, ``cudagate run``, ``cases generate``,
    ``approve`` and ``optimize``. ``spawned``: a process the pytest session started early
    (:mod:`pytest_cudagate.worker.spawn`), taken over here (closed on failure like one started here).
    Raises :class:`WorkerUnavailable` without a usable GPU and
    :class:`~pytest_cudagate.errors.GpuLockTimeout` when the card stays busy.
    """
    client = spawned if spawned is not None else HarnessClient(timeout_s=timeout_s, env=xdist_device_env())
    client.timeout_s = timeout_s
    try:
        hello = client.start()
        lock = GpuLock(hello["device"]["uuid"], timeout_s=lock_timeout_s)
        lock.acquire()
    except BaseException:
        client.close()
        raise
    device.use(device.from_description(hello["device"]))  # what launch expressions read from now on
    return OpenWorker(client, Fingerprint.from_hello(hello), lock)


@dataclass
class GateRuntime:
    timeout_s: float = DEFAULT_TIMEOUT_S
    default_arch: str = DEFAULT_ARCH
    require_gpu: bool = False
    options: GateOptions = field(default_factory=GateOptions)
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    keep_outputs: Path | None = None
    allow_unsigned: bool = False
    trust_root: TrustRoot | None = None  # from `cudagate gate --trusted-ref`: keys and sequences of the base
    trust: dict[str, str] = field(default_factory=dict)  # suite path -> signature status, for reports
    root: Path = Path(".")  # the project (pytest's rootdir): the release ref is read from its repository
    release_ref: str | None = None  # --cuda-gate-release=REF; None: the newest tag matching release_tags
    release_tags: str = DEFAULT_RELEASE_TAGS
    include: tuple[Path, ...] = ()  # where suites' kernels find shared headers (GateConfig.include)
    outcomes: list[CaseOutcome] = field(default_factory=list)
    selection: dict = field(default_factory=dict)  # --cuda-gate-class: the classes run and the cases left out
    skipped: list[tuple[str, str, str, str]] = field(default_factory=list)
    compiles: list[BuildFacts] = field(default_factory=list)  # each compile item's builds, for reports
    tested: Counter = field(default_factory=Counter)  # pytest's outcome category -> cudagate items, as it counts them
    fingerprint: Fingerprint | None = None  # the worker's hardware, once one started
    spawned: Worker | None = None  # the process the plugin started at configure, until client() opens it
    _worker: OpenWorker | None = None
    _gate: Gate | None = None
    _unavailable: str | None = None
    _output_dir: Path | None = None
    _ledgers: dict[Path, Ledger | CudagateError] = field(default_factory=dict)
    _distrust: dict[str, list[str]] = field(default_factory=dict)
    _distrust_shown: dict[str, str] = field(default_factory=dict)  # suite path -> the item that listed why
    _release: ReleaseSource | None = None
    _closed: bool = False  # the run is over (close_worker): no worker starts again
    _starting: threading.Lock = field(default_factory=threading.Lock)  # the start may run in a thread

    def client(self) -> Worker | None:
        """The worker, or None with :attr:`unavailable_reason` set when there is no GPU."""
        with self._starting:
            if self._worker is None and self._unavailable is None and not self._closed:
                spawned, self.spawned = self.spawned, None
                try:  # held for the whole run: the GPU's lock with it
                    self._worker = open_worker(timeout_s=self.timeout_s, lock_timeout_s=self.lock_timeout_s,
                                               spawned=spawned)
                    self.fingerprint = self._worker.fingerprint
                except WorkerUnavailable as exc:
                    self._unavailable = str(exc)
        return self._worker.client if self._worker is not None else None

    @property
    def fingerprint_text(self) -> str | None:
        return f"{self.fingerprint.key()}: {self.fingerprint.describe()}" if self.fingerprint is not None else None

    @property
    def unavailable_reason(self) -> str | None:
        self.client()
        return self._unavailable

    def gate(self) -> Gate:
        if self._gate is None:
            self.client()
            self._gate = Gate(self._worker.client, self._worker.fingerprint, self.options, self.output_dir,
                              keep_outputs=self.keep_outputs is not None,
                              release=self.release())
        return self._gate

    def prefetch(self, upcoming: list[tuple[Suite, Case]]) -> None:
        """Hand the gate the case items about to run (this one first) to prepare their fresh inputs
        ahead: once a worker runs, and for suites already trusted (a Python reference may run)."""
        if self._worker is not None and not self._closed:
            self.gate().ahead.prefetch([(suite, case) for suite, case in upcoming if not self.trust_problems(suite)])

    def expect(self, upcoming: tuple[Suite, Program, Case] | None) -> None:
        """Name the case item after the one about to run to the gate (None: none), where its suite is
        trusted and its ledger reads, so that its run may be sent while this one is judged."""
        if self._worker is None or self._closed:
            return
        if upcoming is not None:
            suite, program, case = upcoming
            if self.trust_problems(suite):
                upcoming = None
            else:
                upcoming = (suite, program, case, self.ledger(suite))
        self.gate().ahead.expect(upcoming)

    def release(self) -> ReleaseSource | None:
        """Release mode's reference, resolved once per session (None outside release mode)."""
        if self._release is None and self.options.release:
            from pytest_cudagate.trust.release import ReleaseSource

            self._release = ReleaseSource(self.root, self.release_ref, self.release_tags,
                                          release_verifier(self.trust_root, self.allow_unsigned))
        return self._release

    def trust_problems(self, suite: Suite) -> list[str]:
        """Why the suite's oracle or approvals cannot be trusted ([] when they can), checked once."""
        key = str(suite.path)
        if key not in self._distrust:
            try:
                ledger = self.ledger(suite)  # read once: the ledger verified is the ledger the gate uses
            except CudagateError as exc:
                ledger = exc
            with phases.run_phase("trust"):
                self._distrust[key] = gate_problems(suite, None, None, allow_unsigned=self.allow_unsigned,
                                                    trust_root=self.trust_root, ledger=ledger)
            self.trust[key] = ("not checked (--cuda-gate-allow-unsigned)" if self.allow_unsigned else
                               "verified" if not self._distrust[key] else "NOT TRUSTED: " + self._distrust[key][0])
        return self._distrust[key]

    def trust_refusal(self, suite: Suite, nodeid: str, refuses: str) -> str | None:
        """Item ``nodeid``'s failure when ``suite`` is not trusted (None when it is): the problems in full
        for the suite's first such item of the session, then one line per item naming that one, so
        that the same block is not repeated for every case."""
        problems = self.trust_problems(suite)
        if not problems:
            return None
        key = str(suite.path)
        head = f"the gate refuses to {refuses}: its oracle or approvals are not trusted"
        if key in self._distrust_shown:
            return f"{head} (why: listed once, under {self._distrust_shown[key]})"
        self._distrust_shown[key] = nodeid
        return head + "\n" + "\n".join(f"  - {p}" for p in problems)

    def ledger(self, suite: Suite) -> Ledger:
        """The suite's ledger, read once per session (an unreadable one raises the same error each time)."""
        if suite.path not in self._ledgers:
            try:
                with phases.run_phase("trust"):
                    self._ledgers[suite.path] = Ledger.for_suite(suite)
            except CudagateError as exc:
                self._ledgers[suite.path] = exc
        found = self._ledgers[suite.path]
        if isinstance(found, CudagateError):
            raise found
        return found

    def arch(self) -> str:
        client = self.client()
        return client.device["arch"] if client else self.default_arch

    @property
    def output_dir(self) -> Path:
        if self._output_dir is None:
            self._output_dir = self.keep_outputs or Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-",
                                                                          dir=scratch_dir()))
        return self._output_dir

    def close_worker(self) -> None:
        """End the worker and release its GPU once the items are done (the reports need neither), or
        the process spawned early where no item asked for it; waits for a start still in progress.
        Later :meth:`client` calls start none."""
        if self._gate is not None:
            self._gate.ahead.settle()  # a run sent ahead for an item that did not come: the link is its until answered
        with self._starting:
            self._closed = True
            worker, self._worker = self._worker, None
            spawned, self.spawned = self.spawned, None
        try:
            if spawned is not None:
                spawned.close()
        finally:
            if worker is not None:
                worker.close()

    def close(self) -> None:
        # First: what the gate prepares ahead is written under the output folder, which stays while a
        # job still runs there (a sweep of a later run deletes it: paths.sweep_stale).
        settled = self._gate.ahead.close() if self._gate is not None else True
        self.close_worker()
        if self._output_dir is not None and self.keep_outputs is None and settled:
            trash.discard(self._output_dir)
