"""`cudagate optimize --propose`: a review branch built without touching the working tree; and the Nsight
Compute summary parser."""

from __future__ import annotations

import pytest

git = pytest.importorskip("git")

from optimize_fakes import committed_project, fake_source, write_proposals  # noqa: E402
from pytest_cudagate.errors import CudagateError  # noqa: E402
from pytest_cudagate.optimize.gitpropose import rewrite_launch  # noqa: E402
from pytest_cudagate.optimize.nsight import describe, parse_csv  # noqa: E402
from pytest_cudagate.suite.loader import load_suite  # noqa: E402
from test_loop import optimize  # noqa: E402


@pytest.fixture
def repo(tmp_path):
    return committed_project(tmp_path / "project", git)


def test_propose_commits_the_winner_on_a_new_branch(tmp_path, repo):
    suite = tmp_path / "project" / "kernels" / "scale" / "cudagate.yaml"
    props = write_proposals(tmp_path / "props", [
        {"marker": "latency=0.010", "label": "wider blocks", "launch": {"grid": ["rows"], "block": ["256"]},
         "launch_overrides": {"perf2": {"grid": ["rows"], "block": ["512"]}}}])
    head, branch_before = repo.head.commit.hexsha, repo.active_branch.name
    before = (suite.parent / "scale.cu").read_text()
    code, pack, summary, history, _ = optimize(tmp_path, suite, "--proposer", f"replay:{props}", "--propose")
    assert code == 0
    # the checkout is untouched
    assert repo.head.commit.hexsha == head and repo.active_branch.name == branch_before
    assert not repo.is_dirty(untracked_files=True) and (suite.parent / "scale.cu").read_text() == before
    branch = repo.heads[f"cudagate/optimize-scale-scale2-{pack.name}"]
    commit = branch.commit
    assert [p.hexsha for p in commit.parents] == [head]
    assert sorted(commit.stats.files) == ["kernels/scale/cudagate.yaml", "kernels/scale/scale.cu"]
    assert (commit.tree / "kernels/scale/scale.cu").data_stream.read().decode() == fake_source("latency=0.010")
    yaml_text = (commit.tree / "kernels/scale/cudagate.yaml").data_stream.read().decode()
    assert "# a comment the --propose rewrite must keep" in yaml_text
    assert 'launch: {grid: ["rows"], block: ["256"]}' in yaml_text
    assert 'launch_overrides: {perf2: {grid: ["rows"], block: ["512"]}}' in yaml_text
    assert commit.message.startswith("cudagate optimize: scale/scale2 2.00x faster")
    assert "hidden_77x300 (holdout)" in commit.message and "cudagate sign kernels/scale/cudagate.yaml" in commit.message
    assert "cudagate approve kernels/scale/cudagate.yaml scale2" in commit.message
    assert commit.author.name == "Kernel Author"
    # the proposed suite still loads, with the winner's launch
    checkout = tmp_path / "checkout"
    repo.git.worktree("add", str(checkout), branch.name)
    proposed = load_suite(checkout / "kernels" / "scale" / "cudagate.yaml").kernel("scale2")
    assert proposed.launch.block == ("256",) and proposed.launch_overrides["perf2"].block == ("512",)


def test_propose_refuses_a_dirty_tree(tmp_path, repo):
    suite = tmp_path / "project" / "kernels" / "scale" / "cudagate.yaml"
    (suite.parent / "scale.cu").write_text(fake_source("latency=0.01"))
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    with pytest.raises(CudagateError, match="clean git tree"):
        optimize(tmp_path, suite, "--proposer", f"replay:{props}", "--propose")
    assert not (tmp_path / "results").exists()


def test_no_branch_without_a_winner(tmp_path, repo):
    suite = tmp_path / "project" / "kernels" / "scale" / "cudagate.yaml"
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.030"}])
    code, *_ = optimize(tmp_path, suite, "--proposer", f"replay:{props}", "--propose")
    assert code == 1 and [h.name for h in repo.heads] == [repo.active_branch.name]


def test_rewrite_launch_replaces_only_that_kernel():
    text = ("kernels:\n  - name: a\n    source: a.cu\n    launch: {grid: [n], block: [64]}  # keep me\n"
            "  - name: b\n    source: b.cu\n    launch:\n      grid: [n]\n      block: [32]\n    options: [-O3]\n")
    out = rewrite_launch(text, "b", {"grid": ["cdiv(n, 4)"], "block": ["128"], "shared_bytes": "1024"}, {})
    assert out.startswith("kernels:\n  - name: a\n    source: a.cu\n    launch: {grid: [n], block: [64]}  # keep me\n")
    assert 'launch: {grid: ["cdiv(n, 4)"], block: ["128"], shared_bytes: "1024"}' in out and "options: [-O3]" in out


NCU_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "matmul_f32" - 0: 0%....50%....100% - 9 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","matmul_f32","1","7","(16, 16, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","3.21"
"0","4242","python3.12","127.0.0.1","matmul_f32","1","7","(16, 16, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","10,464"
"0","4242","python3.12","127.0.0.1","matmul_f32","1","7","(16, 16, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","32"
"0","4242","python3.12","127.0.0.1","matmul_f32","1","7","(16, 16, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","41.07"
"0","4242","python3.12","127.0.0.1","matmul_f32","1","7","(16, 16, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","23.93"
"0","4242","python3.12","127.0.0.1","matmul_f32","1","7","(16, 16, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","sm__maximum_warps_per_active_cycle_pct","%","100"
==PROF== Disconnected from process 4242
'''


def test_nsight_csv_summary():
    summary = parse_csv(NCU_CSV)
    assert summary == {"dram_throughput_pct": 3.21, "duration_us": 10.464, "registers_per_thread": 32.0,
                       "sm_throughput_pct": 41.07, "achieved_occupancy_pct": 23.93, "theoretical_occupancy_pct": 100.0}
    text = describe({**summary, "case": "perf_384x256x320"}, {"spill_store_bytes": 0, "spill_load_bytes": 0})
    assert "achieved occupancy 24%" in text and "DRAM throughput 3% of peak" in text and "0 B spill stores" in text
    assert parse_csv("==PROF== ERR_NVGPUCTRPERM") == {}
    assert "no summary" in describe({"error": "ncu not found"})
