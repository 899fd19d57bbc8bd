"""The release gate on a real GPU: a kernel approved again since the release tag, ~10% slower, passes
the PR gate (it is its own approved version) and fails the release gate, which names the tag."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from gpu_support import cli, copy_suite, gate
from test_latency_gate_gpu import slow_down

pytestmark = pytest.mark.gpu

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True)


def approve_and_commit(repo: Path, suite: Path, message: str, tag: str | None = None) -> None:
    result = cli("approve", str(suite / "cudagate.yaml"), "--runs", "2", "--approved-by", "gpu-test", cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    if tag:
        git(repo, "tag", "-a", tag, "-m", tag)


def release_items(repo: Path, suite: Path, report: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    result = gate(suite / "cudagate.yaml", f"--cuda-gate-report={report}", "--cuda-gate-release", cwd=repo)
    items = json.loads((report / "report.json").read_text())["items"]
    return result, [i for i in items if i["kind"] == "performance"]


def test_release_gate_sees_what_the_pr_gate_accepted(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    suite = copy_suite("matmul", repo)
    approve_and_commit(repo, suite, "release", tag="v1.0.0")
    git(repo, "commit", "-q", "--allow-empty", "-m", "after the release")

    result, items = release_items(repo, suite, tmp_path / "unchanged")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"PASSED \S*cudagate\.yaml::matmul_f32::release", out) and "release reference v1.0.0" in out, out
    for item in items:
        assert item["latency"]["release"]["verdict"] == "pass", item["latency"]
        assert item["latency"]["release"]["reason"].startswith("identical to the version approved at v1.0.0")

    slow_down(suite / "matmul.cu")
    approve_and_commit(repo, suite, "a slower kernel, approved")
    result, items = release_items(repo, suite, tmp_path / "slower")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "release gate: latency regressed: current is" in out and "slower than v1.0.0" in out, out
    for item in items:
        assert item["latency"]["verdict"] != "regressed", item["latency"]  # its own approved version
        assert item["latency"]["release"]["verdict"] == "regressed", item["latency"]["release"]
        assert item["latency"]["release"]["reason"] == "v1.0.0" and item["latency"]["release"]["pairs"] > 0
