"""The gate's one link to its worker: one request at a time (it is not thread-safe), and a run sent
ahead holds it until it is answered."""

from __future__ import annotations

import threading

from pytest_cudagate.worker.client import Worker


class Link:
    def __init__(self, client: Worker):
        self.client = client  # as is: for the thread that holds the link, and for what needs no request
        self._holder: threading.Thread | None = None

    def hold(self, thread: threading.Thread) -> None:
        """``thread`` sends a run ahead: every other user of the link waits for its answer."""
        self._holder = thread

    def settle(self) -> None:
        """Wait for the answer to a run sent ahead, if one is on its way."""
        holder = self._holder
        if holder is not None:
            if holder is threading.current_thread():
                raise RuntimeError("the thread sending a case ahead asked for the worker link it is about to use")
            holder.join()

    def free(self) -> Worker:
        """The worker, once no run sent ahead holds it."""
        self.settle()
        return self.client
