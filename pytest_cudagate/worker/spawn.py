"""The harness worker's process, started at the very start of a ``--cuda-gate`` run so that its CUDA
start (cuInit, a context, the device description: about 0.7 s on an H200) runs while the plugin
imports numpy, PyYAML and cryptography and pytest collects, instead of after them.

Only the process is started here. :func:`pytest_cudagate.session.open_worker` takes it over and,
as for a worker it starts itself, reads its hello, takes the GPU's lock and the fingerprint.

Imported by the plugin's configure under ``--cuda-gate``, before its heavy imports: it brings the
standard library and the worker client only (``python -X importtime`` shows nothing heavier).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pytest_cudagate.worker.client import HarnessClient, Worker

if TYPE_CHECKING:
    import pytest

# pytest's options under which it runs no test item (their option names).
_NO_RUN = ("collectonly", "help", "markers", "showfixtures", "show_fixtures_per_test", "setupplan", "setuponly")


def xdist_device_env() -> dict[str, str]:
    """Under pytest-xdist, pin worker gwN to GPU N modulo the GPU count (one card per worker).

    A CUDA_VISIBLE_DEVICES the user set is the list to spread over: gwN takes its entry N modulo
    its length (a single card stays as it is). Otherwise the count comes from NVML, so the parent
    process never creates a CUDA context of its own.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return {}
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        chosen = [entry.strip() for entry in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if entry.strip()]
        return {"CUDA_VISIBLE_DEVICES": chosen[int(worker[2:]) % len(chosen)]} if len(chosen) > 1 else {}
    try:
        import pynvml  # optional: the NVIDIA driver's management library

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVML: leave the choice to CUDA; the GPU lock still serialises timing
        return {}
    return {"CUDA_VISIBLE_DEVICES": str(int(worker[2:]) % max(count, 1))} if count else {}


def runs_items(config: pytest.Config) -> bool:
    """Whether this pytest process runs gate items and so needs a worker: not where pytest only
    collects or prints (--collect-only, --help, --markers, --fixtures), nor in a pytest-xdist
    controller (its workers run the items, each with its own).

    The controller is told by xdist's own test on its options, as its session object may not be
    registered yet: plugins configure in no fixed order.
    """
    if any(config.getoption(name, False) for name in _NO_RUN):
        return False
    return config.getoption("dist", "no") == "no" or not config.getoption("tx", None)


def spawn_worker(config: pytest.Config, env: dict[str, str]) -> Worker | None:
    """Start the worker process for this run (``env``: what it is told beside the GPU to use), or
    None where the run needs none (:func:`runs_items`) or the process cannot start:
    :func:`~pytest_cudagate.session.open_worker` then starts one itself and fails as it always did."""
    if not runs_items(config):
        return None
    client = HarnessClient(env={**xdist_device_env(), **env})
    try:
        client.spawn()
    except OSError:
        client.close()
        return None
    return client
