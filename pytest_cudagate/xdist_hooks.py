"""``pytest --cuda-gate -n N``: one pytest-xdist worker per GPU, and one report from the controller.

- ``-n auto`` counts the visible GPUs through NVML (no CUDA context in the controller) and starts
  one worker per GPU; without a GPU xdist's own default stands. Each worker's harness runs on GPU
  ``N`` (see :func:`pytest_cudagate.session.xdist_device_env`).
- xdist's default ``load`` distribution becomes ``loadscope``: node ids read
  ``SUITE::KERNEL::CASE``, so a kernel's compile item and cases stay on one worker (and one card),
  which compiles it once.
- A worker attaches each case's outcome (as JSON, :mod:`pytest_cudagate.boundary.wire`), skip, trust
  status and the hardware fingerprint, and each compile item's build facts, to the item's report;
  every cudagate item's reports are marked, so the controller counts them as pytest does. It rebuilds them in
  ``pytest_runtest_logreport``, so report.json, report.html, the job summary and the terminal table
  are built from the same outcomes a ``-n 0`` run holds.
- The controller hands every worker one fresh-input seed, so a failure on any card replays with it.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.reports.hashes import case_files
from pytest_cudagate.reports.locate import ItemInfo, Key
from pytest_cudagate.reports.pytest_hooks import GATHERED
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.build import BuildFacts
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.boundary.wire import from_wire, to_json, to_wire

PAYLOAD = "cudagate_payload"  # the report attribute that carries a case item's results to the controller
COMPILES = "cudagate_compiles"  # ... and a compile item's build facts
GATE_ITEM = "cudagate_item"  # set on every report of a cudagate item: the controller counts them as pytest does
SEED_KEY = "cudagate_fresh_seed"  # in xdist's workerinput


def gpu_count() -> int:
    """Visible GPUs: NVML's count, narrowed by CUDA_VISIBLE_DEVICES; 0 without NVML or a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no library, no driver: no GPU to spread over
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_count(config: pytest.Config) -> int:
    """The gate processes this run starts on the host: xdist's workers, else this one."""
    return int(getattr(config, "workerinput", {}).get("workercount", 1))


def is_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.has_plugin("dsession")


def worker_fresh_seed(config: pytest.Config) -> int | None:
    """The seed the controller chose for every worker (None outside xdist)."""
    return getattr(config, "workerinput", {}).get(SEED_KEY)


def configure_node(node: Any, seed: int | None) -> None:
    node.workerinput[SEED_KEY] = seed if seed is not None else secrets.randbits(32)


def make_scheduler(config: pytest.Config, log: Any):
    """Kernel-grouped scheduling in place of xdist's default ``load``; None keeps the user's choice."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling  # optional dependency: only reached under xdist

    return LoadScopeScheduling(config, log)


def attach(report: pytest.TestReport, item: Any, runtime: Any) -> None:
    """On a worker: put the case item's results (a compile item's build facts) on its call report, for the controller."""
    facts = getattr(item, "facts", None)
    if facts:
        setattr(report, COMPILES, json.dumps(to_json(facts)))
        return
    outcome, skipped = getattr(item, "outcome", None), getattr(item, "skipped_entry", None)
    if outcome is None and skipped is None:
        return
    suite = item.parent.suite
    setattr(report, PAYLOAD, json.dumps({
        "outcome": to_wire(outcome) if outcome is not None else None,
        "skipped": list(skipped) if skipped is not None else None,
        "suite_path": str(suite.path),
        "trust": {k: v for k, v in runtime.trust.items() if k == str(suite.path)},
        "fingerprint": runtime.fingerprint.to_dict() if runtime.fingerprint is not None else None,
    }))


def gather(config: pytest.Config, report: pytest.TestReport, runtime: Any) -> None:
    """On the controller: rebuild what a worker attached to ``report`` into ``runtime``."""
    facts = getattr(report, COMPILES, None)
    if facts:
        runtime.compiles += [BuildFacts(**f) for f in json.loads(facts)]
    text = getattr(report, PAYLOAD, None)
    if not text:
        return
    data = json.loads(text)
    if data["outcome"] is not None:
        outcome = from_wire(CaseOutcome, data["outcome"])
        runtime.outcomes.append(outcome)
        key = (outcome.suite, outcome.kernel, outcome.case)
    else:
        runtime.skipped.append(tuple(data["skipped"]))
        key = tuple(data["skipped"][:3])
    runtime.trust.update(data["trust"])
    if data["fingerprint"] is not None and runtime.fingerprint is None:
        runtime.fingerprint = Fingerprint.from_dict(data["fingerprint"])
    index = config.stash.setdefault(GATHERED, {})
    index[key] = _item_info(report.nodeid, Path(data["suite_path"]), key, index)


def _item_info(nodeid: str, suite_path: Path, key: Key, index: dict) -> ItemInfo:
    suite = next((info.suite for info in index.values() if info.suite_path == suite_path), None)
    if suite is None:
        try:
            suite = load_suite(suite_path)
        except CudagateError:  # the worker loaded it; if the controller cannot, locate from the requests
            return ItemInfo(nodeid=nodeid, suite_path=suite_path)
    suite = suite.instance_of(key[1])  # an instantiated suite: the kernel's instantiation
    program = next((p for p in [*suite.kernels, suite.reference.program] if p is not None and p.name == key[1]), None)
    case = next((c for c in suite.cases if c.name == key[2]), None)
    if program is None or case is None:
        return ItemInfo(nodeid=nodeid, suite_path=suite_path, suite=suite)
    return ItemInfo(nodeid=nodeid, suite_path=suite_path, source=Path(program.source),
                    files=case_files(suite.case_dir(case)), suite=suite, program=program, case=case)
