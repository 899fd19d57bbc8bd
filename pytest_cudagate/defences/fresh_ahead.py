"""Fresh input sets prepared ahead: while the worker runs one case item, one background thread
prepares the fresh sets of the next (``Gate.prefetch``), so an item no longer draws them while the
GPU waits.

A job is the host work the item itself would do first (``Gate._draw``: a generated case's arrays
rebuilt where its reference is Python, then
:func:`~pytest_cudagate.defences.fresh_inputs.prepare` with the item's own arguments), so the sets
are the ones it would have drawn, bit for bit. Only what needs no worker runs here: a CUDA reference
runs in the item's own turn, through the one worker link (which is not thread-safe; and a reference
launch among another case's timed launches would disturb them). What fails here is raised again in
the item that takes the job, where the same failure would have been raised. At most :data:`HELD`
jobs are held (the 2048³ case's sets are ~100 MB each); one no item asks for any more is dropped,
unless it is claimed (:meth:`Ahead.claim`: the thread that sends a case's run waits for its job),
and :meth:`Ahead.close` drops those not started and waits for the one running. One key never has two
jobs: they would write the same folder.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from pytest_cudagate.host.cpu import yield_cpu

HELD = 2  # the item about to run and the next one
CLOSE_WAIT_S = 30.0  # a job is one case's host work; past this, the session ends without it


@dataclass(eq=False)
class Job:
    work: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    value: object = None
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.work()
        except BaseException as exc:  # noqa: BLE001 - raised again where the job is taken
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> object:
        """The job's value once it is done, or its failure raised again here."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class Dropped(Exception):
    """A claimed job that never ran: the session closed first."""


class Ahead:
    """Jobs by key, run one at a time in a daemon thread, in the order asked for."""

    def __init__(self):
        self._lock = threading.Condition()
        self._jobs: dict[Hashable, Job] = {}  # held: queued, running or done, not yet taken
        self._queue: collections.deque[tuple[Hashable, Job]] = collections.deque()
        self._running: tuple[Hashable, Job] | None = None  # held or dropped
        self._claimed: dict[Hashable, Job] = {}  # taken by a waiter, run by the thread all the same
        self._thread: threading.Thread | None = None
        self._closed = False

    def want(self, jobs: list[tuple[Hashable, Callable[[], object]]]) -> None:
        """Hold a job for each of the first :data:`HELD` keys (new ones queued in this order) and
        drop the rest: a case no item will take any more never holds up the next."""
        wanted = dict(jobs[:HELD])
        with self._lock:
            if self._closed:
                return
            for key in [k for k in self._jobs if k not in wanted]:
                del self._jobs[key]
            self._queue = collections.deque((k, j) for k, j in self._queue
                                            if k in wanted or self._claimed.get(k) is j)
            for key, work in wanted.items():
                if key not in self._jobs:
                    self._jobs[key] = self._job(key, work)
            if self._queue and self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="cudagate-fresh-ahead", daemon=True)
                self._thread.start()
            self._lock.notify()

    def claim(self, key: Hashable) -> Job | None:
        """The job for ``key`` (None when none is held or running), no longer held, so that a later
        :meth:`want` cannot drop it, yet left to the thread to run: for a waiter off the main
        thread, which then waits on :meth:`Job.result` (:class:`Dropped` if the session closes first)."""
        with self._lock:
            job = self._jobs.pop(key, None)
            if job is None and self._running is not None and self._running[0] == key:
                job = self._running[1]
            if job is not None and not job.done.is_set():
                self._claimed[key] = job
        return job

    def take(self, key: Hashable) -> Job | None:
        """The job for ``key`` (None when none is held or running), run here at once if it has not
        started."""
        with self._lock:
            job = self._jobs.pop(key, None)
            if job is None and self._running is not None and self._running[0] == key:
                job = self._running[1]  # dropped, yet still writing the key's folder
            queued = (key, job) in self._queue
            if queued:
                self._queue.remove((key, job))
        if queued:
            job.run()
        return job

    def close(self) -> bool:
        """Drop every job not started and wait (at most :data:`CLOSE_WAIT_S`) for the one running;
        False when it is still running (it may still write: its folder must stay)."""
        with self._lock:
            self._closed = True
            for key, job in self._claimed.items():
                if (key, job) in self._queue:
                    job.error = Dropped(f"the session closed before the job for {key!r} ran")
                    job.done.set()
            self._claimed.clear()
            self._queue.clear()
            self._jobs.clear()
            thread = self._thread
            self._lock.notify()
        if thread is not None:
            thread.join(CLOSE_WAIT_S)
            return not thread.is_alive()
        return True

    def _job(self, key: Hashable, work: Callable[[], object]) -> Job:
        """The running job for ``key`` where one is (dropped, then asked for again), else a new one queued."""
        if self._running is not None and self._running[0] == key:
            return self._running[1]
        if key in self._claimed:  # queued or running for its waiter already
            return self._claimed[key]
        job = Job(work)
        self._queue.append((key, job))
        return job

    def _drain(self) -> None:
        yield_cpu()  # the worker's launches come first where the host is short of cores
        while True:
            with self._lock:
                self._running = None
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    self._thread = None
                    return
                self._running = self._queue.popleft()
            key, job = self._running
            job.run()
            with self._lock:
                if self._claimed.get(key) is job:
                    del self._claimed[key]
