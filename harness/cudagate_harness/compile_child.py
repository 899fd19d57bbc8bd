"""What both compilers (NVRTC in a confined child, nvcc as a process group) share about the child that
compiles: the environment it gets, how its out-of-memory death reads, and the error for an option or
file the harness refuses."""

from __future__ import annotations

import os
import re
from pathlib import Path

# What the child's stderr says when an allocation failed under the cap (NVRTC's LLVM aborts, ptxas
# gives up, or Python raises); read for these words only, never shown: it may quote what the kernel read.
OUT_OF_MEMORY = re.compile(rb"out of memory|memory allocation fail|bad_alloc|MemoryError|cannot allocate memory",
                           re.IGNORECASE)


class CompileOptionError(ValueError):
    """An option (NVRTC's or nvcc's) or header the harness refuses; the message says why."""


def child_env() -> dict[str, str]:
    """What the compiler child needs to find NVRTC, and nothing else (no tokens, no keys)."""
    keep = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "LANG", "LC_ALL", "SYSTEMROOT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    return env
