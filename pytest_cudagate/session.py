"""Where a worker is started (:func:`open_worker`: client, GPU lock, fingerprint), and two parts of
a gate run that :class:`~pytest_cudagate.items.GateSession` owns: its worker (:class:`RunWorker`,
started lazily, once) and its suites' trust and ledgers (:class:`SuiteTrust`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagate import extensions, phases
from pytest_cudagate.config import DEFAULT_LOCK_TIMEOUT_S, DEFAULT_TIMEOUT_S
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.suite import device
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust import gate_problems
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.worker.client import HarnessClient, Worker, WorkerUnavailable
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.worker.gpulock import GpuLock
from pytest_cudagate.worker.spawn import xdist_device_env

if TYPE_CHECKING:  # `cudagate gate --trusted-ref` only
    from pytest_cudagate.trust.base_ref import TrustRoot


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
                spawned: Worker | None = None, env: dict[str, str] | None = None) -> OpenWorker:
    """Start a worker (under pytest-xdist on gwN's GPU) and hold its GPU's lock while it runs: two
    gate runs, approvals or optimizations never time on one card at once.

    The one place a worker is started, for the pytest session, ``cudagate run``, ``cases generate``,
    ``approve`` and ``optimize``. ``spawned``: a process the pytest session started early
    (:mod:`pytest_cudagate.worker.spawn`), taken over here (closed on failure like one started here);
    ``env``: what a worker started here is told beside its GPU (the gate run's library adapters).
    Raises :class:`WorkerUnavailable` without a usable GPU and
    :class:`~pytest_cudagate.errors.GpuLockTimeout` when the card stays busy.
    """
    # Without the gate run's adapters the worker is told none: an inherited $CUDAGATE_LIBRARY_ADAPTERS
    # never makes it import a module.
    client = spawned if spawned is not None else HarnessClient(
        timeout_s=timeout_s, env={**xdist_device_env(), **extensions.worker_env({}), **(env or {})})
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


class RunWorker:
    """A run's worker, opened once and lazily (in a thread while pytest collects): the process the
    plugin spawned at configure, taken over; or, without a usable GPU, the reason there is none."""

    def __init__(self, *, timeout_s: float, lock_timeout_s: float, spawned: Worker | None = None,
                 env: dict[str, str] | None = None):
        self.timeout_s = timeout_s
        self.env = env
        self.lock_timeout_s = lock_timeout_s
        self.spawned = spawned  # the process the plugin started at configure, until open() takes it
        self.opened: OpenWorker | None = None
        self.unavailable: str | None = None
        self._closed = False  # the run is over (close): no worker starts again
        self._starting = threading.Lock()  # the start may run in a thread

    def open(self) -> OpenWorker | None:
        """The worker, or None with :attr:`unavailable` set when there is no GPU."""
        with self._starting:
            if self.opened is None and self.unavailable is None and not self._closed:
                spawned, self.spawned = self.spawned, None
                try:  # held for the whole run: the GPU's lock with it
                    self.opened = open_worker(timeout_s=self.timeout_s, lock_timeout_s=self.lock_timeout_s,
                                              spawned=spawned, env=self.env)
                except WorkerUnavailable as exc:
                    self.unavailable = str(exc)
        return self.opened

    def close(self) -> None:
        """End the worker and release its GPU, or the process spawned early where none was opened;
        waits for a start still in progress. Later :meth:`open` calls start none."""
        with self._starting:
            self._closed = True
            worker, self.opened = self.opened, None
            spawned, self.spawned = self.spawned, None
        try:
            if spawned is not None:
                spawned.close()
        finally:
            if worker is not None:
                worker.close()


class SuiteTrust:
    """Whether each suite's oracle and approvals can be trusted, and its ledger: each read and checked
    once per run, so the ledger verified is the ledger the gate judges with."""

    def __init__(self, *, allow_unsigned: bool = False, trust_root: TrustRoot | None = None):
        self.allow_unsigned = allow_unsigned
        self.trust_root = trust_root  # from `cudagate gate --trusted-ref`: keys and sequences of the base
        self.status: dict[str, str] = {}  # suite path -> signature status, for reports
        self._ledgers: dict[Path, Ledger | CudagateError] = {}
        self._problems: dict[str, list[str]] = {}
        self._shown: dict[str, str] = {}  # suite path -> the item that listed why

    def problems(self, suite: Suite) -> list[str]:
        """Why the suite's oracle or approvals cannot be trusted ([] when they can), checked once."""
        key = str(suite.path)
        if key not in self._problems:
            try:
                ledger = self.ledger(suite)  # read once: the ledger verified is the ledger the gate uses
            except CudagateError as exc:
                ledger = exc
            with phases.run_phase("trust"):
                self._problems[key] = gate_problems(suite, None, None, allow_unsigned=self.allow_unsigned,
                                                    trust_root=self.trust_root, ledger=ledger)
            self.status[key] = ("not checked (--cuda-gate-allow-unsigned)" if self.allow_unsigned else
                                "verified" if not self._problems[key] else "NOT TRUSTED: " + self._problems[key][0])
        return self._problems[key]

    def refusal(self, suite: Suite, nodeid: str, refuses: str) -> str | None:
        """Item ``nodeid``'s failure when ``suite`` is not trusted (None when it is): the problems in full
        for the suite's first such item of the session, then one line per item naming that one, so
        that the same block is not repeated for every case."""
        problems = self.problems(suite)
        if not problems:
            return None
        key = str(suite.path)
        head = f"the gate refuses to {refuses}: its oracle or approvals are not trusted"
        if key in self._shown:
            return f"{head} (why: listed once, under {self._shown[key]})"
        self._shown[key] = nodeid
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
