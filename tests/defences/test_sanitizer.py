"""A sanitizer without a verdict is not a pass (issue 28, route 6; issue 32's hang): a stand-in
``compute-sanitizer`` that exits oddly, leaves a log without its summary or hangs. Under a trust
root the case fails saying why; without one it passes with a warning; no such run is cached as
clean; and a hanging tool is killed, with its process group, at the case timeout plus the
instrumented start (at most twice the case timeout), once per run."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, install
from helpers import fake_compute_sanitizer, write_suite
from test_attacks import Repo
from test_hardening_gate import Fingerprint, kernels_for
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite

ANSWER = 'print(json.dumps({"type": "case", "status": "ok"}))'
FAKES = {
    # the harness answered, the tool's log is not a compute-sanitizer report
    "garbage": f'Path(log).write_text("\\x00\\x7fnot a report\\n"); {ANSWER}',
    "exit7": f'Path(log).write_text("========= COMPUTE-SANITIZER\\n"); {ANSWER}; sys.exit(7)',
    # an instrumented child that would outlive the tool, then a tool that never ends
    "hang": 'child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]); '
            '(here / "child.pid").write_text(str(child.pid)); time.sleep(600)',
    "clean": f'Path(log).write_text("========= ERROR SUMMARY: 0 errors\\n"); {ANSWER}',
}
NO_VERDICT = {"garbage": "its log has no summary line (missing, unreadable or cut short)",
              "exit7": "exit code 7: ========= COMPUTE-SANITIZER"}
REQUIRED = ": under --trusted-ref a sanitizer without a verdict fails the case"
WARNED = ": not a pass (under --trusted-ref it fails the case)"


def fake_sanitizer(folder: Path, mode: str) -> Path:
    """A stand-in ``compute-sanitizer`` behaving as ``mode``; it notes each tool it is started for."""
    return fake_compute_sanitizer(folder, FAKES[mode])


def calls(folder: Path) -> list[str]:
    path = folder / "calls.txt"
    return path.read_text().split() if path.is_file() else []


@pytest.fixture
def scale(tmp_path):
    return load_suite(write_suite(tmp_path / "scale"))


def replay(suite, out: Path, *, trusted: bool, timeout_s: float = 60.0):
    """The gate's judgement of each case (Gate.replay, as the items run it) on a fake GPU."""
    worker = FakeWorker(kernels_for(suite), timeout_s=timeout_s)
    gate = Gate(worker, Fingerprint(), GateOptions(fresh_seed=3, trusted=trusted), out)
    program = dataclasses.replace(suite.kernels[0], name="scale2", entry="scale2")
    return {case.name: gate.replay(suite, program, case, Ledger.for_suite(suite)) for case in suite.cases}


@pytest.mark.parametrize("mode", sorted(NO_VERDICT))
def test_no_verdict_fails_the_case_under_a_trust_root(scale, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(fake_sanitizer(tmp_path / "bin", mode)))
    small = replay(scale, tmp_path / "out", trusted=True)["small"]
    assert small.failed, small.warning
    for tool in ("memcheck", "racecheck", "initcheck"):
        assert f"compute-sanitizer {tool} gave no verdict: {NO_VERDICT[mode]}{REQUIRED}" in small.message, small.message


@pytest.mark.parametrize("mode", sorted(NO_VERDICT))
def test_without_a_trust_root_no_verdict_is_a_warning_and_is_never_cached(scale, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(fake_sanitizer(tmp_path / "bin", mode)))
    outcomes = replay(scale, tmp_path / "out", trusted=False)
    small = outcomes["small"]
    assert not small.failed, small.message
    assert f"compute-sanitizer memcheck gave no verdict: {NO_VERDICT[mode]}{WARNED}" in small.warning, small.warning
    assert "gave no verdict" not in (outcomes["perf"].warning or "")  # once per kernel, on its smallest case
    started = calls(tmp_path / "bin")
    replay(scale, tmp_path / "again", trusted=False)  # not read back as clean: the tools run again
    assert sorted(calls(tmp_path / "bin")) == sorted(started * 2)


def test_a_clean_report_still_passes_under_a_trust_root(scale, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(fake_sanitizer(tmp_path / "bin", "clean")))
    small = replay(scale, tmp_path / "out", trusted=True)["small"]
    assert not small.failed and "compute-sanitizer" not in (small.warning or ""), (small.message, small.warning)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie no one reaped yet
    except (OSError, IndexError):
        return True


def test_a_hanging_sanitizer_is_killed_at_the_case_timeout_plus_its_start_once_per_run(scale, tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(fake_sanitizer(folder, "hang")))
    began = time.perf_counter()
    small = replay(scale, tmp_path / "out", trusted=True, timeout_s=2)["small"]
    took = time.perf_counter() - began
    assert 3 <= took < 2 * 2 + 5, took  # the three tools side by side, stopped at 2 s + 1 s (the start: at most half)
    assert small.failed
    assert ("compute-sanitizer racecheck gave no verdict: timed out after 3 s (the case timeout 2 s + 1 s for the "
            f"instrumented start); a kernel under instrumentation must finish{REQUIRED}") in small.message, \
        small.message
    assert gone(int((folder / "child.pid").read_text()))  # killed with the tool's process group

    started = calls(folder)
    began = time.perf_counter()
    again = replay(scale, tmp_path / "again", trusted=True, timeout_s=2)["small"]
    assert time.perf_counter() - began < 2 and calls(folder) == started  # the timeout is not paid twice in a run
    assert again.failed and "timed out after 3 s" in again.message


# -- end to end: `cudagate gate --trusted-ref` on a fake GPU --------------------------------------------------
def softmax(launch) -> None:
    """In float32, as the kernel computes it (within the suite's rtol 1e-4), and a few times faster than
    float64 over the thousands of timed launches of the perf cases."""
    rows, cols = launch.args["rows"], launch.args["cols"]
    x = launch.array("x", np.float32, rows * cols).reshape(rows, cols)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    launch.array("y", np.float32, rows * cols)[:] = e.reshape(-1)


def test_the_trusted_gate_fails_a_case_without_a_sanitizer_verdict(tmp_path, monkeypatch, capsys):
    repo = Repo(tmp_path)
    repo.commit("pull request: no change")
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(fake_sanitizer(tmp_path / "bin", "exit7")))
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(repo.cache))
    install(monkeypatch, tmp_path, {"softmax_rows": FakeKernel(softmax, SCALE_PARAMS)})
    code = main(["gate", "--repo", str(repo.path), "--trusted-ref", repo.base, "--", "-rf", "softmax"])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code != 0, out
    assert (f"compute-sanitizer memcheck gave no verdict: exit code 7: ========= COMPUTE-SANITIZER{REQUIRED}"
            in out), out
    # each kernel's smallest case, where it is sanitized, fails; its other cases pass
    assert "softmax/cudagate.yaml::softmax_rows::correct_7x33" in out and "2 failed, 10 passed" in out, out
