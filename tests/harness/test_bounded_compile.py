"""Bounded compiles (issue 28, route 7): a compile bomb is stopped at the case timeout or at the
compiler child's memory cap, with one line naming the kernel and its source, and a failed compile is
not started again in the same run: on the host (compile items) and in the worker (case items).
Real NVRTC: the PyPI NVRTC compiles on the CPU."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from cudagate_harness import compiler
from cudagate_harness.request_checks import request_problems
from fake_worker import fake_gpu_project
from helpers import BROKEN_CU, KERNEL_CU, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.build import compile_program
from pytest_cudagate.worker.client import HarnessClient
from test_attacks import Repo

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TESTS = Path(__file__).resolve().parents[1]
TAIL = "a source that expands this much is refused"
pytest_plugins = ["pytester"]


def bomb(entry: str, params: str, tag: str) -> str:
    """14 levels of doubling macros (~0.5 KB): 16384 dependent statements, minutes and gigabytes of
    NVRTC (the issue's bomb). ``tag`` keeps each test's source, and so its compile, its own."""
    levels = ["#define A0 acc = sinf(acc) * acc + acc / (acc + 1.0f);",
              *(f"#define A{i} A{i - 1} A{i - 1}" for i in range(1, 15))]
    return "\n".join([f"// {tag}", *levels, f'extern "C" __global__ void {entry}({params})',
                      "{", "    float acc = threadIdx.x;", "    A14", "    y[threadIdx.x] = acc;", "}", ""])


def scale_bomb(tag: str) -> str:
    return bomb("scale2", "const float* x, float* y, int rows, int cols", tag)


def program(tmp_path: Path, source: str):
    return load_suite(write_suite(tmp_path / "scale", kernel_source=source, data=False)).kernels[0]


@pytest.fixture
def starts(monkeypatch) -> list:
    """Every compiler child started in this process."""
    started = []
    real = compiler.subprocess.run

    def run(command, **kwargs):
        started.append(command)
        return real(command, **kwargs)

    monkeypatch.setattr(compiler.subprocess, "run", run)
    return started


def test_a_bomb_stops_at_the_case_timeout_and_its_second_compile_starts_no_nvrtc(tmp_path, monkeypatch, starts):
    monkeypatch.setenv("CUDAGATE_COMPILE_MEMORY_MB", "16384")  # the time limit, not the cap, stops it here
    kernel = program(tmp_path, scale_bomb("time"))
    began = time.perf_counter()
    first = compile_program(kernel, "sm_90", timeout_s=3)
    took = time.perf_counter() - began
    assert not first.ok and 3 <= took < 6, (took, first.log)
    source = display_path(kernel.source)
    assert first.log == f"compile of scale2 ({source}): stopped after 3 s (the case timeout): {TAIL}"
    assert len(starts) == 1

    began = time.perf_counter()
    again = compile_program(kernel, "sm_90", timeout_s=3)
    assert time.perf_counter() - began < 0.5 and len(starts) == 1  # from this run's memory of the failure
    assert not again.ok and again.cache_hit and again.log == first.log
    assert not any(compiler.cache_dir().glob(f"{first.key}*"))  # never on disk: the next run tries again


def test_a_bomb_stops_at_the_memory_cap_that_the_environment_sets(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_COMPILE_MEMORY_MB", "384")  # a normal compile's address space peaks near 200 MiB
    kernel = program(tmp_path, scale_bomb("memory"))
    began = time.perf_counter()
    result = compile_program(kernel, "sm_90", timeout_s=120)
    assert time.perf_counter() - began < 60
    assert not result.ok
    assert result.log.endswith("scale.cu): ran out of its 384 MiB memory cap ($CUDAGATE_COMPILE_MEMORY_MB sets "
                               f"another): {TAIL}"), result.log
    assert result.log.startswith("compile of scale2 (")


def test_a_bad_memory_cap_is_one_line_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_COMPILE_MEMORY_MB", "lots")
    result = compile_program(program(tmp_path, KERNEL_CU), "sm_90")
    assert not result.ok
    assert result.log == ("$CUDAGATE_COMPILE_MEMORY_MB='lots' is not a whole number of MiB from 1 to 16777216: set it "
                          "to the compiler's memory cap (for example 4096), or unset it for 2048")


@pytest.mark.parametrize("suite", sorted(p.parent.name for p in EXAMPLES.glob("*/cudagate.yaml")))
def test_the_examples_compile_under_the_default_cap(suite, monkeypatch):
    monkeypatch.delenv("CUDAGATE_COMPILE_MEMORY_MB", raising=False)
    loaded = load_suite(EXAMPLES / suite / "cudagate.yaml")
    for kernel in loaded.kernels:
        for build in kernel.builds(loaded.cases):
            result = compile_program(build, "sm_90", timeout_s=60)
            assert result.ok, result.log


def test_an_ordinary_compile_error_is_not_compiled_again_either(tmp_path, starts):
    kernel = program(tmp_path, BROKEN_CU + "// once\n")
    first = compile_program(kernel, "sm_90", timeout_s=30)
    again = compile_program(kernel, "sm_90", timeout_s=30)
    assert not first.ok and "undefined_value_here" in first.log
    assert again.log == first.log and again.cache_hit and len(starts) == 1


# -- the worker: its compiles stop inside the request's timeout, before the client's watchdog ------------
WORKER = f"""
import sys
sys.path[:0] = [{str(TESTS)!r}]
from fake_worker import FakeDevice
from cudagate_harness import worker
worker.Device = FakeDevice  # the real worker and compiler on a simulated GPU
sys.exit(worker.main())
"""


def test_the_worker_answers_a_bomb_as_stopped_before_the_clients_watchdog(tmp_path):
    request = {"op": "compile", "kernel": {"source": scale_bomb("worker"), "entry": "scale2", "source_name": "bomb.cu"}}
    with HarnessClient(timeout_s=4, command=[sys.executable, "-c", WORKER],
                       env={"CUDAGATE_COMPILE_MEMORY_MB": "16384"}) as client:
        client.start()
        began = time.perf_counter()
        first = client.run(request)
        took = time.perf_counter() - began
        began = time.perf_counter()
        again = client.run(request)
        again_took = time.perf_counter() - began
        assert client.restarts == 0  # answered, not killed by the watchdog
    assert first.compile["log"] == ("compile of scale2 (bomb.cu): stopped after 3 s (inside the request's 4 s "
                                    f"timeout): {TAIL}")
    assert not first.compile["ok"] and 3 <= took < 4
    assert again.compile["log"] == first.compile["log"] and again.compile["cache_hit"] and again_took < 0.5


def test_a_request_file_with_a_bad_timeout_is_refused():
    assert request_problems({"timeout_s": "soon"}) == ["timeout_s: 'soon' is not a number of seconds in (0, 86400]"]
    assert request_problems({"timeout_s": 0}) and request_problems({"timeout_s": True})
    assert request_problems({"timeout_s": 5}) == []


# -- end to end: the gate on a pull request that brings a bomb ---------------------------------------------
@pytest.mark.slow
def test_the_gate_stops_a_bomb_in_its_compile_item_within_the_case_timeout(tmp_path):
    repo = Repo(tmp_path)
    (repo.suite_dir / "softmax_alt.cu").write_text(bomb("softmax_rows", "const float* x, float* y, int rows, int cols",
                                                        "gate"))
    began = time.perf_counter()
    code, out = repo.gate("--cuda-gate-timeout", "5", "-rfs")
    took = time.perf_counter() - began
    assert code != 0, out
    assert "softmax_alt.cu does not compile" in out, out
    stopped = ("compile of softmax_rows (softmax/softmax_alt.cu): stopped after 5 s (the case timeout)",
               "compile of softmax_rows (softmax/softmax_alt.cu): ran out of its 2048 MiB memory cap")
    assert any(line in out for line in stopped) and TAIL in out, out
    assert "1 failed, 1 passed" in out, out  # the honest kernel's compile item still passes
    assert took < 30, took  # one bounded compile (compile_ahead's), which the compile item reads back


# -- a header the host cannot carry: one line in the compile item, as in `cudagate check` (issue 41, fuzz 9) ---------
BAD_HEADERS = {  # suite -> (include, the one line after `scale.cu:1: #include "...": `)
    "long": ("a" * 5000 + ".cuh", "cannot be looked up (File name too long); name a header of the suite folder that "
                                  "the file system can open"),
    "big": ("big.cuh", f"the CUDA header is {5 << 20} bytes, over the 4194304-byte limit; is it the right file?"),
    "latin1": ("latin1.cuh", "line 1 (byte 6): not UTF-8 text; save the CUDA header as UTF-8"),
    "npy": ("cases/small/x.npy", "line 1 (byte 0): not UTF-8 text; save the CUDA header as UTF-8"),
    "loop": ("loop.cuh", "a link that leads to no file (a loop of links, or a missing target); replace it with the "
                         "header itself"),
}


def bad_header_suites(root: Path) -> dict[str, str]:
    """One scale suite per entry of BAD_HEADERS under ``root``; each line its compile item must show."""
    lines = {}
    for name, (include, problem) in BAD_HEADERS.items():
        folder = write_suite(root / name).parent
        (folder / "scale.cu").write_text(f'#include "{include}"\n' + KERNEL_CU)
        if name == "big":
            (folder / include).write_bytes(b"/" * (5 << 20))
        elif name == "latin1":
            (folder / include).write_bytes(b"// caf\xe9\n")
        elif name == "loop":
            (folder / include).symlink_to(include)
        shown = include if len(include) < 160 else f"{include[:80]}…{include[-80:]}"
        lines[name] = f'scale.cu:1: #include "{shown}": {problem}'
    return lines


def test_a_header_the_host_cannot_carry_fails_its_items_in_one_line(pytester):
    """Its compile item, and its case items on a (simulated) GPU, which meet the same headers."""
    lines = bad_header_suites(pytester.path)
    fake_gpu_project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           *BAD_HEADERS, timeout=120)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "Traceback" not in out and not re.search(r"^E\s", out, re.MULTILINE), out
    result.stdout.fnmatch_lines(["*15 failed*"])
    for name, line in lines.items():
        assert f"{name}/scale.cu does not compile for sm_90:\n{line}\n" in out, (name, out)
        # In the failures section: on CI, pytest's short summary repeats whole messages too.
        failures = out.split("short test summary info")[0]
        assert failures.count(f"\n{line}\n") == 3, (name, out)  # the compile item and both cases


def test_cudagate_check_refuses_the_same_headers_as_bad_input(tmp_path, capsys):
    lines = bad_header_suites(tmp_path)
    for name, line in lines.items():
        code = main(["check", "--allow-unsigned", str(tmp_path / name)])
        out = capsys.readouterr().out
        assert code == EXIT_INPUT and f"  scale2: {line}\n" in out, (name, out)
