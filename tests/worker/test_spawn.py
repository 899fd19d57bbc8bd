"""The harness worker's process starts at the start of a `--cuda-gate` configure, before collection,
and `open_worker` takes it over: one process per pytest process that runs items, none where nothing
runs, the same skip or failure without a GPU, and nothing left running however pytest ends.

The worker is tests/stub_worker.py behind the real client, spied on in the project's conftest: it
logs each spawn (with the xdist worker and its CUDA_VISIBLE_DEVICES), each hello, pytest's
collection, and at the process's exit every worker process still alive.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import write_suite

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]
CONFTEST = """
import atexit
import os
import signal
import sys
import types

import pytest

from pytest_cudagate.worker.client import HarnessClient
import pytest_cudagate.session as gate_session
from pytest_cudagate.worker import spawn

LOG = os.path.join(os.path.dirname(__file__), "events.log")
PIDS = []
# Two GPUs for NVML: xdist worker gwN gets CUDA_VISIBLE_DEVICES=N.
sys.modules["pynvml"] = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2)


def note(*words):
    with open(LOG, "a") as log:
        log.write(" ".join(str(w) for w in words) + "\\n")


class Spied(HarnessClient):
    def spawn(self):
        super().spawn()
        PIDS.append(self.proc.pid)
        note("spawn", os.environ.get("PYTEST_XDIST_WORKER", "main"), self.env.get("CUDA_VISIBLE_DEVICES", "-"))

    def start(self):
        try:
            hello = super().start()
        except Exception as exc:
            note("unavailable")
            raise
        PIDS.append(hello["pid"])
        note("hello", hello["pid"])
        return hello


# both places a run starts a worker: the plugin's early spawn, and open_worker when none was spawned
gate_session.HarnessClient = spawn.HarnessClient = lambda **options: Spied(
    command=[sys.executable, {stub!r}, os.environ["STUB_MODE"]], **options)


def pytest_collection(session):
    note("collection")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if os.environ.get("END_AT") == "configure":
        raise KeyboardInterrupt


def pytest_collection_finish(session):
    if os.environ.get("END_AT") == "interrupt":
        raise KeyboardInterrupt
    if os.environ.get("END_AT") == "internal":
        raise RuntimeError("a plugin's bug")


@atexit.register
def leftovers():
    for pid in set(PIDS):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        note("alive", pid)
        os.killpg(pid, signal.SIGKILL)
"""


@pytest.fixture()
def project(pytester, monkeypatch):
    write_suite(pytester.path / "scale")
    (pytester.path / "conftest.py").write_text(CONFTEST.format(stub=str(TESTS / "stub_worker.py")))
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")  # what a run without the gate collects
    monkeypatch.setenv("CUDAGATE_LOCK_DIR", str(pytester.path / "locks"))
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    for name in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER"):  # this test run's own xdist worker
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STUB_MODE", "answer")
    monkeypatch.setenv("STUB_START_S", "0.5")  # CUDA's start, during which pytest goes on
    return pytester


def gate(pytester, *args: str):
    result = pytester.runpytest_subprocess("--cuda-gate-allow-unsigned", "-p", "no:cacheprovider", *args, timeout=120)
    log = pytester.path / "events.log"
    return result, log.read_text().split("\n")[:-1] if log.exists() else []


def test_the_worker_process_starts_before_collection_and_open_worker_takes_it_over(project):
    result, events = gate(project, "--cuda-gate", "--cuda-gate-durations", "0")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert [e.split()[0] for e in events] == ["spawn", "collection", "hello"]
    assert events[0] == "spawn main -"
    result.stdout.fnmatch_lines(["fingerprint *: Stub GPU (sm_90)*"])


@pytest.mark.parametrize("args", [("--cuda-gate", "--collect-only"), ("--cuda-gate", "--help"),
                                  ("--cuda-gate", "--fixtures"), ()], ids=["collect-only", "help", "fixtures", "gate-off"])
def test_no_worker_where_no_item_runs(project, args):
    result, events = gate(project, *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert not [e for e in events if e.split()[0] in ("spawn", "hello")]


@pytest.mark.slow
def test_under_xdist_each_worker_spawns_on_its_own_card_and_the_controller_none(project):
    pytest.importorskip("xdist")
    result, events = gate(project, "--cuda-gate", "-n", "2")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert sorted(e for e in events if e.startswith("spawn")) == ["spawn gw0 0", "spawn gw1 1"]
    assert len([e for e in events if e.startswith("hello")]) == 2 and not [e for e in events if "alive" in e]


@pytest.mark.parametrize("mode, require, expected, ret", [
    ("nogpu", (), "SKIPPED [[]2[]] *no CUDA device (stub)*", pytest.ExitCode.OK),
    pytest.param("nogpu", ("--cuda-gate-require-gpu",), "*no CUDA device (stub) (--cuda-gate-require-gpu is set)*",
                 pytest.ExitCode.TESTS_FAILED, marks=pytest.mark.slow),
    pytest.param("silent", (), "SKIPPED [[]2[]] *no CUDA device: the harness worker did not start*", pytest.ExitCode.OK,
                 marks=pytest.mark.slow),
])
def test_a_worker_without_a_gpu_ends_as_it_always_did(project, monkeypatch, mode, require, expected, ret):
    monkeypatch.setenv("STUB_MODE", mode)
    result, events = gate(project, "--cuda-gate", "-rs", *require)
    assert result.ret == ret, result.stdout.str()
    result.stdout.fnmatch_lines([expected])
    assert [e.split()[0] for e in events] == ["spawn", "collection", "unavailable"]


@pytest.mark.parametrize("end_at, pyproject, ret", [
    ("", "[tool.cudagate]\ntimeout_s = \"soon\"\n", pytest.ExitCode.USAGE_ERROR),
    pytest.param("configure", "", pytest.ExitCode.INTERRUPTED, marks=pytest.mark.slow),
    ("interrupt", "", pytest.ExitCode.INTERRUPTED),
    pytest.param("internal", "", pytest.ExitCode.INTERNAL_ERROR, marks=pytest.mark.slow),
], ids=["usage-error", "ctrl-c-in-configure", "ctrl-c-in-collection", "internalerror"])
def test_nothing_is_left_running_when_pytest_ends_early(project, monkeypatch, end_at, pyproject, ret):
    monkeypatch.setenv("END_AT", end_at)
    if pyproject:
        (project.path / "pyproject.toml").write_text(pyproject)
    result, events = gate(project, "--cuda-gate")
    assert result.ret == ret, result.stdout.str() + result.stderr.str()
    assert events and events[0].startswith("spawn")
    assert not [e for e in events if e.startswith("alive")], events


@pytest.mark.slow
def test_worker_wait_is_what_the_first_item_waits(project, monkeypatch):
    """A worker 3 s from its hello: configure and collection take well under a second of it, the rest
    is the first item's wait."""
    monkeypatch.setenv("STUB_START_S", "3")
    result, _ = gate(project, "--cuda-gate", "--cuda-gate-durations", "0")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    wait = next(float(line.split()[0]) for line in result.outlines if line.split()[1:2] == ["worker_wait"])
    configure = next(float(line.split()[0]) for line in result.outlines if line.split()[1:2] == ["configure"])
    assert 3 - configure - 1.0 < wait < 3.5, result.stdout.str()


if sys.platform == "win32":  # the spy's process checks use POSIX signals
    pytestmark = pytest.mark.skip(reason="POSIX only")
