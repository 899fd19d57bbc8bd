"""GpuLock across processes: exclusion, holder info on timeout, release on death."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_cudagate.errors import GpuLockTimeout
from pytest_cudagate.worker.gpulock import GpuLock, default_lock_dir, read_holder

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses POSIX signals")

REPO = Path(__file__).resolve().parents[2]
GPU = "GPU-8f3c1d2e-0000-4000-8000-000000000001"

# Holds the lock until stdin closes, then releases and exits.
HOLDER = """
import sys
from pathlib import Path
from pytest_cudagate.worker.gpulock import GpuLock
with GpuLock(sys.argv[1], lock_dir=Path(sys.argv[2]), timeout_s=30):
    print("locked", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    procs = []

    def start(gpu_id=GPU):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, gpu_id, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        procs.append(proc)
        # Guard the blocking readline with a generous timeout so a broken child fails the
        # test instead of hanging it.
        timer = threading.Timer(30, proc.kill)
        timer.start()
        line = proc.stdout.readline()
        timer.cancel()
        assert line == "locked\n", f"holder did not take the lock (got {line!r})"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_second_lock_times_out_naming_file_and_holder(tmp_path, holder):
    proc = holder()
    with pytest.raises(GpuLockTimeout) as info:
        with GpuLock(GPU, lock_dir=tmp_path, timeout_s=0.3, poll_s=0.05):
            pytest.fail("acquired a GPU lock held by another process")
    message = str(info.value)
    assert str(tmp_path / f"{GPU}.lock") in message
    assert f"pid {proc.pid}" in message
    assert info.value.holder["pid"] == proc.pid
    assert info.value.path == tmp_path / f"{GPU}.lock"


def test_waiter_gets_lock_once_holder_releases(tmp_path, holder):
    proc = holder()
    threading.Timer(0.3, proc.stdin.close).start()  # holder releases a moment later
    with GpuLock(GPU, lock_dir=tmp_path, timeout_s=30, poll_s=0.05) as lock:
        assert read_holder(lock.path)["pid"] == os.getpid()
    assert proc.wait(timeout=30) == 0


def test_different_gpus_do_not_block(tmp_path, holder):
    holder()
    with GpuLock("GPU-other", lock_dir=tmp_path, timeout_s=0):
        pass


def test_lock_released_when_holder_is_killed(tmp_path, holder):
    proc = holder()
    with pytest.raises(GpuLockTimeout):
        GpuLock(GPU, lock_dir=tmp_path, timeout_s=0).acquire()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with GpuLock(GPU, lock_dir=tmp_path, timeout_s=30, poll_s=0.05):
        pass


def test_same_process_second_lock_is_excluded_and_release_clears_holder(tmp_path):
    first = GpuLock(GPU, lock_dir=tmp_path)
    with first:
        info = read_holder(first.path)
        assert info["pid"] == os.getpid() and info["gpu_id"] == GPU and info["host"]
        with pytest.raises(GpuLockTimeout):
            GpuLock(GPU, lock_dir=tmp_path, timeout_s=0).acquire()
    assert read_holder(first.path) is None
    with GpuLock(GPU, lock_dir=tmp_path, timeout_s=0):
        pass


def test_gpu_id_sanitised_and_lock_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_LOCK_DIR", str(tmp_path / "locks"))
    assert default_lock_dir() == tmp_path / "locks"
    lock = GpuLock("../MIG-GPU-abc/1/0")
    assert lock.path.parent == tmp_path / "locks"
    assert lock.path.name == "_MIG-GPU-abc_1_0.lock"
    with lock:
        assert lock.path.exists()


def test_a_command_kept_waiting_for_the_gpu_says_so_in_one_line(tmp_path, holder, monkeypatch, capsys):
    """`cudagate run` on a card another run holds: one line naming the lock, the wait and the option, exit 3
    as with no GPU (the worker is tests/stub_worker.py, which says hello as card GPU-stub)."""
    from functools import partial

    from bad_input_cases import request
    from pytest_cudagate import session
    from pytest_cudagate.cli import main
    from pytest_cudagate.worker.client import HarnessClient

    proc = holder("GPU-stub")
    monkeypatch.setenv("CUDAGATE_LOCK_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    stub = [sys.executable, str(REPO / "tests" / "stub_worker.py")]
    monkeypatch.setattr(session, "HarnessClient", partial(HarnessClient, command=stub))  # `cudagate run` starts it
    _, args = request(tmp_path / "request", "cudagate", lambda body: body)
    assert main([*args, "--lock-timeout", "0.2"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"cudagate: GPU GPU-stub still locked after 0.2 s: lock file {tmp_path / 'GPU-stub.lock'} "
                          f"is held by pid {proc.pid} "), err
    assert err.endswith("; let that run finish, or wait longer with --lock-timeout S\n"), err
