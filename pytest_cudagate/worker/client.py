"""The harness client: runs requests in a worker subprocess and survives whatever a kernel does.

A kernel that faults (illegal address poisons the CUDA context), hangs, or kills its process costs
exactly its own case: the client records the reason, starts a fresh worker and resubmits the cases
not yet answered. Nothing already answered is lost.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pytest_cudagate.config import DEFAULT_TIMEOUT_S
from pytest_cudagate.errors import WorkerUnavailable
from pytest_cudagate.host.scrub import Scrubber


@dataclass
class RunResult:
    compile: dict
    cases: dict[str, dict] = field(default_factory=dict)
    restarts: int = 0


@dataclass
class CompareResult:
    """A ``compare`` conversation: compile lines by role, the chunks seen, the final case body."""

    compile: dict[str, dict] = field(default_factory=dict)
    chunks: list[dict] = field(default_factory=list)
    body: dict | None = None


WORKER_COMMAND = (sys.executable, "-m", "cudagate_harness.worker")


def reply_body(line: dict) -> dict:
    """A worker's line without the protocol's envelope (its type and request id)."""
    return {k: v for k, v in line.items() if k not in ("type", "id")}


class Worker(Protocol):
    """What the gate, the session and the optimizer use of a worker link: :class:`HarnessClient`,
    or a test's fake worker."""

    timeout_s: float
    env: dict | None
    hello: dict | None
    start_seconds: float  # wall time spent starting workers, which a case's round trip does not count

    @property
    def device(self) -> dict: ...

    def spawn(self) -> None: ...  # begin the start without waiting; start() completes it

    def start(self) -> dict: ...

    def run(self, request: dict) -> RunResult: ...

    def compare(self, request: dict, decide: Callable[[dict], int]) -> CompareResult: ...

    def close(self) -> None: ...


class HarnessClient:
    """A :class:`Worker` over a subprocess speaking the JSON-lines protocol of
    ``cudagate_harness.protocol`` (``command``: the real worker unless a test swaps in a stub)."""

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, env: dict | None = None,
                 command: Sequence[str] = WORKER_COMMAND):
        self.timeout_s = timeout_s
        self.env = {**os.environ, **(env or {})}
        self.command = list(command)
        self.proc: subprocess.Popen | None = None
        self.hello: dict | None = None
        self.restarts = 0
        self.start_seconds = 0.0  # wall time spent starting workers (first start and restarts)
        self._lines: queue.Queue = queue.Queue()
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._ids = 0
        self._spawned = False  # a process started by spawn() whose hello start() has not read yet

    # -- lifecycle ----------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the worker process without waiting for it: its CUDA start runs while the caller
        works, until :meth:`start` reads its hello. Raises OSError when the process cannot start."""
        started = time.perf_counter()
        try:
            self._spawn()
            self._spawned = True
        finally:
            self.start_seconds += time.perf_counter() - started

    def start(self) -> dict:
        """Start a worker, or take over the process :meth:`spawn` started, and return its hello
        (device description); raise if there is no GPU."""
        started = time.perf_counter()
        try:
            if not self._spawned:
                self._spawn()
            self._spawned = False
            return self._handshake()
        finally:
            self.start_seconds += time.perf_counter() - started

    def _spawn(self) -> None:
        self._stop()
        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env=self.env, start_new_session=True,  # its own process group, so a kill takes children too
            # `python -m` puts the working folder first on sys.path: started in a pull request's checkout,
            # a numpy.py or cudagate_harness/ there would run as the worker. Requests carry absolute paths.
            cwd="/",
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self._lines), daemon=True).start()

    def _handshake(self) -> dict:
        hello = self._next(self.timeout_s)
        if hello is None or hello.get("type") != "hello":
            reason = "did not start" if hello is None else f"said {hello!r}"
            self._stop()
            raise WorkerUnavailable(f"the harness worker {reason}: {self.stderr_tail()}")
        if not hello.get("ok"):
            self._stop()
            raise WorkerUnavailable(hello.get("error", "no CUDA device"))
        self.hello = hello
        return hello

    @property
    def device(self) -> dict:
        return (self.hello or {}).get("device", {})

    def close(self) -> None:
        """End the worker for good (it reads end of input and exits, or is killed)."""
        self._stop()
        self._stderr.close()

    def _stop(self) -> None:
        self._spawned = False
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.stdin.close()
                    self.proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    self._kill()
            self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stderr_tail(self, limit: int = 2000) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace")
        return text[-limit:].strip()

    # -- requests ---------------------------------------------------------------------------------
    def run(self, request: dict) -> RunResult:
        """Send ``request``; return its compile line and one body per case, whatever happens."""
        pending = list(request.get("cases", []))
        result = RunResult(compile={})

        def compiled(line: dict) -> None:
            # The log quotes kernel text: scrub it before any report prints or stores it.
            result.compile = Scrubber().data(reply_body(line))

        def answered(line: dict) -> None:
            nonlocal pending
            result.cases[line["case"]] = reply_body(line)
            pending = [c for c in pending if c["name"] not in result.cases]

        while True:
            if self.proc is None or self.proc.poll() is not None:
                self._restart()
            self._ids += 1
            try:
                # timeout_s: the worker's compiles stop in time to say so before this watchdog ends it
                self._send({**request, "id": self._ids, "cases": pending, "timeout_s": self.timeout_s})
            except OSError:
                self._restart()
                continue
            if self._replies({"compile": compiled, "case": answered}):
                if not result.compile.get("ok", False):
                    break
            else:  # silence past the watchdog, or the worker died: the case it was on is lost
                reason = self._silenced()
                if not pending:
                    result.compile = result.compile or {"ok": False, "log": reason["message"]}
                    break
                answered({"case": pending[0]["name"], "status": "error", "error": reason})
            if not pending:  # else the rest goes to a fresh worker
                break
        result.restarts = self.restarts
        return result

    def compare(self, request: dict, decide: Callable[[dict], int]) -> CompareResult:
        """Run a ``compare`` request; ``decide(chunk)`` returns the next chunk's rounds (0 stops).

        A hang or crash ends the conversation with an error body for the case, as in :meth:`run`.
        """
        if self.proc is None or self.proc.poll() is not None:
            self._restart()
        self._ids += 1
        result = CompareResult()
        case = request["case"]["name"]

        def compiled(line: dict) -> None:
            result.compile[line.get("role", "current")] = reply_body(line)

        def chunk(line: dict) -> None:
            result.chunks.append(line)
            rounds = decide(line)
            self._send({"op": "more", "rounds": rounds} if rounds > 0 else {"op": "stop"})

        def answered(line: dict) -> None:
            result.body = reply_body(line)

        try:
            self._send({**request, "id": self._ids, "timeout_s": self.timeout_s})
            if not self._replies({"compile": compiled, "chunk": chunk, "case": answered}):
                result.body = {"case": case, "status": "error", "error": self._silenced()}
        except OSError:  # the worker's stdin closed under us: it died
            self._reap()
            result.body = {"case": case, "status": "error", "error": self._death_reason(True)}
        return result

    def _replies(self, handlers: dict[str, Callable[[dict], None]]) -> bool:
        """The one reading of a request's answer: each line to the handler of its type, until the
        done line (True) or silence past the watchdog or the worker's end (False). A worker that
        answered its last case with a sticky fault is exiting: it is let go at the done line, so the
        next request starts a fresh one."""
        faulted = False
        while True:
            line = self._next(self.timeout_s)
            if line is None:
                return False
            kind = line.get("type")
            if kind == "error":
                raise RuntimeError(f"harness worker rejected the request: {line.get('message')}")
            if kind == "done":
                if faulted:
                    self._reap()
                return True
            if kind == "case":
                faulted = line.get("error", {}).get("kind") == "fault"
            if kind in handlers:
                handlers[kind](line)

    def _silenced(self) -> dict:
        """Why the worker stopped answering; killed first if it is still running."""
        exited = self.proc.poll() is not None
        if not exited:
            self._kill()
        return self._death_reason(exited)

    # -- internals -------------------------------------------------------------------------------
    def _send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def _restart(self) -> None:
        self.restarts += 1
        self.start()

    def _death_reason(self, exited: bool) -> dict:
        if not exited:
            return {"kind": "timeout", "code": "TIMEOUT",
                    "message": f"no answer within {self.timeout_s:g} s (the kernel hung or ran too long); the worker was killed"}
        code = self.proc.returncode
        detail = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return {"kind": "crash", "code": "WORKER_DIED",
                "message": f"the harness worker died ({detail}): {self.stderr_tail(800) or 'no output'}"}

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _next(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self._lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if self.proc is not None and self.proc.poll() is not None and self._lines.empty():
                    return None
                continue
            if line is None:  # end of stream: the worker is exiting
                self._reap()
                return None
            return line

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for raw in proc.stdout:
            try:
                lines.put(json.loads(raw))
            except ValueError:
                continue  # the worker writes only JSON on this channel; anything else is noise
        lines.put(None)

