"""Fakes for the optimizer's CPU tests: a harness layer without a GPU, and a scripted OpenAI-compatible
HTTP server on 127.0.0.1 that the real ``openai`` SDK talks to.

:class:`FakeEvaluator` compiles every candidate for real (NVRTC needs no GPU), then decides what
the GPU would have said from markers in the source:

    // fake: latency=0.010                  every performance case takes 10 µs (default 20 µs)
    // fake: latency=perf:0.010,perf2:0.03  per case
    // fake: wrong                          the first correctness case has mismatches
    // fake: fault                          the first performance case faults
    // fake: holdout-wrong                  passes the search, fails the gate's holdout case
    // fake: regressed                      the gate finds it slower than the approved kernel
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from helpers import KERNEL_CU, SUITE_YAML, replace_once, write_suite
from pytest_cudagate.worker.build import compile_builds
from pytest_cudagate.judge.correctness import CaseVerdict
from pytest_cudagate.judge.latency import Latency, LatencyResult
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.judge.stats import RatioEstimate, summarize
from pytest_cudagate.optimize.evaluator import CaseResult, Evaluation, Validation, compile_summary

BASE_MS = 0.020

# The shared `scale` suite, with a tunable launch, a second performance case and a holdout case.
OPT_SUITE_YAML = replace_once(
    replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                 "    # a comment the --propose rewrite must keep\n"
                 "    launch: {grid: [rows], block: [BLOCK]}\n"
                 "    tunables: {BLOCK: [128, 64, 256, 512]}\n"),
    "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n",
    "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n"
    "  - {name: perf2, kind: performance, scalars: {rows: 32, cols: 1000}}\n"
    "  - {name: hidden_77x300, kind: performance, holdout: true, scalars: {rows: 77, cols: 300}}\n")


def opt_suite(folder: Path) -> Path:
    """The ``scale`` suite with a second performance case, a holdout case and a tunable."""
    return write_suite(folder, yaml_text=OPT_SUITE_YAML)


def committed_project(root: Path, git):
    """A git repository at ``root`` whose first commit holds the optimize suite under kernels/scale."""
    opt_suite(root / "kernels" / "scale")
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Kernel Author")
        config.set_value("user", "email", "author@example.com")
    repo.git.add(all=True)
    repo.index.commit("a suite")
    return repo


def fake_source(marker: str = "", body: str = KERNEL_CU) -> str:
    return (f"// fake: {marker}\n" if marker else "") + body


BROKEN_SOURCE = """\
extern "C" __global__ void scale2(const float* x, float* y, int rows, int cols)
{
    y[0] = not_declared_anywhere;
}
"""


def markers(source: str) -> dict:
    found = {}
    for line in re.findall(r"//\s*fake:\s*(.*)", source):
        for item in line.split():
            key, _, value = item.partition("=")
            found[key] = value
    return found


def build_defines(candidate, shape_class: str) -> dict[str, int]:
    """The tunables a case of ``shape_class`` runs with: the candidate's defines, overridden by the -D
    options of the class's variant (as the guarded #defines of ``Candidate.text`` are by the compiler)."""
    variant = candidate.classes.get(shape_class)
    options = dict(o[2:].split("=", 1) for o in (variant.options if variant else ()) if o.startswith("-D"))
    return {**candidate.defines, **{name: int(value) for name, value in options.items()}}


class FakeEvaluator:
    def __init__(self, suite, program, ledger=None, *, gpu_s: float = 0.25, validate_gpu_s: float = 1.0,
                 sleep_s: float = 0.0, interrupt_after: int | None = None, latency_fn=None, profile=None):
        self.suite, self.program = suite, program
        self.gpu_s, self.validate_gpu_s, self.sleep_s = gpu_s, validate_gpu_s, sleep_s
        self.interrupt_after = interrupt_after
        self.latency_fn = latency_fn
        self.evaluated: list = []
        self.validated: list = []
        self.profiled: list = []
        self.closed = False
        self.profile_result = profile or {"achieved_occupancy_pct": 48.0, "dram_throughput_pct": 12.0,
                                          "sm_throughput_pct": 30.0, "registers_per_thread": 32.0}

    def device(self) -> dict:
        return {"key": "fakefakefakefake", "description": "Fake GPU (sm_90, 132 SMs) driver 0 CUDA 13.0", "fields": {}}

    def validation_reserve_s(self) -> float:
        return 2.0

    def compile(self, candidate) -> dict:
        builds = compile_builds(candidate.program(self.program), self.suite.cases, "sm_90", candidate.text)
        return next((compile_summary(r) for _, r in builds if not r.ok), compile_summary(builds[0][1]))

    def _latency(self, candidate, case: str) -> float:
        if self.latency_fn is not None:
            return self.latency_fn(candidate, case)
        value = markers(candidate.text).get("latency")
        if not value:
            return BASE_MS
        if ":" not in value:
            return float(value)
        table = dict(item.split(":") for item in value.split(","))
        return float(table.get(case, BASE_MS))

    def evaluate(self, candidate) -> Evaluation:
        self.evaluated.append(candidate)
        if self.interrupt_after is not None and len(self.evaluated) > self.interrupt_after:
            raise KeyboardInterrupt
        if self.sleep_s:
            time.sleep(self.sleep_s)
        flags = markers(candidate.text)
        evaluation = Evaluation(stage="correctness", passed=False, compile=self.compile(candidate), gpu_s=self.gpu_s)
        visible = [c for c in self.suite.cases if not c.holdout]
        for case in [c for c in visible if c.kind != "performance"]:
            launch = candidate.program(self.program).for_case(case).launch_for(case.name).resolve(case.scalars)
            if "wrong" in flags:
                message = (f"scale2 × {case.name}: FAILED\noutput 'y': 7 of 150 elements outside tolerance\n"
                           "  worst at index [2, 3]: expected 0.123456, actual 9.0")
                evaluation.cases.append(CaseResult(case.name, case.kind, False, launch, message,
                                                   f"case {case.name}: FAILED\noutput 'y': 7 of 150 elements outside tolerance"))
                evaluation.rejection, evaluation.rejection_for_model = message, evaluation.cases[-1].for_model
                return evaluation
            evaluation.cases.append(CaseResult(case.name, case.kind, True, launch))
        evaluation.stage = "performance"
        for case in [c for c in visible if c.kind == "performance"]:
            launch = candidate.program(self.program).for_case(case).launch_for(case.name).resolve(case.scalars)
            if "fault" in flags:
                message = f"scale2 × {case.name}: FAILED\nthe kernel faulted: CUDA_ERROR_ILLEGAL_ADDRESS"
                evaluation.cases.append(CaseResult(case.name, case.kind, False, launch, message, message))
                evaluation.rejection = evaluation.rejection_for_model = message
                return evaluation
            latency = self._latency(candidate, case.name)
            ratio = latency / BASE_MS
            evaluation.cases.append(CaseResult(case.name, case.kind, True, launch, latency_ms=latency, initial_ms=BASE_MS,
                                               ratio={"ratio": ratio, "low": ratio * 0.99, "high": ratio * 1.01,
                                                      "confidence": 0.99, "n": 100}, samples=100))
        evaluation.stage, evaluation.passed = "done", True
        return evaluation

    def validate(self, candidate) -> Validation:
        self.validated.append(candidate)
        flags = markers(candidate.text)
        validation = Validation(passed=True, fresh_seed=1234, gpu_s=self.validate_gpu_s,
                                notes=["small: compute-sanitizer not found: the memcheck, racecheck step was skipped"])
        for case in self.suite.cases:
            outcome = CaseOutcome(self.suite.name, self.program.name, case.name, case.kind,
                                  correctness=CaseVerdict(self.program.name, case.name, True))
            if case.kind == "performance":
                latency = self._latency(candidate, case.name)
                ratio = 1.3 if "regressed" in flags else latency / BASE_MS
                estimate = RatioEstimate(ratio, ratio * 0.98, ratio * 1.02, 0.99, 200, "fake")
                outcome.latency = LatencyResult(Latency.REGRESSED if "regressed" in flags else Latency.IMPROVED, 0.02,
                                                estimate=estimate, approved=summarize([BASE_MS] * 3),
                                                current=summarize([latency] * 3))
            if case.holdout and "holdout-wrong" in flags:
                outcome.failed = True
                outcome.message = (f"scale2 × {case.name}: FAILED\noutput 'y': 23100 of 23100 elements "
                                   "outside tolerance (23100 never written)")
            if "regressed" in flags and case.kind == "performance":
                outcome.failed = True
                outcome.message = "latency regressed: current is 30.0% slower than approved"
            entry = {**to_json(outcome), "holdout": case.holdout}
            validation.cases.append(entry)
            if not entry["passed"] and validation.passed:
                validation.passed = False
                validation.rejection = f"case {case.name}{' (holdout)' if case.holdout else ''}: {entry['message']}"
        return validation

    def profile(self, candidate) -> dict:
        self.profiled.append(candidate)
        return {**self.profile_result, "case": "perf", "seconds": 0.5}

    def close(self) -> None:
        self.closed = True


def write_proposals(folder: Path, entries: list[dict]) -> Path:
    """One proposal file per round: ``entries`` of {marker or source, launch?, label?, launch_overrides?, classes?}."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, entry in enumerate(entries, start=1):
        source = entry.get("source") or fake_source(entry.get("marker", ""))
        cu = folder / f"{number:02d}.cu"
        cu.write_text(source, encoding="utf-8")
        doc = {"label": entry.get("label", f"proposal {number}"), "notes": entry.get("notes", ""),
               "source_file": cu.name, "launch": entry.get("launch", {"grid": ["rows"], "block": ["128"]})}
        for key in ("launch_overrides", "classes"):
            if key in entry:
                doc[key] = entry[key]
        (folder / f"{number:02d}.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


# -- a scripted OpenAI-compatible endpoint -----------------------------------------------------------

def completion(content: str | None = None, *, tool_calls: list | None = None, refusal: str | None = None,
               finish_reason: str = "stop", prompt_tokens: int = 1200, completion_tokens: int = 800,
               reasoning_tokens: int = 300, model: str = "gpt-5-mini") -> dict:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
        finish_reason = "tool_calls"
    return {"status": 200, "body": {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1764460000, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": 200},
                  "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}}}


def answer(source: str, *, title: str = "candidate", grid=("rows",), block=("128",), overrides=(), variants=(),
           **usage) -> dict:
    payload = {"title": title, "idea": "a faster variant", "source": source,
               "launch": {"grid": list(grid), "block": list(block), "shared_bytes": "0"},
               "launch_overrides": list(overrides), "class_variants": list(variants)}
    return completion(json.dumps(payload), **usage)


def tool_call(query: str, call_id: str = "call_1") -> dict:
    return completion(None, tool_calls=[{"id": call_id, "type": "function",
                                         "function": {"name": "search_notes", "arguments": json.dumps({"query": query})}}])


def error(status: int, message: str = "error", *, retry_after: str | None = "0", kind: str = "rate_limit_exceeded") -> dict:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return {"status": status, "headers": headers, "body": {"error": {"message": message, "type": kind, "code": kind}}}


class ScriptedServer:
    """Serves ``script`` entries in order to POST /v1/chat/completions; records every request."""

    def __init__(self, script: list[dict]):
        self.script = list(script)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                entry = server.script.pop(0) if server.script else error(500, "script exhausted", retry_after=None,
                                                                         kind="server_error")
                body_out = entry["body"]
                if entry.get("realistic_usage"):  # like a real endpoint: ~4 characters a token, the cap obeyed
                    usage = dict(body_out["usage"])
                    usage["prompt_tokens"] = len(json.dumps(body["messages"])) // 4
                    usage["completion_tokens"] = min(usage["completion_tokens"], body.get("max_completion_tokens", 10**9))
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                    usage["prompt_tokens_details"] = {"cached_tokens": 0}
                    body_out = {**body_out, "usage": usage}
                data = json.dumps(body_out).encode()
                self.send_response(entry["status"])
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in (entry.get("headers") or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
