"""Shared helpers of the GPU tests."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def gpu_problem() -> str | None:
    """Why no CUDA device can be used here, with the underlying error; None when one can.

    Nothing is swallowed: a missing driver library, bindings that fail to import and a driver that
    refuses cuInit are each named, so a skip says which it was and CUDAGATE_REQUIRE_GPU can fail on it.
    """
    try:
        from cuda.bindings import driver
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return f"cuda.bindings is not importable: {type(exc).__name__}: {exc}"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {err.name}"
        err, count = driver.cuDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - e.g. the driver library itself is missing or broken
        return f"the CUDA driver is unusable: {type(exc).__name__}: {exc}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuDeviceGetCount failed: {err.name}"
    return None if count > 0 else "the driver reports no CUDA device"


def gpu_required(config) -> bool:
    """``--require-gpu`` or CUDAGATE_REQUIRE_GPU=1: a missing GPU or tool fails instead of skipping."""
    return bool(config.getoption("require_gpu", False)) or os.environ.get("CUDAGATE_REQUIRE_GPU", "") not in ("", "0")


def unavailable(config, reason: str) -> NoReturn:
    """A tool or permission a GPU test needs is missing: skip naming it, except on a machine that must run
    every GPU test (``gpu_required``), where a skip would pass unseen: there the test fails with the reason."""
    if gpu_required(config):
        pytest.fail(f"required here (--require-gpu / CUDAGATE_REQUIRE_GPU) but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def require_module(config, name: str) -> ModuleType:
    """``pytest.importorskip`` that fails instead where a GPU is required (see ``unavailable``)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(config, f"{name} is not importable ({exc}); pip install -e '.[optimize]'")


def copy_suite(name: str, dest: Path) -> Path:
    """A private copy of an example suite (source, case data), so a test may edit it freely. Generated
    cases (matmul's 2048³) are left out: each adds seconds to every approval and gate run, and the tests
    that copy a suite are about something else (test_large_case_gpu.py judges that case)."""
    target = dest / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("approved", "cudagate.approvals.json"))
    path = target / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    kept = [case for case in raw["cases"] if not case.get("generated")]
    if len(kept) != len(raw["cases"]):
        path.write_text(suite_yaml({**raw, "cases": kept}))
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


def suite_yaml(raw: dict) -> str:
    """A suite file's text for ``raw``, with no YAML anchors or aliases (which suites refuse): values the
    edit shares between entries are written out each time."""
    return yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False)
