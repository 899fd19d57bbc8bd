"""One gate run's shared state: the harness worker (started lazily, once, under the GPU's lock),
the hardware fingerprint, the compile target, ledgers, the output folder, and every outcome."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudagate.approvals import Ledger
from pytest_cudagate.config import DEFAULT_ARCH, DEFAULT_LOCK_TIMEOUT_S, DEFAULT_RELEASE_TAGS, DEFAULT_TIMEOUT_S
from pytest_cudagate.worker.client import HarnessClient, WorkerUnavailable
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.worker.gpulock import GpuLock
from pytest_cudagate.release import ReleaseSource
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust import gate_problems
from pytest_cudagate.trust.ledger import release_verifier
from pytest_cudagate.trust.base_ref import TrustRoot

def xdist_device_env() -> dict[str, str]:
    """Under pytest-xdist, pin worker gwN to GPU N modulo the GPU count (one card per worker).

    Respects a CUDA_VISIBLE_DEVICES the user set. The count comes from NVML, so the parent process
    never creates a CUDA context of its own.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or "CUDA_VISIBLE_DEVICES" in os.environ:
        return {}
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVML: leave the choice to CUDA; the GPU lock still serialises timing
        return {}
    return {"CUDA_VISIBLE_DEVICES": str(int(worker[2:]) % max(count, 1))} if count else {}


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
    outcomes: list[CaseOutcome] = field(default_factory=list)
    skipped: list[tuple[str, str, str, str]] = field(default_factory=list)
    _client: HarnessClient | None = None
    _gate: Gate | None = None
    _lock: GpuLock | None = None
    _unavailable: str | None = None
    _output_dir: Path | None = None
    _ledgers: dict[Path, Ledger] = field(default_factory=dict)
    _distrust: dict[str, list[str]] = field(default_factory=dict)
    _release: ReleaseSource | None = None

    def client(self) -> HarnessClient | None:
        """The worker client, or None with :attr:`unavailable_reason` set when there is no GPU."""
        if self._client is None and self._unavailable is None:
            client = HarnessClient(timeout_s=self.timeout_s, env=xdist_device_env())
            try:
                hello = client.start()
            except WorkerUnavailable as exc:
                self._unavailable = str(exc)
                return None
            # Two gate runs must never time on one card at once: hold its lock for the whole run.
            self._lock = GpuLock(hello["device"]["uuid"], timeout_s=self.lock_timeout_s)
            self._lock.acquire()
            self._client = client
        return self._client

    @property
    def fingerprint_text(self) -> str | None:
        return self._gate.fingerprint_text if self._gate is not None else None

    @property
    def unavailable_reason(self) -> str | None:
        self.client()
        return self._unavailable

    def gate(self) -> Gate:
        if self._gate is None:
            fingerprint = Fingerprint.from_hello(self.client().hello)
            self._gate = Gate(self._client, fingerprint, self.options, self.output_dir, release=self.release())
        return self._gate

    def release(self) -> ReleaseSource | None:
        """Release mode's reference, resolved once per session (None outside release mode)."""
        if self._release is None and self.options.release:
            self._release = ReleaseSource(self.root, self.release_ref, self.release_tags,
                                          release_verifier(self.trust_root, self.allow_unsigned))
        return self._release

    def trust_problems(self, suite: Suite) -> list[str]:
        """Why the suite's oracle or approvals cannot be trusted ([] when they can), checked once."""
        key = str(suite.path)
        if key not in self._distrust:
            self._distrust[key] = gate_problems(suite, None, None, allow_unsigned=self.allow_unsigned,
                                                trust_root=self.trust_root)
            self.trust[key] = ("not checked (--cuda-gate-allow-unsigned)" if self.allow_unsigned else
                               "verified" if not self._distrust[key] else "NOT TRUSTED: " + self._distrust[key][0])
        return self._distrust[key]

    def ledger(self, suite: Suite) -> Ledger:
        if suite.path not in self._ledgers:
            self._ledgers[suite.path] = Ledger.for_suite(suite)
        return self._ledgers[suite.path]

    def arch(self) -> str:
        client = self.client()
        return client.device["arch"] if client else self.default_arch

    @property
    def output_dir(self) -> Path:
        if self._output_dir is None:
            self._output_dir = self.keep_outputs or Path(tempfile.mkdtemp(prefix="cudagate-run-"))
        return self._output_dir

    def close(self) -> None:
        if self._client is not None:
            self._client.__exit__(None, None, None)
            self._client = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._output_dir is not None and self.keep_outputs is None:
            shutil.rmtree(self._output_dir, ignore_errors=True)
