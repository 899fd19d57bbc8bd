"""The settings of one gate run (:class:`GateOptions`), checked once where they are read."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_cudagate.config import DEFAULT_BUDGET_S


@dataclass(frozen=True)
class GateOptions:
    strict: bool = False  # inconclusive and unstable fail
    release: bool = False  # also judge against the previous release; regressed against stored runs and incomparable fail
    budget_s: float = DEFAULT_BUDGET_S  # measurement time per case
    threshold: float | None = None  # overrides the suite's
    fresh_seed: int | None = None  # seed of the fresh inputs; default $CUDAGATE_FRESH_SEED, else random per run
    trusted: bool = False  # under a trust root (cudagate gate --trusted-ref): a sanitizer without a verdict fails
    processes: int = 1  # gate processes sharing this host's cores (xdist workers): each prepares ahead with its share
