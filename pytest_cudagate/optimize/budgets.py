"""Hard budgets: rounds, model calls, tokens, dollars, GPU time and wall time.

Each is checked before the work it would pay for starts, so none is overrun by more than one
step's estimate error: a model call is sent only with ``max_completion_tokens`` capped to what the
token and dollar budgets still allow (the prompt is over-estimated at 3 characters a token), and
GPU work starts only while the GPU budget minus the reserve the final gate needs is unspent. The
reason the run stopped names the budget that ran out.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudagate.errors import CudagateError

# USD per million tokens: (input, cached input, output). Reasoning tokens are billed as output and
# are included in completion_tokens. Override or extend with --price-table FILE.json.
PRICES_PER_MTOK: dict[str, tuple[float, float, float]] = {
    "gpt-5": (1.25, 0.125, 10.0),
    "gpt-5-mini": (0.25, 0.025, 2.0),
    "gpt-5-nano": (0.05, 0.005, 0.40),
    "gpt-4.1": (2.0, 0.50, 8.0),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "gpt-4o": (2.50, 1.25, 10.0),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "o3": (2.0, 0.50, 8.0),
    "o4-mini": (1.10, 0.275, 4.40),
}
CHARS_PER_TOKEN_ESTIMATE = 3.0  # over-estimates the prompt (English and code run ~4 characters a token)
MIN_COMPLETION_TOKENS = 256  # below this a proposal cannot fit: the budget counts as spent

STOP_REASONS = {
    "max_iterations": "the round limit (--max-iterations) was reached",
    "max_model_calls": "the model-call budget (--max-model-calls) is spent",
    "max_tokens": "the token budget (--max-tokens) is spent",
    "budget_usd": "the dollar budget (--budget-usd) is spent",
    "max_gpu_minutes": "the GPU-time budget (--max-gpu-minutes) is spent (what is left is kept for the final gate)",
    "max_wall_minutes": "the wall-time budget (--max-wall-minutes) is spent (what is left is kept for the final gate)",
    "interrupted": "interrupted (Ctrl-C)",
    "proposer_exhausted": "the proposer has nothing left to propose",
    "model_error": "the model endpoint failed in a way retrying does not fix",
    "initial_failed": "the initial kernel does not pass its own cases, so nothing can be compared with it",
}


class BudgetExceeded(Exception):
    def __init__(self, reason: str, detail: str = ""):
        assert reason in STOP_REASONS, reason
        self.reason = reason
        self.detail = detail or STOP_REASONS[reason]
        super().__init__(self.detail)


@dataclass(frozen=True)
class Price:
    input: float  # USD per million tokens
    cached_input: float
    output: float

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        return ((prompt - cached) * self.input + cached * self.cached_input + completion * self.output) / 1e6

    def to_json(self) -> dict:
        return {"input_per_mtok": self.input, "cached_input_per_mtok": self.cached_input, "output_per_mtok": self.output}


def load_price_table(path: Path | None) -> dict[str, Price]:
    """The default table, overridden by ``path``: ``{"model": {"input": .., "cached_input": .., "output": ..}}``
    in USD per million tokens (``cached_input`` defaults to ``input``)."""
    table = {name: Price(*values) for name, values in PRICES_PER_MTOK.items()}
    if path is None:
        return table
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        for name, entry in raw.items():
            table[name] = Price(float(entry["input"]), float(entry.get("cached_input", entry["input"])),
                                float(entry["output"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CudagateError(f"{path}: not a price table ({exc}); expected "
                            '{"MODEL": {"input": USD_PER_MTOK, "cached_input": ..., "output": ...}}') from None
    return table


def price_for(model: str, table: dict[str, Price]) -> Price | None:
    """Exact name first, then the longest table name the model's name starts with (dated snapshots)."""
    if model in table:
        return table[model]
    prefixes = [name for name in table if model.startswith(name + "-")]
    return table[max(prefixes, key=len)] if prefixes else None


@dataclass
class Budgets:
    max_iterations: int = 7
    max_model_calls: int | None = 40
    max_tokens: int | None = None
    max_usd: float | None = None
    max_gpu_s: float | None = 20 * 60.0
    max_wall_s: float | None = 60 * 60.0
    max_repairs: int = 2  # per round: malformed answers, refusals and compile errors sent back
    max_tool_calls: int = 4  # per round (--nvidia-research)
    max_completion_tokens: int = 32_000  # per model call

    def to_json(self) -> dict:
        return {"max_iterations": self.max_iterations, "max_model_calls": self.max_model_calls,
                "max_tokens": self.max_tokens, "max_usd": self.max_usd, "max_gpu_s": self.max_gpu_s,
                "max_wall_s": self.max_wall_s, "max_repairs": self.max_repairs, "max_tool_calls": self.max_tool_calls,
                "max_completion_tokens": self.max_completion_tokens}


@dataclass
class Meter:
    """What the run has spent so far, checked against :class:`Budgets`."""

    budgets: Budgets
    price: Price | None = None
    clock: object = time.monotonic
    model_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    usd: float = 0.0
    gpu_s: float = 0.0
    reserve_s: float = 0.0  # GPU and wall seconds kept back for the final gate of the winner
    started: float = field(default=0.0)

    def __post_init__(self):
        self.started = self.clock()

    @property
    def wall_s(self) -> float:
        return self.clock() - self.started

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    # -- checks --------------------------------------------------------------------------------
    def check_time(self) -> None:
        b = self.budgets
        if b.max_wall_s is not None and self.wall_s >= b.max_wall_s - self.reserve_s:
            raise BudgetExceeded("max_wall_minutes", f"{self.wall_s / 60:.2f} of {b.max_wall_s / 60:g} wall minutes spent, "
                                                     f"{self.reserve_s / 60:.2f} kept for the final gate")
        if b.max_gpu_s is not None and self.gpu_s >= b.max_gpu_s - self.reserve_s:
            raise BudgetExceeded("max_gpu_minutes", f"{self.gpu_s / 60:.2f} of {b.max_gpu_s / 60:g} GPU minutes spent, "
                                                    f"{self.reserve_s / 60:.2f} kept for the final gate")

    def check_money(self) -> None:
        b = self.budgets
        if b.max_tokens is not None and self.total_tokens >= b.max_tokens:
            raise BudgetExceeded("max_tokens", f"{self.total_tokens} of {b.max_tokens} tokens spent")
        if b.max_usd is not None and self.usd >= b.max_usd:
            raise BudgetExceeded("budget_usd", f"${self.usd:.4f} of ${b.max_usd:g} spent")

    def completion_cap(self, prompt_chars: int) -> int:
        """``max_completion_tokens`` for the next call, or :class:`BudgetExceeded` if none may be sent."""
        b = self.budgets
        self.check_time()
        if b.max_model_calls is not None and self.model_calls >= b.max_model_calls:
            raise BudgetExceeded("max_model_calls", f"{self.model_calls} of {b.max_model_calls} model calls made")
        self.check_money()
        prompt = math.ceil(prompt_chars / CHARS_PER_TOKEN_ESTIMATE)
        cap = b.max_completion_tokens
        if b.max_tokens is not None:
            left = b.max_tokens - self.total_tokens - prompt
            if left < MIN_COMPLETION_TOKENS:
                raise BudgetExceeded("max_tokens", f"{self.total_tokens} of {b.max_tokens} tokens spent; the next "
                                                   f"prompt alone is ~{prompt}")
            cap = min(cap, left)
        if b.max_usd is not None and self.price is not None:
            left_usd = b.max_usd - self.usd - prompt * self.price.input / 1e6
            tokens = int(left_usd * 1e6 / self.price.output) if self.price.output > 0 else cap
            if tokens < MIN_COMPLETION_TOKENS:
                raise BudgetExceeded("budget_usd", f"${self.usd:.4f} of ${b.max_usd:g} spent; the next call could "
                                                   "not answer within the rest")
            cap = min(cap, tokens)
        return cap

    # -- spending ----------------------------------------------------------------------------------
    def add_call(self, usage: dict | None) -> float | None:
        """Count one model request (answered or not) and its usage; returns its cost (None: unknown price)."""
        self.model_calls += 1
        usage = usage or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += cached
        self.reasoning_tokens += reasoning
        if self.price is None:
            return None
        cost = self.price.cost(prompt, min(cached, prompt), completion)
        self.usd += cost
        return cost

    def add_gpu(self, seconds: float) -> None:
        self.gpu_s += max(0.0, seconds)

    def to_json(self) -> dict:
        return {"model_calls": self.model_calls, "prompt_tokens": self.prompt_tokens,
                "cached_prompt_tokens": self.cached_tokens, "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens, "total_tokens": self.total_tokens,
                "estimated_cost_usd": round(self.usd, 6) if self.price is not None else None,
                "gpu_seconds": round(self.gpu_s, 3), "wall_seconds": round(self.wall_s, 3)}
