"""Pieces of the hardening (docs/hardening.md) on their own: the compute-sanitizer step (with a
stand-in binary), fresh inputs, the output-scale rule and its signing-time flags, ``checks:``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from cudagate_harness.request_checks import request_problems

from helpers import SUITE_YAML, fake_compute_sanitizer, replace_once, write_suite
from fake_worker import FakeWorker
from test_hardening_gate import Fingerprint, kernels_for

from cudagate_harness import sanitizer
from pytest_cudagate.defences import fresh_inputs as fresh
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.errors import FileError
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.defences.checks import effective_checks
from pytest_cudagate.defences.sanitizer import sanitizer_case
from pytest_cudagate.suite.model import manifest_entry
from pytest_cudagate.judge.output_scale import flag_cases, scale_check, trivial_output
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Checks, Distribution, Param, Tolerance
from pytest_cudagate.suite.draw import draw, draw_fresh
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.suite.cases import write_case
from pytest_cudagate.trust.manifest import collect_manifest
from pytest_cudagate.defences.expected import generate
from cudagate_harness.runner import _changed

RACE_REPORT = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at 0x1e0 in /w/kernels/race.cu:14:racy
=========     and Read access at 0x2b0 in /w/kernels/race.cu:17:racy [6144 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
MEMCHECK_REPORT = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at oob(const float *, float *, int, int)+0x70 in /w/kernels/oob.cu:12
=========     by thread (31,0,0) in block (6,0,0)
=========     Address 0x7f0000001234 is out of bounds
=========     and is 4 bytes after the nearest allocation at 0x7f0000000000 of size 924 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2e90] in libcuda.so.1
=========
========= Invalid __global__ write of size 4 bytes
=========     at oob(const float *, float *, int, int)+0x70 in /w/kernels/oob.cu:12
=========     by thread (30,0,0) in block (6,0,0)
=========
========= ERROR SUMMARY: 32 errors
"""
INITCHECK_REPORT = """========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at accumulate+0x80 in uninit.cu:9
=========     by thread (0,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 231 errors
"""
CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"


def test_reports_become_short_findings_with_source_lines():
    assert sanitizer.parse_report(RACE_REPORT) == (1, [
        "Error: Race reported between Write access in race.cu:14:racy and Read access in race.cu:17:racy [6144 hazards]"])
    errors, findings = sanitizer.parse_report(MEMCHECK_REPORT)
    assert errors == 32 and findings[0].startswith("Invalid __global__ write of size 4 bytes")
    assert "4 bytes after the nearest allocation" in findings[0] and "(at oob.cu:12)" in findings[0]
    assert sanitizer.parse_report(INITCHECK_REPORT) == (231, ["Uninitialized __global__ memory read of size 4 bytes (at uninit.cu:9)"])
    assert sanitizer.parse_report(CLEAN) == (0, [])


def test_a_verdict_from_exit_code_report_and_the_harness_answer():
    assert sanitizer.interpret("racecheck", 99, RACE_REPORT, "").status == "errors"
    assert sanitizer.interpret("memcheck", 0, CLEAN, '{"type": "case", "status": "ok"}').status == "clean"
    refused = sanitizer.interpret("memcheck", 0, CLEAN, '{"type": "case", "status": "error", "error": {"kind": "launch", "message": "too big"}}')
    assert refused.status == "skipped" and "too big" in refused.detail
    broken = sanitizer.interpret("initcheck", 1, "========= Error: Target application terminated before first instrumented API call\n", "")
    assert broken.status == "skipped" and "exit code 1" in broken.detail
    assert "compute-sanitizer racecheck: 1 error(s) (shared-memory race)" in sanitizer.interpret("racecheck", 99, RACE_REPORT, "").describe()


def fake_sanitizer(folder: Path, reports: dict[str, str]) -> Path:
    """A stand-in ``compute-sanitizer``: writes the canned report of the tool it is asked for."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reports.json").write_text(json.dumps(reports))
    return fake_compute_sanitizer(folder, """\
report = json.loads((here / "reports.json").read_text()).get(tool, "========= ERROR SUMMARY: 0 errors\\n")
Path(log).write_text(report)
print(json.dumps({"type": "case", "status": "ok"}))
sys.exit(99 if "ERROR SUMMARY: 0 errors" not in report and report.strip() else 0)""")


@pytest.fixture
def scale_suite(tmp_path):
    return load_suite(write_suite(tmp_path / "scale"))


def replay(suite, tmp_path, kernel="scale2"):
    gate = Gate(FakeWorker(kernels_for(suite)), Fingerprint(), GateOptions(fresh_seed=3), tmp_path / "out")
    program = dataclasses.replace(suite.kernels[0], name=kernel, entry=kernel)
    return {case.name: gate.replay(suite, program, case, Ledger.for_suite(suite)) for case in suite.cases}


def test_a_sanitizer_finding_fails_the_kernels_smallest_case(scale_suite, tmp_path, monkeypatch):
    script = fake_sanitizer(tmp_path / "bin", {"racecheck": RACE_REPORT})
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(script))
    assert sanitizer_case(scale_suite).name == "small"
    outcomes = replay(scale_suite, tmp_path)
    small = outcomes["small"]
    assert small.failed
    assert "compute-sanitizer racecheck: 1 error(s) (shared-memory race)" in small.message
    assert "Race reported between Write access in race.cu:14:racy and Read access in race.cu:17" in small.message
    assert not outcomes["perf"].failed  # run once per kernel, on its smallest case
    calls = (tmp_path / "bin" / "calls.txt").read_text().split()
    assert sorted(calls) == ["initcheck", "memcheck", "racecheck"]
    replay(scale_suite, tmp_path / "again")  # cached: the same kernel and case are not sanitized again
    assert (tmp_path / "bin" / "calls.txt").read_text().split() == calls


def test_a_clean_kernel_passes_and_a_missing_sanitizer_is_a_note(scale_suite, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(fake_sanitizer(tmp_path / "bin", {})))
    assert not replay(scale_suite, tmp_path)["small"].failed
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(tmp_path / "nowhere"))
    small = replay(scale_suite, tmp_path / "b")["small"]
    assert not small.failed
    assert "compute-sanitizer not found" in small.warning and "step was skipped" in small.warning


def test_a_kernel_that_hangs_under_the_sanitizer_costs_half_a_timeout_ahead(scale_suite, tmp_path, monkeypatch):
    """Ahead of the cases the tools get half the case timeout; a kernel still running then is killed
    there and its item runs them again within the case timeout and the start (at most half of it)."""
    script = fake_compute_sanitizer(tmp_path / "bin", """\
request = json.loads(Path(args[args.index("cudagate_harness") + 1]).read_text())
with open(here / "limits.txt", "a") as f:
    f.write(f"{request['timeout_s']:g}\\n")
time.sleep(600)""")
    monkeypatch.setenv("CUDAGATE_COMPUTE_SANITIZER", str(script))
    gate = Gate(FakeWorker(kernels_for(scale_suite), timeout_s=1.0), Fingerprint(), GateOptions(fresh_seed=3),
                tmp_path / "out")
    program, case = scale_suite.kernels[0], scale_suite.case("small")
    gate.ahead.sanitize([(scale_suite, program, c) for c in scale_suite.cases])
    limits = tmp_path / "bin" / "limits.txt"
    assert limits.read_text().split() == ["0.5"] * 3  # one kernel, three tools, killed together
    outcome = gate.replay(scale_suite, program, case, Ledger.for_suite(scale_suite))
    assert limits.read_text().split() == ["0.5"] * 3 + ["1.5"] * 3  # 2 x the case timeout in all
    assert not outcome.failed and "timed out after 1.5 s (the case timeout 1 s + 0.5 s" in outcome.warning


def test_the_sanitizer_request_runs_the_harness_on_one_plain_launch(scale_suite, tmp_path, monkeypatch):
    script = fake_sanitizer(tmp_path / "bin", {})
    seen = []
    real = sanitizer.subprocess.Popen

    def spy(command, **kwargs):
        request_file = Path(command[12])
        assert command[13::2] == ["--root"] * len(command[13::2])
        # what `python -m cudagate_harness REQUEST --root DIR` will check, started where the sanitizer starts it
        seen.append((command, kwargs["cwd"], request_problems(json.loads(request_file.read_text()),
                                                               (request_file.parent, *map(Path, command[14::2])))))
        return real(command, **kwargs)

    monkeypatch.setattr(sanitizer.subprocess, "Popen", spy)

    request = run_request(scale_suite, scale_suite.kernels[0], [scale_suite.case("small")], output_dir=tmp_path / "o")
    results = sanitizer.run_tools(request, ("memcheck",), exe=str(script), use_cache=False)
    assert results["memcheck"].status == "clean"
    ((command, cwd, problems),) = seen
    assert cwd == "/"  # no module of the checkout can shadow the worker's
    assert command[:8] == [str(script), "--tool", "memcheck", "--target-processes", "application-only",
                           "--error-exitcode", "99", "--log-file"]
    assert command[9:12] == [sys.executable, "-m", "cudagate_harness"]
    assert problems == []  # the harness reads the suite's case data when started where the sanitizer starts it
    assert not Path(command[12]).exists()  # the request file lived in a temporary folder, removed afterwards


# -- fresh inputs ------------------------------------------------------------------------------------------
def test_fresh_set_labels():
    assert fresh.labels(2, True) == ["resampled", "adversarial"]
    assert fresh.labels(4, True) == ["resampled", "adversarial", "resampled-2", "adversarial-2"]
    assert fresh.labels(2, False) == ["resampled", "resampled-2"]


def test_fresh_sets_are_new_values_with_reference_outputs(scale_suite, tmp_path):
    case = scale_suite.case("perf")
    sets, notes = fresh.prepare(scale_suite, case, count=2, adversarial=True, seed=11, root=tmp_path).finish()
    assert [s.label for s in sets] == ["resampled", "adversarial"] and notes == []
    signed = np.load(scale_suite.input_path(case, scale_suite.buffers[0]))
    for item in sets:
        spec = item.spec(scale_suite, case)
        x = np.load(spec["inputs"]["x"])
        y = np.load(spec["expected"]["y"])
        assert x.dtype == np.float32 and x.shape == signed.shape and not np.array_equal(x, signed)
        assert np.allclose(y, 2 * x.astype(np.float64), rtol=1e-6)
    adversarial = np.load(sets[1].spec(scale_suite, case)["inputs"]["x"])
    assert np.any(np.signbit(adversarial) & (adversarial == 0))  # negative zeros
    big = float(np.max(np.abs(adversarial)))
    assert 2.0 ** 22 < big <= 2.0 ** 24 * float(np.max(np.abs(signed)))  # scaled up to 2^24 × the input's scale
    assert sets[1].atol_scale["y"] > 1e5  # atol follows the output's scale
    again, _ = fresh.prepare(scale_suite, case, count=2, adversarial=True, seed=11, root=tmp_path / "again").finish()
    assert np.array_equal(np.load(again[1].spec(scale_suite, case)["inputs"]["x"]), adversarial)  # a seed replays


@pytest.mark.parametrize("dtype, dist", [
    ("float32", Distribution("uniform", low=-3.0, high=5.0)), ("float16", Distribution("normal", mean=0.5, std=2.0)),
    ("float64", Distribution("normal", mean=-1.0, std=0.25)), ("int32", Distribution("integers", low=-7, high=9)),
    ("uint8", Distribution("integers", low=0, high=300)),  # past uint8: wrapped, as draw() casts
])
def test_fresh_draws_follow_the_distribution_in_the_inputs_dtype(dtype, dist):
    param = Param(name="x", kind="buffer", dtype=dtype, intent="in", size="n")
    values = draw_fresh(param, (200, 500), dist, np.random.default_rng(3))
    signed_like = draw(param, (200, 500), dist, np.random.default_rng(3))  # the signed cases' draw
    assert values.dtype == signed_like.dtype == np.dtype(dtype) and values.shape == (200, 500)
    if dist.distribution == "integers":
        assert set(np.unique(values)) == set(np.unique(signed_like))  # every value, none outside
    if dist.distribution == "uniform":
        assert dist.low <= values.min() < values.max() <= dist.high
    mean, std = float(values.astype(np.float64).mean()), float(values.astype(np.float64).std())
    assert abs(mean - float(signed_like.astype(np.float64).mean())) < 0.05 * max(1.0, std)
    assert abs(std / float(signed_like.astype(np.float64).std()) - 1) < 0.02


def test_signed_zeros_fall_on_about_two_percent_of_the_elements_anywhere():
    rng = np.random.default_rng(8)
    hits = np.concatenate([fresh.zero_positions(rng, 10_000) for _ in range(40)])
    assert hits.min() >= 0 and hits.max() < 10_000 and abs(hits.size / 400_000 - fresh.ZERO_FRACTION) < 0.002
    assert all(np.all(np.diff(fresh.zero_positions(rng, n)) > 0) for n in (1, 5, 4096))
    counts = np.bincount(hits // 1000, minlength=10)
    assert counts.min() > 0.9 * counts.mean()  # spread evenly, to the last element


def test_adversarial_values_stop_where_the_reference_overflows(tmp_path):
    squares = replace_once(SUITE_YAML, "python: reference.py:scale_rows", "python: squares.py:squares")
    folder = tmp_path / "sq"
    folder.mkdir()
    (folder / "squares.py").write_text("import numpy as np\n\ndef squares(x, rows, cols):\n"
                                       "    return (x.astype(np.float64) ** 2).astype(np.float32)\n")
    suite = load_suite(write_suite(folder, yaml_text=squares))
    sets, notes = fresh.prepare(suite, suite.case("small"), count=2, adversarial=True, seed=5, root=tmp_path / "f").finish()
    y = np.load(sets[1].spec(suite, suite.case("small"))["expected"]["y"])
    assert np.all(np.isfinite(y)) and np.max(y) <= np.finfo(np.float32).max * 2.0 ** -8


def test_positive_inputs_stay_positive(tmp_path):
    logs = replace_once(SUITE_YAML, "python: reference.py:scale_rows", "python: logs.py:logs")
    folder = tmp_path / "lg"
    folder.mkdir()
    (folder / "logs.py").write_text("import numpy as np\n\ndef logs(x, rows, cols):\n"
                                    "    return np.log(x.astype(np.float64)).astype(np.float32)\n")
    suite = load_suite(write_suite(folder, yaml_text=logs, data=False))
    x = np.abs(np.random.default_rng(0).normal(size=(3, 50))).astype(np.float32) + 0.5

    write_case(suite, suite.case("small"), {"x": x}, {"y": np.log(x)})
    sets, notes = fresh.prepare(suite, suite.case("small"), count=2, adversarial=True, seed=5, root=tmp_path / "f").finish()
    assert [s.label for s in sets] == ["resampled", "adversarial"] and notes == []  # no signed zeros: log stays finite


def test_a_reference_that_fails_on_adversarial_values_skips_them_with_a_note(tmp_path):
    picky = replace_once(SUITE_YAML, "python: reference.py:scale_rows", "python: picky.py:picky")
    folder = tmp_path / "pk"
    folder.mkdir()
    (folder / "picky.py").write_text("import numpy as np\n\ndef picky(x, rows, cols):\n"
                                     "    if np.abs(x).max() > 100 or np.any(np.abs(x) < 1e-9):\n"
                                     "        raise ValueError('out of domain')\n"
                                     "    return (2.0 * x.astype(np.float64)).astype(np.float32)\n")
    suite = load_suite(write_suite(folder, yaml_text=picky))
    sets, notes = fresh.prepare(suite, suite.case("small"), count=2, adversarial=True, seed=5, root=tmp_path / "f").finish()
    assert [s.label for s in sets] == ["resampled"]
    assert notes == ["adversarial fresh inputs skipped on case small: the reference's own output is not finite on "
                     "them at any scale tried (or it refused them)"]


# -- the output-scale rule and its signing-time flags ------------------------------------------------------
def test_trivial_outputs():
    e = np.linspace(-1e-6, 1e-6, 100)
    assert trivial_output(e, 1e-4, 0).label == "all zeros"
    assert trivial_output(e + 5.0, 1e-4, 0).label.startswith("the constant 5")
    assert trivial_output(e, 1e-9, 0) is None
    assert trivial_output(np.array([np.inf] * 40), 1.0, 0) is None
    assert scale_check(e, e, 1e-4, 0).ok and not scale_check(np.zeros(100), e, 1e-4, 0).ok
    assert scale_check(np.zeros(10), e[:10], 1e-4, 0) is None  # too few elements to speak of a scale


def test_honest_float32_rounding_passes_the_scale_rule():
    rng = np.random.default_rng(1)
    e = rng.normal(size=4096) * 1e-6
    actual = e.astype(np.float32)
    result = check_output("y", actual, e, Tolerance(atol=1e-4, rtol=1e-4))
    assert result.ok and result.scale is not None and result.scale.fraction < 1e-6


def test_flag_cases_names_tiny_and_constant_outputs(tmp_path):
    suite = load_suite(write_suite(tmp_path / "scale"))
    assert flag_cases(suite) == []
    case = suite.case("small")
    np.save(suite.expected_path(case, suite.outputs[0]), np.full((3, 50), 0.5, np.float32))
    (problem,) = flag_cases(suite)
    assert "case small: output 'y' is constant (every element is 0.5)" in problem
    np.save(suite.expected_path(case, suite.outputs[0]), (np.arange(150, dtype=np.float32) * 1e-9).reshape(3, 50))
    (problem,) = flag_cases(suite)
    assert "all zeros passes its tolerance" in problem and "widen the inputs or tighten atol" in problem


def test_a_one_element_case_warns_until_the_suite_says_constant_ok(tmp_path, capsys):
    """A 1-element output is passed by the constant equal to it: `cudagate check` warns, naming the key
    that says this is meant; `constant_ok: true` on the case silences it, and is signed with the case."""
    from pytest_cudagate.cli import main
    from pytest_cudagate.trust.manifest import suite_manifest

    one = replace_once(SUITE_YAML, "{rows: 3, cols: 50}}", "{rows: 1, cols: 1}}")
    path = write_suite(tmp_path / "scale", yaml_text=one)
    assert main(["check", "--allow-unsigned", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: case small: output 'y':" in out and "set `constant_ok: true` on the case" in out, out
    before = suite_manifest(load_suite(path))["cases"]["small"]
    path.write_text(replace_once(one, "{rows: 1, cols: 1}}", "{rows: 1, cols: 1}, constant_ok: true}"))
    assert main(["check", "--allow-unsigned", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out
    assert suite_manifest(load_suite(path))["cases"]["small"] == {**before, "constant_ok": True}
    path.write_text(replace_once(one, "{rows: 1, cols: 1}}", "{rows: 1, cols: 1}, constant_ok: yes please}"))
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    assert "cases[0].constant_ok: 'yes please' is not of type 'boolean'" in capsys.readouterr().err


# -- checks: in the suite file -------------------------------------------------------------------------------
def test_checks_load_with_defaults_and_relaxations(tmp_path):
    suite = load_suite(write_suite(tmp_path / "a"))
    assert suite.checks == Checks() and manifest_entry(suite) is None and effective_checks(suite) == (Checks(), [])
    text = SUITE_YAML + "checks: {determinism: tolerance, fresh_inputs: 0, sanitizer: [racecheck]}\n"
    suite = load_suite(write_suite(tmp_path / "b", yaml_text=text))
    assert suite.checks.determinism == "tolerance" and suite.checks.sanitizer == ("racecheck",)
    assert manifest_entry(suite) == {"determinism": "tolerance", "fresh_inputs": 0, "sanitizer": ["racecheck"]}
    checks, notes = effective_checks(suite)
    assert checks == suite.checks and len(notes) == 4 and "unsigned" in notes[-1]
    suite = load_suite(write_suite(tmp_path / "c", yaml_text=SUITE_YAML + "checks: {sanitizer: off}\n"))
    assert suite.checks.sanitizer == ()


def test_relaxations_do_not_change_the_signed_manifest_of_a_suite_without_them(tmp_path):
    suite = load_suite(write_suite(tmp_path / "a"))
    manifest, _ = collect_manifest(suite)
    assert "checks" not in manifest and "_checks" not in json.dumps(manifest)


@pytest.mark.parametrize("checks, message", [
    ("{determinism: exact}", "determinism"),
    ("{fresh_inputs: -1}", "fresh_inputs"),
    ("{sanitizer: [helgrind]}", "sanitizer"),
    ("{guards: true}", "guards"),
])
def test_bad_checks_are_reported_with_the_path(tmp_path, checks, message):
    with pytest.raises(FileError) as info:
        load_suite(write_suite(tmp_path / "s", yaml_text=SUITE_YAML + f"checks: {checks}\n", data=False))
    assert message in str(info.value)


CUDA_REFERENCE_YAML = replace_once(SUITE_YAML, "  python: reference.py:scale_rows\n",
                                   "  source: scale.cu\n  entry: scale2\n  launch: {grid: [rows], block: [128]}\n")


def test_fresh_sets_with_a_cuda_reference_run_through_the_worker_once_per_candidate(tmp_path):
    path = write_suite(tmp_path / "cuda", yaml_text=CUDA_REFERENCE_YAML, data=False)
    suite = load_suite(path)
    client = FakeWorker(kernels_for(suite))

    generate(suite, client=client)  # the signed data, from the (simulated) CUDA reference
    device = client.worker.device
    before, requests = device.launches, len(client.requests)
    case = suite.case("perf")
    sets, notes = fresh.prepare(suite, case, count=2, adversarial=True, seed=9, root=tmp_path / "fresh").finish(client)
    assert [s.label for s in sets] == ["resampled", "adversarial"] and notes == []
    # One request: one launch for the resampled set, one per candidate scale of the adversarial set
    # (SCALE_STEPS + 1 of them here), no second validation launch.
    assert len(client.requests) - requests == 1 and device.launches - before == 1 + fresh.SCALE_STEPS + 1
    left = sorted(p.name for p in (tmp_path / "fresh").iterdir() if not p.name.startswith(".trash-"))
    assert left == ["adversarial", "resampled"]  # the other candidates are on their way out
    for item in sets:
        spec = item.spec(suite, case)
        x = np.load(spec["inputs"]["x"]).astype(np.float64)
        assert np.allclose(np.load(spec["expected"]["y"]).reshape(-1), 2 * x.reshape(-1), rtol=1e-6)
    outcome = replay(suite, tmp_path / "gate")["perf"]  # and the gate uses them for a CUDA-reference suite
    assert not outcome.failed, outcome.message


def test_identical_buffers_compare_fast_and_exactly():
    a = np.arange(10, dtype=np.float32)
    assert _changed(a, a.copy()) == 0
    b = a.copy()
    b[3] = -0.0 if a[3] == 0 else a[3] * 2
    assert _changed(a, b) == 1
    z = np.zeros(4, np.float32)
    assert _changed(z, -z) == 4  # -0.0 differs from 0.0 bit for bit
