"""Compile a suite program on the host (NVRTC needs no GPU), through the per-user on-disk cache.

The log that comes back is scrubbed of secret environment values before anyone prints or stores it.
"""

from __future__ import annotations

from cudagate_harness.compiler import CompileOptionError, CompileResult, compile_kernel

from pytest_cudagate.reports.scrub import Scrubber
from pytest_cudagate.suite.includes import IncludeError
from pytest_cudagate.worker.requests import kernel_spec
from pytest_cudagate.suite.model import Program


def compile_program(program: Program, arch: str, source_text: str | None = None) -> CompileResult:
    """Compile ``program`` for ``arch`` + its suffix; a refused option or include becomes a failed result."""
    target = arch + program.arch_suffix
    try:
        spec = kernel_spec(program, source_text)
        result = compile_kernel(spec["source"], entry=spec["entry"], arch=target, source_name=spec["source_name"],
                                options=spec["options"], headers=spec["headers"])
    except (CompileOptionError, IncludeError) as exc:
        result = CompileResult(ok=False, arch=target, key="", cache_hit=False, seconds=0.0, log=str(exc))
    result.log = Scrubber().text(result.log)
    return result
