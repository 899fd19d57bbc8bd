"""compute-sanitizer runs of one case: memcheck, racecheck and initcheck, in parallel.

Each tool runs the harness on a one-case request file (``python -m cudagate_harness REQUEST.json``)
under ``compute-sanitizer --tool TOOL --error-exitcode 99 --log-file LOG``. The case carries
``sanitize: true``, so the worker launches the kernel once with its outputs left as allocated
(initcheck then sees a read of an output before it was written, and the download of an element
never written), without guard zones (memcheck then reports a write past a buffer against the
allocation's real end) and without the shared-memory scrub. The report is parsed into a few short
findings with their source lines (kernels are compiled with -lineinfo).

A tool is clean only on positive evidence: exit code 0, its summary line at 0 errors, and the
harness's answer for the case. Anything else (a timeout, a crash, an odd exit code, a log without
its summary) is no verdict, ``skipped``, which the gate never reads as a pass. A tool that outlives
its time is killed with its whole process group, the instrumented harness and its children.

Standard library only, so the client can drive it without importing CUDA. Results are cached on
disk by everything that decides them (kernel source and options, launch, case data, tool,
sanitizer binary), so an unchanged kernel is sanitized once per machine, not once per gate run.
No verdict is ever stored there; a timeout is remembered in this process only, so that a kernel
that hangs under instrumentation costs its time once per run, not once more on its item.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .toolkit import find_tool

TOOLS = ("memcheck", "racecheck", "initcheck")
ERROR_EXIT = 99
CACHE_FORMAT = 1
MAX_FINDINGS = 3
_SKIP = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application returned",
         "Saved host backtrace", "Host Frame", "Device Frame", "Warning", "Process did not terminate", "This ")
_LOCATION = re.compile(r"([^\s:()]+\.(?:cu|cuh|h|hpp|hh|inc)):(\d+)")
_NOISE = re.compile(r"(?:\bat\s+)?0x[0-9a-fA-F]+\s*|\+0x[0-9a-fA-F]+")
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:.*?\((\d+)\s+errors?")
WHAT = {"memcheck": "out-of-bounds or misaligned access",
        "racecheck": "shared-memory race",
        "initcheck": "read of uninitialised global memory"}


def find() -> str | None:
    """The compute-sanitizer binary: $CUDAGATE_COMPUTE_SANITIZER, the PATH, then the usual toolkit folders."""
    return find_tool("compute-sanitizer", "CUDAGATE_COMPUTE_SANITIZER")


@dataclass
class ToolResult:
    tool: str
    status: str  # "clean", "errors", or "skipped" (did not run to a verdict; ``detail`` says why)
    errors: int = 0
    findings: list[str] = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0
    cached: bool = False
    timed_out: bool = False  # skipped because it outlived its time and was killed

    def describe(self) -> str:
        """One line (plus findings) a reviewer reads."""
        if self.status == "errors":
            head = (f"compute-sanitizer {self.tool}: {self.errors or len(self.findings) or 'some'} error(s) "
                    f"({WHAT.get(self.tool, self.tool)})")
            return "\n".join([head, *(f"  {f}" for f in self.findings)])
        if self.status == "skipped":
            return f"compute-sanitizer {self.tool} gave no verdict: {self.detail}"
        return f"compute-sanitizer {self.tool}: clean"


def parse_report(text: str) -> tuple[int | None, list[str]]:
    """(error count from the summary line, or None; up to MAX_FINDINGS short findings with locations)."""
    errors = None
    findings: list[dict] = []
    current = None
    for raw in text.splitlines():
        if not raw.startswith("========="):
            continue
        body = raw[len("========="):]
        match = _SUMMARY.search(body) or _RACE_SUMMARY.search(body)
        if match:
            errors = max(errors or 0, int(match.group(1)))
            continue
        stripped = body.strip()
        if not stripped or any(stripped.startswith(s) for s in _SKIP):
            current = None if not stripped else current
            continue
        indent = len(body) - len(body.lstrip(" "))
        if indent <= 1:
            current = {"what": stripped, "where": None, "more": []}
            findings.append(current)
            loc = _LOCATION.search(stripped)
            if loc:
                current["where"] = f"{Path(loc.group(1)).name}:{loc.group(2)}"
        elif current is not None:
            if stripped.startswith("and ") and len(current["more"]) < 1:
                current["more"].append(stripped)  # racecheck: "... and Read access at ... file.cu:17"
            if current["where"] is None:
                loc = _LOCATION.search(stripped)
                if loc:
                    current["where"] = f"{Path(loc.group(1)).name}:{loc.group(2)}"
    short, seen = [], set()
    for finding in findings:
        text_ = " ".join([finding["what"], *finding["more"]])
        text_ = _NOISE.sub(" ", text_)
        text_ = re.sub(r"\s+", " ", _LOCATION.sub(lambda m: f"{Path(m.group(1)).name}:{m.group(2)}", text_)).strip()
        if finding["where"] and finding["where"] not in text_:
            text_ += f" (at {finding['where']})"
        key = re.sub(r"(?<![:\w])\d+", "N", text_)  # the same error at another offset or thread is one finding
        if key not in seen:
            seen.add(key)
            short.append(text_)
    return errors, short[:MAX_FINDINGS]


def cache_dir() -> Path:
    from .compiler import cache_dir as compile_cache

    return compile_cache().parent / "sanitizer"


def cache_key(request: dict, tool: str, exe: str) -> str:
    """Everything that decides a tool's verdict on a one-case request; input files by content."""
    case = dict(request["cases"][0])
    files = {}
    for name, spec in case.get("buffers", {}).items():
        if spec.get("input"):
            path = Path(request.get("base_dir", ".")) / spec["input"]
            try:
                files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                files[name] = None
    case["buffers"] = {name: spec.get("count") for name, spec in case.get("buffers", {}).items()}
    try:
        stat = os.stat(exe)
        binary = [exe, stat.st_size, int(stat.st_mtime)]
    except OSError:
        binary = [exe]
    kernel = {k: v for k, v in (request.get("kernel") or {}).items() if k not in ("name", "source_name", "source_path")}
    blob = json.dumps({"format": CACHE_FORMAT, "tool": tool, "binary": binary, "kernel": kernel,
                       "signature": request.get("signature"), "case": case, "files": files,
                       "python": sys.version_info[:2]}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# This process's timeouts, by cache key and time limit (see the module's docstring).
_TIMED_OUT: dict[tuple[str, float], ToolResult] = {}


def _cached(key: str, timeout_s: float) -> ToolResult | None:
    if (key, timeout_s) in _TIMED_OUT:
        return replace(_TIMED_OUT[key, timeout_s], cached=True)
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
        result = ToolResult(**{**data, "cached": True})
    except (OSError, ValueError, TypeError):
        return None
    return result if result.status in ("clean", "errors") else None


def _store(key: str, result: ToolResult, timeout_s: float) -> None:
    if result.timed_out:
        _TIMED_OUT[key, timeout_s] = result
    if result.status == "skipped":
        return  # no verdict says nothing about the kernel: never on disk, tried again next run
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(result), handle)
        os.replace(tmp, directory / f"{key}.json")
    except OSError:
        pass


def _harness_error(stdout: str) -> str | None:
    """The harness's own error for the case (a refused launch, a fault), if it reported one."""
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if message.get("type") == "case" and message.get("status") == "error":
            error = message["error"] if isinstance(message.get("error"), dict) else {}
            return f"{error.get('kind', 'error')}: {error.get('message', '')}"
        if message.get("type") == "compile" and not message.get("ok", True):
            return "the kernel does not compile"
    return None


def run_tools(request: dict, tools=TOOLS, *, exe: str, timeout_s: float = 120.0, env: dict | None = None,
              workdir: Path | None = None, use_cache: bool = True) -> dict[str, ToolResult]:
    """Run each tool on the one-case ``request`` (a ``run`` request), all at once; results by tool."""
    results: dict[str, ToolResult] = {}
    todo = []
    for tool in tools:
        key = cache_key(request, tool, exe)
        hit = _cached(key, timeout_s) if use_cache else None
        if hit is not None:
            results[tool] = hit
        else:
            todo.append((tool, key))
    if not todo:
        return results
    own = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="cudagate-sanitizer-")) if own else Path(workdir)
    procs = []
    try:
        for tool, key in todo:
            tool_dir = folder / tool
            tool_dir.mkdir(parents=True, exist_ok=True)
            one = json.loads(json.dumps(request))
            one["output_dir"] = str(tool_dir / "out")
            one.setdefault("base_dir", str(Path.cwd()))
            for case in one.get("cases", []):
                case["sanitize"] = True
                case.pop("fresh", None)
            one["timing"] = None
            one["checks"] = {"guards": False, "scrub_shared": False, "timed_outputs": False}
            one["timeout_s"] = timeout_s  # a compile that cannot finish then says so before the kill
            req_path = tool_dir / "request.json"
            req_path.write_text(json.dumps(one))
            log = tool_dir / "sanitizer.log"
            out = open(tool_dir / "stdout.txt", "wb")
            # Only the worker is instrumented: the compiler's confined child makes no CUDA call. A request
            # file may read data only below the folders it is given: the suite's, where the case data lies.
            roots = ["--root", str(Path(request["suite"]).parent)] if request.get("suite") else []
            command = [exe, "--tool", tool, "--target-processes", "application-only", "--error-exitcode",
                       str(ERROR_EXIT), "--log-file", str(log), sys.executable, "-m", "cudagate_harness", str(req_path),
                       *roots]
            # Started in "/": `python -m` puts the working folder first on sys.path, and a pull request's
            # checkout must not provide the modules the worker imports.
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True, cwd="/")
            procs.append((tool, key, proc, out, log, tool_dir, time.perf_counter()))
        deadline = time.monotonic() + timeout_s
        timed_out = set()
        for tool, _, proc, *_ in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out.add(tool)
        # Every tool past the deadline is killed before any is reaped: a process whose kernel still
        # spins can take seconds to leave the GPU, and those seconds overlap instead of adding up.
        for tool, _, proc, *_ in procs:
            if tool in timed_out:
                _kill_group(proc)
        for tool, key, proc, out, log, tool_dir, started in procs:
            if tool in timed_out:
                proc.wait()
            out.close()
            seconds = time.perf_counter() - started
            report = _read(log)
            stdout = _read(tool_dir / "stdout.txt")
            if tool in timed_out:
                result = ToolResult(tool, "skipped", detail=f"timed out after {timeout_s:g} s", seconds=seconds,
                                    timed_out=True)
            else:
                result = interpret(tool, proc.returncode, report, stdout, seconds)
            results[tool] = result
            if use_cache:
                _store(key, result, timeout_s)
    finally:
        for _, _, proc, out, *_ in procs:  # an exception (or ^C) above must leave no tool holding the GPU
            if proc.returncode is None:
                _end_group(proc)
            out.close()
        if own:
            shutil.rmtree(folder, ignore_errors=True)
    return results


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` (not yet reaped) with its process group, its own session: the tool, the
    instrumented harness and their children, whoever of them still holds the GPU."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _end_group(proc: subprocess.Popen) -> None:
    _kill_group(proc)
    proc.wait()


def _read(path: Path) -> str:
    """A tool's log or output, or "" where it is missing or unreadable (then no verdict can come of it)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def interpret(tool: str, returncode: int, report: str, stdout: str, seconds: float = 0.0) -> ToolResult:
    """A tool's verdict from its exit code, its report and the harness's answer: clean only with all
    three saying so (see the module's docstring)."""
    errors, findings = parse_report(report)
    if returncode == ERROR_EXIT or (errors or 0) > 0:
        return ToolResult(tool, "errors", errors or len(findings), findings, seconds=seconds)
    harness = _harness_error(stdout)
    if harness is not None:
        return ToolResult(tool, "skipped", detail=f"the harness did not run the case ({harness})", seconds=seconds)
    if returncode != 0:
        tail = " | ".join(line.strip()[:200] for line in (report or stdout).strip().splitlines()[-3:])
        return ToolResult(tool, "skipped", detail=f"exit code {returncode}: {tail or 'no output'}", seconds=seconds)
    if errors is None:
        return ToolResult(tool, "skipped", detail="its log has no summary line (missing, unreadable or cut short)",
                          seconds=seconds)
    if not _answered(stdout):
        return ToolResult(tool, "skipped", detail="the harness gave no answer for the case", seconds=seconds)
    return ToolResult(tool, "clean", 0, seconds=seconds)


def _answered(stdout: str) -> bool:
    """Whether the harness answered the case (a ``case`` line of status ok)."""
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("type") == "case" and message.get("status") == "ok":
            return True
    return False
