"""Where a gate run keeps its transient arrays, and that none are left behind."""

from __future__ import annotations

import pytest

from fake_worker import FakeKernel, SCALE_PARAMS, honest, install
from helpers import write_suite
from pytest_cudagate.host import paths, trash

pytest_plugins = ["pytester"]


def test_a_named_scratch_folder_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.SCRATCH_ENV, str(tmp_path))
    assert paths.scratch_dir() == str(tmp_path)


def test_a_folder_on_disk_is_not_taken_for_ram(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.SCRATCH_ENV, raising=False)
    monkeypatch.setattr(paths, "RAM_FOLDER", tmp_path)  # a real folder, but no tmpfs mount
    assert paths.scratch_dir() is None


def test_dev_shm_is_used_only_with_room(monkeypatch):
    monkeypatch.delenv(paths.SCRATCH_ENV, raising=False)
    if not paths._is_tmpfs(paths.RAM_FOLDER):
        pytest.skip("no tmpfs at /dev/shm here")
    assert paths.scratch_dir() == str(paths.RAM_FOLDER)
    monkeypatch.setattr(paths, "RAM_FREE_BYTES", 1 << 62)
    assert paths.scratch_dir() is None


def test_a_gate_run_leaves_nothing_in_its_scratch_folder(pytester, monkeypatch):
    write_suite(pytester.path / "scale")
    scratch = pytester.path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv(paths.SCRATCH_ENV, str(scratch))
    install(monkeypatch, pytester.path, {"scale2": FakeKernel(honest, SCALE_PARAMS)})
    seen = []
    real = trash.discard

    def spy(folder):
        seen.append(folder)
        real(folder)

    monkeypatch.setattr(trash, "discard", spy)
    result = pytester.runpytest_inprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider", "scale")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    trash.wait()
    assert list(scratch.iterdir()) == []
    run = next(f for f in seen if f.name.startswith("cudagate-run-"))
    assert run.parent == scratch
    # each case's outputs went as soon as it was judged, before the run's folder
    assert [f.name for f in seen if f.parent.parent == run] == ["small", "perf"]


def test_a_run_that_died_leaves_its_ram_folder_to_the_next_run_to_delete(monkeypatch, tmp_path):
    import os
    import time

    monkeypatch.delenv(paths.SCRATCH_ENV, raising=False)
    monkeypatch.setattr(paths, "RAM_FOLDER", tmp_path)
    monkeypatch.setattr(paths, "_is_tmpfs", lambda folder: True)
    monkeypatch.setattr(paths, "memory_available", lambda: 1 << 40)
    monkeypatch.setattr(paths.shutil, "disk_usage", lambda folder: type("U", (), {"free": 1 << 40})())
    dead = 2 ** 22 + 12345  # above any pid this machine hands out
    old = time.time() - 2 * paths.STALE_S
    names = {"gone": f"{paths.RUN_PREFIX}{dead}-abc", "gone_trash": f".trash-{paths.RUN_PREFIX}{dead}-abc-1-2",
             "recent": f"{paths.RUN_PREFIX}{dead}-new", "alive": f"{paths.RUN_PREFIX}{os.getpid()}-xyz",
             "other": "someone-elses"}
    for key, name in names.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.npy").write_bytes(b"0" * 10)
        if key != "recent":
            os.utime(tmp_path / name, (old, old))
    assert paths.scratch_dir() == str(tmp_path)
    trash.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["recent"], names["alive"], names["other"]])
