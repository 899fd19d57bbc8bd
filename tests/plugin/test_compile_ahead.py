"""Before the first item, a gate run compiles every trusted suite's kernels and sanitizes every kernel
without a cached verdict, side by side; the items read both back from the on-disk caches."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from fake_worker import FakeKernel, SCALE_PARAMS, honest, install
from helpers import SUITE_YAML, replace_once, write_suite

pytest_plugins = ["pytester"]

SLEEP_S = 0.6
FAKE_SANITIZER = f"""#!{sys.executable}
import json, sys, time
from pathlib import Path
args = sys.argv[1:]
tool, log = args[args.index("--tool") + 1], args[args.index("--log-file") + 1]
request = json.loads(Path(next(a for a in args if a.endswith("request.json"))).read_text())
started = time.time()
time.sleep({SLEEP_S})
Path(log).write_text("========= ERROR SUMMARY: 0 errors\\n")
with open(Path(__file__).parent / "calls.jsonl", "a") as f:
    f.write(json.dumps({{"tool": tool, "kernel": request["kernel"]["name"], "start": started, "end": time.time()}}) + "\\n")
print(json.dumps({{"type": "case", "status": "ok"}}))
"""


@pytest.fixture
def project(pytester, monkeypatch):
    """Two suites of one kernel each, a fake compute-sanitizer that records its calls, a fake worker."""
    for name in ("one", "two"):
        write_suite(pytester.path / name, yaml_text=replace_once(SUITE_YAML, "suite: scale", f"suite: {name}"))
    script = pytester.path / "bin" / "compute-sanitizer"
    script.parent.mkdir()
    script.write_text(FAKE_SANITIZER)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(script))
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "cache"))
    install(monkeypatch, pytester.path, {"scale2": FakeKernel(honest, SCALE_PARAMS)})
    return pytester


def calls(project) -> list[dict]:
    path = project.path / "bin" / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def run(project):
    result = project.runpytest_inprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-durations", "0",
                                         "-p", "no:cacheprovider", "one", "two")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    return result


def test_the_kernels_of_two_suites_are_sanitized_side_by_side_before_any_item(project):
    result = run(project)
    made = calls(project)
    assert sorted((c["kernel"], c["tool"]) for c in made) == sorted(
        (k, t) for k in ("scale2", "scale2") for t in ("initcheck", "memcheck", "racecheck"))
    first, second = sorted(made, key=lambda c: c["start"])[0], sorted(made, key=lambda c: c["start"])[-1]
    assert second["start"] < first["end"], made  # the two kernels' runs overlapped
    ahead = next(float(line.split()[0]) for line in result.outlines if line.split()[1:2] == ["ahead"])
    assert ahead >= SLEEP_S  # the sanitizer ran in the run phase `ahead`, before the items


def test_a_warm_run_starts_no_sanitizer_and_compiles_nothing(project):
    run(project)
    before = len(calls(project))
    cached = sorted(p.name for p in (project.path / "cache" / "nvrtc").iterdir())
    run(project)
    assert len(calls(project)) == before
    assert sorted(p.name for p in (project.path / "cache" / "nvrtc").iterdir()) == cached


def test_an_untrusted_suite_is_neither_compiled_nor_sanitized_ahead(project):
    """Without --cuda-gate-allow-unsigned, the unsigned suites are refused: nothing of theirs runs."""
    result = project.runpytest_inprocess("--cuda-gate", "-p", "no:cacheprovider", "one", "two")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert calls(project) == []
    assert not (project.path / "cache" / "nvrtc").is_dir() or not any((project.path / "cache" / "nvrtc").iterdir())


def test_a_kernel_that_cannot_be_read_fails_its_own_items_and_the_run_goes_on(project):
    """A header that is not UTF-8 stops the compile ahead of nothing: that suite's compile item fails,
    naming the file, and the other suite is judged."""
    (project.path / "one" / "bad.h").write_bytes(b"\xff\xfe not text\n")
    source = project.path / "one" / "scale.cu"
    source.write_text('#include "bad.h"\n' + source.read_text())
    result = project.runpytest_inprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                         "one", "two")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=3, failed=3)  # one's compile item and cases; two's three items pass
    assert "bad.h" in result.stdout.str()
