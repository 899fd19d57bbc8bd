"""Fresh input sets prepared ahead: while the worker runs one case item, background threads prepare
the fresh sets of the next ones (``Gate.prefetch``), so an item no longer draws them while the GPU
waits. A host of many cores prepares several cases at once (:func:`workers`): a case's reference and
its dtype casts are numpy work that leaves the GIL, and one thread could not keep up with a GPU that
runs a large case in a fraction of the time its sets take to draw.

A job is the host work the item itself would do first (``Gate._draw``: a generated case's arrays
rebuilt where its reference is Python, then
:func:`~pytest_cudagate.defences.fresh_inputs.prepare` with the item's own arguments), so the sets
are the ones it would have drawn, bit for bit, whichever thread draws them (each set has its own
seeded generator). Only what needs no worker runs here: a CUDA reference runs in the item's own
turn, through the one worker link (which is not thread-safe; and a reference launch among another
case's timed launches would disturb them). What fails here is raised again in the item that takes
the job, where the same failure would have been raised. Jobs are held for the item about to run
and one more item per thread, besides the one the sending thread claimed (:meth:`Ahead.claim`: it
waits for that job) and any still running once dropped (the 2048³ case's sets are ~100 MB each).
A job no item asks for any more is dropped, unless it is claimed, and :meth:`Ahead.close` drops
those not started and waits for those running. One key never has two jobs: they would write the
same folder. A Python reference may so run in several threads at once, and in the main thread
beside them: it must be a function of its arguments (docs/suite-format.md).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from pytest_cudagate.host.cpu import yield_cpu

MAX_WORKERS = 4  # past this, the main thread's own checks and the worker's launches need the cores
CLOSE_WAIT_S = 30.0  # a job is one case's host work; past this, the session ends without it


def workers(cores: int) -> int:
    """Threads that prepare ahead on a host of ``cores``: one for every three cores beyond the two
    the main thread and the worker's host thread use, at least one and at most :data:`MAX_WORKERS`
    (a 16-core GPU runner gets 4, a 4-core one 1)."""
    return max(1, min(MAX_WORKERS, (cores - 2) // 3))


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
    """Jobs by key, run in up to ``threads`` daemon threads, started in the order asked for."""

    def __init__(self, threads: int = 1):
        self.held = threads + 1  # the item about to run and one job more per thread
        self._size = threads
        self._lock = threading.Condition()
        self._jobs: dict[Hashable, Job] = {}  # held: queued, running or done, not yet taken
        self._queue: collections.deque[tuple[Hashable, Job]] = collections.deque()
        self._running: dict[Hashable, Job] = {}  # held or dropped
        self._claimed: dict[Hashable, Job] = {}  # taken by a waiter, run by a thread all the same
        self._threads: list[threading.Thread] = []
        self._closed = False

    def want(self, jobs: list[tuple[Hashable, Callable[[], object]]]) -> None:
        """Hold a job for each of the first :attr:`held` keys (new ones queued in this order) and
        drop the rest: a case no item will take any more never holds up the next."""
        wanted = dict(jobs[:self.held])
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
            while len(self._threads) < min(self._size, len(self._queue) + len(self._running)):
                thread = threading.Thread(target=self._drain, name="cudagate-fresh-ahead", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._lock.notify_all()

    def claim(self, key: Hashable) -> Job | None:
        """The job for ``key`` (None when none is held or running), no longer held, so that a later
        :meth:`want` cannot drop it, yet left to the thread to run: for a waiter off the main
        thread, which then waits on :meth:`Job.result` (:class:`Dropped` if the session closes first)."""
        with self._lock:
            job = self._jobs.pop(key, None) or self._running.get(key)
            if job is not None and not job.done.is_set():
                self._claimed[key] = job
        return job

    def take(self, key: Hashable) -> Job | None:
        """The job for ``key`` (None when none is held or running), run here at once if it has not
        started."""
        with self._lock:
            job = self._jobs.pop(key, None) or self._running.get(key)  # dropped, yet still writing its folder
            queued = (key, job) in self._queue
            if queued:
                self._queue.remove((key, job))
        if queued:
            job.run()
        return job

    def close(self) -> bool:
        """Drop every job not started and wait (at most :data:`CLOSE_WAIT_S` in all) for those
        running; False when one still runs (it may still write: its folder must stay)."""
        with self._lock:
            self._closed = True
            for key, job in self._claimed.items():
                if (key, job) in self._queue:
                    job.error = Dropped(f"the session closed before the job for {key!r} ran")
                    job.done.set()
            self._claimed.clear()
            self._queue.clear()
            self._jobs.clear()
            threads = list(self._threads)
            self._lock.notify_all()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def _job(self, key: Hashable, work: Callable[[], object]) -> Job:
        """The running job for ``key`` where one is (dropped, then asked for again), else a new one queued."""
        if key in self._running:
            return self._running[key]
        if key in self._claimed:  # queued or running for its waiter already
            return self._claimed[key]
        job = Job(work)
        self._queue.append((key, job))
        return job

    def _drain(self) -> None:
        yield_cpu()  # the worker's launches come first where the host is short of cores
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    self._threads.remove(threading.current_thread())
                    return
                key, job = self._queue.popleft()
                self._running[key] = job
            job.run()
            with self._lock:
                del self._running[key]
                if self._claimed.get(key) is job:
                    del self._claimed[key]
