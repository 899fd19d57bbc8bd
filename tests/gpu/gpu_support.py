"""Shared helpers of the GPU tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def has_gpu() -> bool:
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:  # no driver library at all
        return False


def copy_suite(name: str, dest: Path) -> Path:
    """A private copy of an example suite (source, case data), so a test may edit it freely."""
    target = dest / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("approved", "cudagate.approvals.json"))
    return target


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a command with this interpreter's environment; output kept for the assertion message."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def gate(path: Path, *extra: str, cwd: Path | None = None, signed: bool = False) -> subprocess.CompletedProcess:
    """Run the gate; copies in a temp folder carry no project keys (trust has its own CPU tests)."""
    trust = [] if signed else ["--cuda-gate-allow-unsigned"]
    return run(["-m", "pytest", "--cuda-gate", str(path), "--cuda-gate-require-gpu", *trust,
                "-p", "no:cacheprovider", "-rA", *extra], cwd or path.parent)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run(["-m", "pytest_cudagate.cli", *args], cwd)
