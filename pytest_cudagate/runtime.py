"""One gate run's shared state: the harness worker (started lazily, once), the compile target,
the output folder, and every verdict, for the terminal summary and the reports."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .client import HarnessClient, WorkerUnavailable

DEFAULT_ARCH = "sm_90"


@dataclass
class ItemRecord:
    suite: str
    kernel: str
    case: str
    kind: str
    outcome: str  # passed / failed / skipped
    median_ms: float | None = None
    rel_norm: float | None = None
    detail: str = ""


@dataclass
class GateRuntime:
    timeout_s: float = 60.0
    default_arch: str = DEFAULT_ARCH
    require_gpu: bool = False
    records: list[ItemRecord] = field(default_factory=list)
    _client: HarnessClient | None = None
    _unavailable: str | None = None
    _output_dir: Path | None = None

    def client(self) -> HarnessClient | None:
        """The worker client, or None with :attr:`unavailable_reason` set when there is no GPU."""
        if self._client is None and self._unavailable is None:
            client = HarnessClient(timeout_s=self.timeout_s)
            try:
                client.start()
                self._client = client
            except WorkerUnavailable as exc:
                self._unavailable = str(exc)
        return self._client

    @property
    def unavailable_reason(self) -> str | None:
        self.client()
        return self._unavailable

    def arch(self) -> str:
        client = self.client()
        return client.device["arch"] if client else self.default_arch

    @property
    def output_dir(self) -> Path:
        if self._output_dir is None:
            self._output_dir = Path(tempfile.mkdtemp(prefix="cudagate-run-"))
        return self._output_dir

    def close(self) -> None:
        if self._client is not None:
            self._client.__exit__(None, None, None)
            self._client = None
