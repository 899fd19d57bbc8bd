"""Compile a suite program on the host (NVRTC needs no GPU), through the shared on-disk cache."""

from __future__ import annotations

from cudagate_harness.compiler import CompileOptionError, CompileResult, compile_kernel

from pytest_cudagate.worker.requests import kernel_spec
from pytest_cudagate.suite.model import Program


def compile_program(program: Program, arch: str, source_text: str | None = None) -> CompileResult:
    """Compile ``program`` for ``arch`` + its suffix; a refused option becomes a failed result."""
    spec = kernel_spec(program, source_text)
    target = arch + program.arch_suffix
    try:
        return compile_kernel(spec["source"], entry=spec["entry"], arch=target, source_name=spec["source_name"],
                              options=spec["options"], headers=spec["headers"])
    except CompileOptionError as exc:
        return CompileResult(ok=False, arch=target, key="", cache_hit=False, seconds=0.0, log=str(exc))
