"""Proposers: where candidates come from. A small interface, three implementations.

- ``openai``: a model behind any OpenAI-compatible endpoint (``--base-url``: OpenAI, vLLM, Ollama),
  structured output under a strict JSON schema, optional tool calls into local notes.
- ``autotune``: no model; searches the ``tunables`` (-D constants) a suite declares for a kernel.
- ``replay:DIR``: recorded proposals (a folder of proposal files, or an audit pack's history.json),
  for tests and audits.

A proposer sees only what :class:`RoundContext` carries: the suite's signature and tolerances, the
visible cases (never a holdout case, expected output or key), the sources and launches it or the
suite wrote, and the evidence of earlier attempts as :mod:`..prompt` redacts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pytest_cudagate.optimize.candidate import Candidate


class ProposerExhausted(Exception):
    """Nothing left to propose (a replay ran out, the tunable space is searched)."""


class ProposalError(Exception):
    """An answer that could not be used (malformed, refused, off-schema); counted as a repair."""

    def __init__(self, reason: str, raw: str | None = None):
        self.reason = reason
        self.raw = raw
        super().__init__(reason)


class ModelError(Exception):
    """The endpoint failed in a way retrying does not fix (auth, bad request, retries spent)."""


@dataclass
class RoundContext:
    round: int
    max_rounds: int
    initial: object  # loop.Attempt of round 0
    best: object  # loop.Attempt: the fastest passing attempt so far
    history: list = field(default_factory=list)  # every loop.Attempt so far, round 0 included
    problem: str | None = None  # why the previous answer of this round was unusable (a repair request)
    repairs: int = 0


class Proposer(Protocol):
    name: str
    supports_repair: bool  # whether a compile error goes back to it within the round

    def propose(self, context: RoundContext) -> list[Candidate]:
        """This round's candidates (one, or a batch); raises the exceptions above."""

    def close(self) -> None:
        """Release connections."""

    # Optional: ``compose(history) -> Candidate | None``, asked once after the rounds for a candidate
    # built from what was measured (autotune: one source with per-class variants); see loop._compose.
