"""``--proposer openai``: a model behind any OpenAI-compatible endpoint proposes each candidate.

One conversation per round: the system rules, then the round's context (visible cases, the initial
and best kernels, every attempt so far, the last round's evidence). The answer must be JSON of
:data:`RESPONSE_FORMAT` (structured output, ``strict``); it is parsed and checked again here, since
a local server may not enforce the schema. An unusable answer (not JSON, off-schema, refused, cut
off), and a candidate that does not compile, go back into the same conversation as a repair
request; the loop counts and bounds them. With ``--nvidia-research`` the model may call
``search_notes`` (local files only) a bounded number of times per round.

Retries: rate limits (429), timeouts, connection errors and 5xx are retried with backoff
(``Retry-After`` honoured, capped); each try is a model call against the budget and is recorded.
Other errors (401, 400, 404) end the run with stop reason ``model_error``. The API key is read
from OPENAI_API_KEY by the SDK and never leaves it: requests are recorded from the arguments this
module passes, which do not include it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from urllib.parse import urlsplit, urlunsplit

import jsonschema

from pytest_cudagate.boundary import MAX_ANSWER_BYTES, parse_json
from pytest_cudagate.errors import FileError
from pytest_cudagate.optimize.budgets import Meter
from pytest_cudagate.optimize.candidate import Candidate, CandidateError, classes_from_json, launch_from_json
from pytest_cudagate.optimize.prompt import repair_prompt, round_prompt, system_prompt
from pytest_cudagate.optimize.research import TOOL
from pytest_cudagate.optimize.proposers import ModelError, ProposalError, RoundContext

_LAUNCH_PROPERTIES = {
    "grid": {"type": "array", "items": {"type": "string"}, "description": "1 to 3 integer expressions"},
    "block": {"type": "array", "items": {"type": "string"}, "description": "1 to 3 integer expressions"},
    "shared_bytes": {"type": "string", "description": "dynamic shared memory in bytes, an expression; \"0\" if none"},
}
CANDIDATE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "idea", "source", "launch", "launch_overrides", "class_variants"],
    "properties": {
        "title": {"type": "string", "description": "a few words naming the candidate"},
        "idea": {"type": "string", "description": "one or two sentences: what changed and why it should be faster"},
        "source": {"type": "string", "description": "the complete CUDA source file"},
        "launch": {"type": "object", "additionalProperties": False, "required": ["grid", "block", "shared_bytes"],
                   "properties": _LAUNCH_PROPERTIES},
        "launch_overrides": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": False,
                      "required": ["case", "grid", "block", "shared_bytes"],
                      "properties": {"case": {"type": "string"}, **_LAUNCH_PROPERTIES}},
        },
        "class_variants": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": False,
                      "required": ["class", "options", "grid", "block", "shared_bytes"],
                      "properties": {"class": {"type": "string"},
                                     "options": {"type": "array", "items": {"type": "string"},
                                                 "description": "-DNAME=value options for this class's build"},
                                     **_LAUNCH_PROPERTIES}},
        },
    },
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "cuda_candidate", "strict": True,
                                                          "schema": CANDIDATE_SCHEMA}}
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 60.0


def public_url(url: str | None) -> str | None:
    """``url`` without user:password@, query string or fragment (a key passed as ``?api-key=`` is a
    secret too): what is recorded in summaries and reports."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def parse_answer(content: str | None) -> Candidate:
    """A candidate from the model's JSON, or :class:`ProposalError` saying what is wrong with it."""
    if not content or not content.strip():
        raise ProposalError("the answer was empty; send the JSON object", content)
    if len(content) > MAX_ANSWER_BYTES:
        raise ProposalError(f"the answer is {len(content)} characters, over {MAX_ANSWER_BYTES}; send a shorter one", content)
    try:
        data = parse_json(content, "model answer", "answer")
    except FileError as exc:
        raise ProposalError(f"{exc.problems[0]}; send only the JSON object", content) from None
    except ValueError as exc:
        raise ProposalError(f"the answer is not valid JSON ({exc}); send only the JSON object", content) from None
    errors = sorted(jsonschema.Draft202012Validator(CANDIDATE_SCHEMA).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        where = "/".join(map(str, errors[0].absolute_path)) or "(top level)"
        raise ProposalError(f"the answer does not match the schema at {where}: {errors[0].message}", content)
    try:
        launch = launch_from_json(data["launch"], "launch")
        overrides = {}
        for entry in data["launch_overrides"]:
            overrides[entry["case"]] = launch_from_json(entry, f"launch_overrides[{entry['case']}]")
        named = [v["class"] for v in data["class_variants"]]
        twice = sorted({name for name in named if named.count(name) > 1})
        if twice:
            raise CandidateError(f"class_variants: class {twice[0]!r} has more than one entry; give each class one")
        classes = classes_from_json({v["class"]: {"options": v["options"], "launch": {k: v[k] for k in _LAUNCH_PROPERTIES}}
                                     for v in data["class_variants"]}, "class_variants")
    except CandidateError as exc:
        raise ProposalError(str(exc), content) from None
    return Candidate(source=data["source"], launch=launch, launch_overrides=overrides, origin="openai",
                     label=data["title"].strip()[:80], notes=data["idea"].strip()[:2000], classes=classes)


class OpenAIProposer:
    name = "openai"
    supports_repair = True

    def __init__(self, *, suite, program, visible, meter: Meter, recorder: Callable[[dict], str], model: str,
                 reasoning_effort: str | None, base_url: str | None, description: str = "", notes=None,
                 device: str = "an NVIDIA GPU", max_retries: int = 3, timeout_s: float = 600.0,
                 sleep: Callable[[float], None] = time.sleep, api_key: str | None = None, client=None):
        self.suite, self.program, self.visible = suite, program, list(visible)
        self.meter, self.recorder = meter, recorder
        self.model, self.reasoning_effort = model, reasoning_effort
        self.base_url = base_url
        self.description = description
        self.notes = notes
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.sleep = sleep
        self.system = system_prompt(suite, program, device, self.visible)
        self.messages: list[dict] = []
        self.tool_calls = 0
        self.round = 0
        if client is None:
            try:
                import openai
            except ImportError:
                from pytest_cudagate.errors import CudagateError

                raise CudagateError("--proposer openai needs the openai package: install cudagate with its [optimize] extra (pip install -e '.[optimize]' in its checkout)") from None
            import os

            key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
            if key is None:
                from pytest_cudagate.errors import CudagateError

                raise CudagateError("--proposer openai needs OPENAI_API_KEY in the environment (or --base-url for a "
                                    "local OpenAI-compatible server that needs no key)")
            client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s)
        self.client = client

    def describe(self) -> dict:
        return {"model": self.model, "reasoning_effort": self.reasoning_effort, "endpoint": public_url(self.base_url)
                or "https://api.openai.com/v1", "research": bool(self.notes), "response_format": "json_schema (strict)"}

    # -- one round --------------------------------------------------------------------------------
    def propose(self, context: RoundContext) -> list[Candidate]:
        if context.problem is None or not self.messages:
            self.round = context.round
            self.tool_calls = 0
            self.messages = [{"role": "system", "content": self.system},
                             {"role": "user", "content": round_prompt(context, self.suite, self.visible, self.description)}]
            purpose = "propose"
        else:
            self.messages.append({"role": "user", "content": repair_prompt(context.problem)})
            purpose = "repair"
        budget = self.meter.budgets.max_tool_calls
        for _ in range(budget + 2):
            tools_on = self.notes is not None and self.tool_calls < budget
            response = self._call(purpose, tools_on)
            choice = response.choices[0]
            message = choice.message
            if message.tool_calls:
                self.messages.append({"role": "assistant", "content": message.content,
                                      "tool_calls": [tc.model_dump() for tc in message.tool_calls]})
                for call in message.tool_calls:
                    self.messages.append({"role": "tool", "tool_call_id": call.id, "content": self._tool(call, tools_on)})
                purpose = "tool_result"
                continue
            refusal = getattr(message, "refusal", None)
            self.messages.append({"role": "assistant", "content": message.content or refusal or ""})
            if refusal:
                raise ProposalError(f"the model refused: {refusal}", refusal)
            if choice.finish_reason == "length":
                raise ProposalError("the answer was cut off at the token limit; answer more briefly (the source "
                                    "without long comments)", message.content)
            return [parse_answer(message.content)]
        raise ProposalError(f"the model kept calling tools past the limit of {budget} per round; answer with the "
                            "JSON object now")

    def _tool(self, call, enabled: bool) -> str:
        if call.function.name != "search_notes" or self.notes is None:
            return f"there is no tool named {call.function.name!r}"
        if not enabled:
            return "the tool budget of this round is spent: answer with the JSON object now"
        self.tool_calls += 1
        try:
            query = json.loads(call.function.arguments or "{}").get("query", "")
        except (ValueError, AttributeError):
            return "the arguments were not JSON: call search_notes with {\"query\": \"...\"}"
        return self.notes.answer(str(query))

    def _call(self, purpose: str, tools_on: bool):
        import openai

        last = ""
        for attempt in range(self.max_retries + 1):
            kwargs = {"model": self.model, "messages": self.messages, "response_format": RESPONSE_FORMAT}
            if self.reasoning_effort:
                kwargs["reasoning_effort"] = self.reasoning_effort
            if self.notes is not None:
                kwargs["tools"] = [TOOL]
                kwargs["tool_choice"] = "auto" if tools_on else "none"
            kwargs["max_completion_tokens"] = self.meter.completion_cap(len(json.dumps(kwargs, default=str)))
            record = {"round": self.round, "purpose": purpose, "try": attempt + 1, "model": self.model,
                      "endpoint": public_url(self.base_url) or "https://api.openai.com/v1",
                      "started_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                      "request": json.loads(json.dumps(kwargs, default=str))}
            start = time.monotonic()
            timeout = self.timeout_s
            if self.meter.budgets.max_wall_s is not None:  # a call may not outlive the wall budget
                timeout = max(5.0, min(timeout, self.meter.budgets.max_wall_s - self.meter.wall_s - self.meter.reserve_s))
            try:
                response = self.client.chat.completions.create(**kwargs, timeout=timeout)
            except openai.APIStatusError as exc:
                self._failed(record, start, exc, getattr(exc, "status_code", None))
                last = f"{type(exc).__name__} (HTTP {exc.status_code}): {_message(exc)}"
                if exc.status_code in RETRYABLE_STATUS and attempt < self.max_retries:
                    self.sleep(_backoff(exc, attempt))
                    continue
                if exc.status_code in RETRYABLE_STATUS:
                    break
                raise ModelError(last) from None
            except openai.APIConnectionError as exc:  # timeouts included
                self._failed(record, start, exc, None)
                last = f"{type(exc).__name__}: {exc}"
                if attempt < self.max_retries:
                    self.sleep(_backoff(exc, attempt))
                    continue
                break
            usage = response.usage.model_dump() if getattr(response, "usage", None) is not None else None
            cost = self.meter.add_call(usage)
            record.update(seconds=round(time.monotonic() - start, 3), response=response.model_dump(), error=None,
                          usage=usage, cost_usd=cost, finish_reason=response.choices[0].finish_reason if response.choices else None)
            self.recorder(record)
            if not response.choices:
                raise ProposalError("the response held no choices")
            return response
        raise ModelError(f"the endpoint failed {self.max_retries + 1} time(s) in a row; last: {last}")

    def _failed(self, record: dict, start: float, exc, status) -> None:
        self.meter.add_call(None)
        body = getattr(exc, "body", None)
        record.update(seconds=round(time.monotonic() - start, 3), response=None, usage=None, cost_usd=0.0,
                      finish_reason=None, error={"type": type(exc).__name__, "status": status, "message": _message(exc),
                                                 "body": body if isinstance(body, (dict, list, str)) else None})
        self.recorder(record)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close:
            close()


def _message(exc) -> str:
    return str(getattr(exc, "message", None) or exc)[:2000]


def _backoff(exc, attempt: int) -> float:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name in ("retry-after-ms", "retry-after"):
        value = headers.get(name) if hasattr(headers, "get") else None
        if value is None:
            continue
        try:
            seconds = float(value) / (1000.0 if name.endswith("-ms") else 1.0)
            return max(0.0, min(seconds, MAX_BACKOFF_S))
        except ValueError:
            continue
    return min(2.0 ** attempt, 30.0)
