"""Shared headers (issue 42, item 2): a project-level include folder named by ``[tool.cudagate] include``,
and compile errors that name a header as the project holds it (item 1).

The compile items run the real NVRTC (on CPU); the identity checks use the builder the gate uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import KERNEL_CU, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust.base_ref import TrustRoot
from pytest_cudagate.worker.requests import current_version

pytest_plugins = ["pytester"]

UTIL_CUH = """\
#pragma once
#include "detail.cuh"
__device__ inline float twice(float v) { return detail_two() * v; }
"""
DETAIL_CUH = "#pragma once\n__device__ inline float detail_two() { return 2.0f; }\n"
SHARED_KERNEL_CU = KERNEL_CU.replace("extern", '#include "util.cuh"\nextern', 1).replace(
    "2.0f * x[r * cols + c]", "twice(x[r * cols + c])")


def shared_project(root: Path, *, include: str = '["kernels/common"]', kernel: str = SHARED_KERNEL_CU) -> Path:
    """kernels/common/{util,detail}.cuh, shared; the scale suite in kernels/scale includes "util.cuh"."""
    (root / "pytest.ini").write_text("[pytest]\n")
    common = root / "kernels" / "common"
    common.mkdir(parents=True, exist_ok=True)
    (common / "util.cuh").write_text(UTIL_CUH)
    (common / "detail.cuh").write_text(DETAIL_CUH)
    path = write_suite(root / "kernels" / "scale", kernel_source=kernel)
    (root / "pyproject.toml").write_text(f"[tool.cudagate]\ninclude = {include}\n")
    return path


def _gate(pytester, *args):
    return pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider", *args)


def test_a_kernel_includes_headers_of_the_include_folder(pytester):
    shared_project(pytester.path)
    result = _gate(pytester, "-v")
    result.stdout.fnmatch_lines(["*kernels/scale/cudagate.yaml::scale2::compile PASSED*"])


def test_the_kernels_own_folder_comes_before_the_include_folders(tmp_path):
    suite = load_suite(shared_project(tmp_path))
    (tmp_path / "kernels" / "scale" / "detail.cuh").write_text("#pragma once\n__device__ inline float detail_two() "
                                                                "{ return 3.0f; }\n")
    headers = current_version(suite.kernels[0]).headers
    assert headers["util.cuh"] == UTIL_CUH and "3.0f" in headers["detail.cuh"]


def test_editing_a_shared_header_makes_every_kernel_including_it_non_identical(tmp_path):
    path = shared_project(tmp_path)
    write_suite(tmp_path / "kernels" / "other", kernel_source=SHARED_KERNEL_CU)
    before = [current_version(load_suite(p).kernels[0]).identity for p in (path, tmp_path / "kernels/other/cudagate.yaml")]
    assert set(before[0]["headers"]) == {"util.cuh", "detail.cuh"}
    (tmp_path / "kernels" / "common" / "detail.cuh").write_text(DETAIL_CUH.replace("2.0f", "2.0f + 0.0f"))
    after = [current_version(load_suite(p).kernels[0]).identity for p in (path, tmp_path / "kernels/other/cudagate.yaml")]
    assert all(a["headers"]["detail.cuh"] != b["headers"]["detail.cuh"] for a, b in zip(after, before))


@pytest.mark.parametrize("where, shown", [
    ("common", "kernels/common/detail.cuh(2): error: identifier \"undefined_two\" is undefined"),
    ("suite", "kernels/scale/inner/detail.cuh(2): error: identifier \"undefined_two\" is undefined"),
])
def test_a_compile_error_in_a_header_names_it_as_the_project_holds_it(pytester, where, shown):
    broken = DETAIL_CUH.replace("return 2.0f;", "return undefined_two;")
    if where == "common":
        shared_project(pytester.path)
        (pytester.path / "kernels" / "common" / "detail.cuh").write_text(broken)
    else:
        write_suite(pytester.path / "kernels" / "scale", kernel_source='#include "inner/detail.cuh"\n' + KERNEL_CU)
        (pytester.path / "kernels" / "scale" / "inner").mkdir()
        (pytester.path / "kernels" / "scale" / "inner" / "detail.cuh").write_text(broken)
    result = _gate(pytester)
    result.stdout.fnmatch_lines([f"*{shown}*"])
    assert "cudagate-headers-" not in result.stdout.str()


def test_climbing_into_the_include_folder_is_refused_with_the_name_to_use(tmp_path, capsys):
    path = shared_project(tmp_path, kernel=SHARED_KERNEL_CU.replace('"util.cuh"', '"../common/util.cuh"'))
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = "".join(capsys.readouterr())
    assert 'scale.cu:1: #include "../common/util.cuh" leads to' in err
    assert 'it lies in the include folder' in err and 'include it as "util.cuh"' in err


@pytest.mark.parametrize("include, fix", [
    ('["../outside"]', "tool.cudagate.include: '../outside' must be a path below the project root"),
    ('"kernels/common"', "tool.cudagate.include: expected a list of relative paths (strings)"),
    ('["kernels/missing"]', "tool.cudagate.include: 'kernels/missing' is not a folder of the project"),
    ('["kernels/out"]', "tool.cudagate.include: 'kernels/out' leads out of the project"),
], ids=["outside", "not a list", "missing", "link out"])
def test_a_bad_include_setting_is_refused_in_one_line(tmp_path, capsys, include, fix):
    root = tmp_path / "project"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    path = shared_project(root, include=include)
    (root / "kernels" / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = "".join(capsys.readouterr())
    assert "pyproject.toml" in err and fix in err


@pytest.mark.parametrize("target", [".git", "."], ids=["git folder", "project root"])
def test_an_include_folder_that_a_pull_request_makes_a_link_is_refused(tmp_path, capsys, target):
    """The trusted setting names kernels/common; the checkout's kernels/common is a link to .git (whose
    config holds the checkout's token) or to the root: neither is searched for headers."""
    path = shared_project(tmp_path, kernel='#include "config"\n' + SHARED_KERNEL_CU)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[http]\n\textraheader = AUTHORIZATION: basic c2VjcmV0\n")
    common = tmp_path / "kernels" / "common"
    for file in common.iterdir():
        file.unlink()
    common.rmdir()
    common.symlink_to(tmp_path / target, target_is_directory=True)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = "".join(capsys.readouterr())
    assert "tool.cudagate.include: 'kernels/common' passes through the link 'kernels/common'" in err, err
    assert "c2VjcmV0" not in err and "extraheader" not in err


def test_an_include_folder_in_git_or_at_the_root_is_refused(tmp_path, capsys):
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    path = shared_project(tmp_path, include='["kernels/common", ".git/hooks"]')
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    assert "tool.cudagate.include: '.git/hooks' is the project's root or lies in .git" in "".join(capsys.readouterr())


def test_a_link_inside_the_include_folder_that_leads_out_of_it_is_refused(tmp_path, capsys):
    path = shared_project(tmp_path)
    (tmp_path / "secret.cuh").write_text("#pragma once\n")
    (tmp_path / "kernels" / "common" / "detail.cuh").unlink()
    (tmp_path / "kernels" / "common" / "detail.cuh").symlink_to(tmp_path / "secret.cuh")
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    assert "outside the include folder" in "".join(capsys.readouterr())


def test_under_a_trust_root_the_include_setting_is_the_trusted_commits(tmp_path):
    """The pull request's pyproject.toml may name other include folders; the trusted commit's are used."""
    (tmp_path / "kernels" / "pr").mkdir(parents=True)
    shared_project(tmp_path, include='["kernels/pr"]')
    root = TrustRoot(ref="0" * 40, worktree=tmp_path, keys=None, policy={"include": ["kernels/common"]})
    assert root.settings().include_folders() == (tmp_path / "kernels" / "common",)
