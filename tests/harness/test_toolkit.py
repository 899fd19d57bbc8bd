"""Finding the CUDA toolkit's binaries: an explicit override, then the PATH, then the toolkit roots."""

from __future__ import annotations

import os

from cudagate_harness.toolkit import find_tool, roots


def _tool(folder, name="ncu"):
    path = folder / "bin" / name
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_override_wins_and_a_missing_override_finds_nothing(tmp_path, monkeypatch):
    tool = _tool(tmp_path / "custom")
    monkeypatch.setenv("CUDAGATE_NCU", str(tool))
    assert find_tool("ncu", "CUDAGATE_NCU") == str(tool)
    monkeypatch.setenv("CUDAGATE_NCU", str(tmp_path / "nope"))
    assert find_tool("ncu", "CUDAGATE_NCU") is None


def test_path_then_cuda_home(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDAGATE_NCU", raising=False)
    home = tmp_path / "cuda"
    tool = _tool(home)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert roots()[0] == home
    assert find_tool("ncu", "CUDAGATE_NCU") == str(tool)
    on_path = _tool(tmp_path / "onpath")
    monkeypatch.setenv("PATH", str(on_path.parent) + os.pathsep + str(tmp_path / "empty"))
    assert find_tool("ncu", "CUDAGATE_NCU") == str(on_path)
