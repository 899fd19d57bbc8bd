"""A pull request may put a link to /dev/zero where a signed file belongs: the case data, a pinned
approved source. Each is refused by name, never read (the read would not end, or would fill memory).
Bytecode beside the Python reference is never read at all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_worker import fake_gpu_project
from helpers import write_suite
from test_attacks import Repo
from trust_project import clean_env, project  # noqa: F401 - fixtures
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT, FileError

pytestmark = pytest.mark.usefixtures("clean_env")
pytest_plugins = ["pytester"]
NOT_REGULAR = "not a regular file (a device, FIFO or folder, or a link to one)"


def test_a_case_file_that_is_a_link_to_a_device_is_refused_by_name(project):
    case = sorted((project.suite_dir / "cases").rglob("*.npy"))[0]
    case.unlink()
    case.symlink_to("/dev/zero")
    result = project.verify()
    relative = case.relative_to(project.suite_dir).as_posix()
    assert not result.ok
    assert f"{relative}: the signed file is {NOT_REGULAR}; replace it with the file itself" in result.problems


def test_bytecode_beside_the_reference_that_is_a_link_to_a_device_is_never_read(project):
    cache = project.suite_dir / "__pycache__"
    cache.mkdir()
    (cache / "reference.cpython-311.pyc").symlink_to("/dev/zero")
    assert project.verify().ok


def test_an_approved_source_that_is_a_link_to_a_device_is_refused(project):
    approved = project.suite_dir / "approved"
    approved.mkdir()
    (approved / ("0" * 64 + ".cu")).symlink_to("/dev/zero")
    with pytest.raises(FileError, match=re.escape("the approved source is " + NOT_REGULAR)):
        Ledger.for_suite(project.load()).read_blob(f"approved/{'0' * 64}.cu")


# -- links to folders in the gated paths (issue 41, item 6) ------------------------------------------------------------
# pytest's collection follows a link to a folder: `loop -> .` judged the suite 41 times, one to / walked the whole disk
# with the GPU's lock held. Each is refused in one line naming the link and the fix, before collection.
FIX = "replace it with a real folder, or remove it"
GATES = ("cudagate follows no link to a folder in the paths it gates (pytest would collect what it leads to: the "
         "suites again, or the whole disk)")
def gated_project(pytester) -> Path:
    """The scale suite in kernels/scale, on the fake GPU: the lock would be taken at the first suite collected.
    Beside it, links where pytest does not collect, which are left alone: a virtual environment's
    lib64 -> lib, links in a hidden folder."""
    fake_gpu_project(pytester.path)
    for env in (".venv", "kernels/venv"):
        (pytester.path / env / "lib").mkdir(parents=True)
        (pytester.path / env / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (pytester.path / env / "lib64").symlink_to("lib")
    (pytester.path / "kernels" / ".cache").mkdir()
    (pytester.path / "kernels" / ".cache" / "root").symlink_to("/")
    return write_suite(pytester.path / "kernels" / "scale").parent


@pytest.mark.parametrize("links, shown", [
    ({"loop": "."}, "kernels/scale/loop: a link to a folder (it leads to .)"),
    ({"a": ".", "b": ".."}, "kernels/scale/a, kernels/scale/b: 2 links to folders (the first leads to .)"),
    ({"root": "/"}, "kernels/scale/root: a link to a folder (it leads to /)"),
], ids=["loop", "two links", "root"])
def test_pytest_refuses_a_link_to_a_folder_before_collection_and_the_gpu_lock(pytester, links, shown):
    folder = gated_project(pytester)
    for name, target in links.items():
        (folder / name).symlink_to(target)
    began = time.perf_counter()
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "kernels", timeout=60)
    took = time.perf_counter() - began
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    [line] = [line for line in result.errlines if line.strip()]
    assert line.startswith(f"ERROR: {shown}; ") and line.endswith(FIX), line
    assert "collected" not in result.stdout.str()
    assert not (pytester.path / ".locks").exists()  # no worker opened, no GPU lock taken
    assert took < 30, took  # pytest's start-up; the link itself costs one stat (measured: 2.5-4 s in all here)


def test_a_link_on_the_way_to_a_named_suite_is_refused_too(pytester):
    folder = gated_project(pytester)
    (pytester.path / "alias").symlink_to(folder)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "alias/cudagate.yaml::scale2", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "ERROR: alias: a link to a folder" in result.stderr.str()


def test_cudagate_check_refuses_a_link_to_a_folder_in_one_line(tmp_path, capsys, monkeypatch):
    folder = write_suite(tmp_path / "kernels" / "scale", data=False).parent
    (folder / "loop").symlink_to(".")
    (tmp_path / "kernels" / ".venv" / "lib").mkdir(parents=True)  # where pytest collects nothing: left alone
    (tmp_path / "kernels" / ".venv" / "lib64").symlink_to("lib")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--allow-unsigned", "kernels"]) == EXIT_INPUT
    out = capsys.readouterr()
    assert out.err == f"cudagate: kernels/scale/loop: a link to a folder (it leads to .); {GATES}: {FIX}\n", out.err
    assert out.out == ""


@pytest.mark.slow
def test_cudagate_gate_refuses_a_link_to_root_in_the_trusted_suites_at_once(tmp_path):
    repo = Repo(tmp_path)
    (repo.suite_dir / "everything").symlink_to("/")
    began = time.perf_counter()
    code, out = repo.gate("-q")
    took = time.perf_counter() - began
    assert code == EXIT_INPUT, out
    assert out == f"cudagate: softmax/everything: a link to a folder (it leads to /); {GATES}: {FIX}\n", out
    assert took < 30, took
    # without --trusted-ref the gate is pytest's: refused there, before collection
    done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           "gate", "--", "-q", "softmax"], cwd=repo.path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "CUDAGATE_CACHE_DIR": str(repo.cache)})
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"ERROR: softmax/everything: a link to a folder (it leads to /); {GATES}: {FIX}" in done.stderr
    assert "collected" not in done.stdout


def test_a_kernel_source_that_links_to_itself_is_refused_in_one_line(pytester, capsys):
    """Path.resolve raised RuntimeError("Symlink loop") on Python 3.10 to 3.12, before any report."""
    folder = gated_project(pytester)
    (folder / "scale.cu").unlink()
    (folder / "scale.cu").symlink_to("scale.cu")
    problem = ("line 14: kernels[0].source: 'scale.cu' is a link that leads to no file (a loop of links, or a missing "
               "target); replace it with the file itself")
    assert main(["check", "--allow-unsigned", str(folder)]) == EXIT_INPUT
    assert f"  - {problem}\n" in capsys.readouterr().err
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "kernels", timeout=60)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert f"  - {problem}" in result.outlines and "RuntimeError" not in result.stdout.str(), result.stdout.str()
