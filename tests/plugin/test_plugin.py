"""`pytest --cuda-gate` end to end on a machine without a GPU, through pytester."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from helpers import BROKEN_CU, SUITE_YAML, replace_once, write_suite
from pytest_cudagate.errors import FileError
from pytest_cudagate.config import Settings, load_settings

pytest_plugins = ["pytester"]

CUDA_REFERENCE = replace_once(SUITE_YAML, "  python: reference.py:scale_rows\n",
                              "  source: scale.cu\n  entry: scale2\n  launch: {grid: [rows], block: [128]}\n")


def outcomes(result) -> dict:
    return {k: v for k, v in result.parseoutcomes().items() if k in ("passed", "failed", "skipped", "errors", "error")}


def test_compile_passes_and_replay_is_skipped_without_a_gpu(pytester):
    write_suite(pytester.path)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-rs", "-v")
    assert outcomes(result) == {"passed": 1, "skipped": 2}
    result.stdout.fnmatch_lines([
        "*cudagate.yaml::scale2::compile PASSED*",
        "*cudagate.yaml::scale2::small SKIPPED*",
        "*cudagate.yaml::scale2::perf SKIPPED*",
    ])
    result.stdout.fnmatch_lines(["SKIPPED [[]2[]] *no CUDA device*"])
    assert result.ret == pytest.ExitCode.OK
    # the terminal summary has its own section, one row per replayed case
    result.stdout.fnmatch_lines([
        "*= cudagate =*",
        "*suite*kernel*case*kind*",
        "*scale*scale2*small*correctness*skipped*",
    ])
    result.stdout.fnmatch_lines(["*scale*scale2*perf*performance*skipped*"])


def test_node_ids(pytester):
    write_suite(pytester.path)
    write_suite(pytester.path / "nested" / "dir")
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "--collect-only", "-q")
    assert [line for line in result.stdout.lines if "::" in line] == [
        "cudagate.yaml::scale2::compile",
        "cudagate.yaml::scale2::small",
        "cudagate.yaml::scale2::perf",
        "nested/dir/cudagate.yaml::scale2::compile",
        "nested/dir/cudagate.yaml::scale2::small",
        "nested/dir/cudagate.yaml::scale2::perf",
    ]


def test_a_cuda_reference_gets_a_compile_item_only(pytester):
    write_suite(pytester.path, yaml_text=CUDA_REFERENCE, data=False)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "--collect-only", "-q")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids == ["cudagate.yaml::reference::compile", "cudagate.yaml::scale2::compile",
                   "cudagate.yaml::scale2::small", "cudagate.yaml::scale2::perf"]


def test_require_gpu_fails_replay_items(pytester):
    write_suite(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-require-gpu")
    assert outcomes(result) == {"passed": 1, "failed": 2}
    result.stdout.fnmatch_lines(["*no CUDA device*--cuda-gate-require-gpu is set*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_compile_error_fails_the_compile_item_with_nvrtcs_log(pytester):
    write_suite(pytester.path, kernel_source=BROKEN_CU)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-rfs")
    assert outcomes(result)["failed"] == 1
    result.stdout.fnmatch_lines([
        "*scale.cu does not compile for sm_90:*",
        "*scale.cu(3): error*undefined_value_here*",
    ])
    assert "Traceback" not in result.stdout.str()  # a gate failure is its message, not a traceback
    result.stdout.fnmatch_lines(["FAILED cudagate.yaml::scale2::compile*"])


def test_an_invalid_suite_is_one_failing_item_and_others_still_run(pytester):
    good = write_suite(pytester.path / "good")
    bad_text = replace_once(SUITE_YAML, "source: scale.cu", "source: nothere.cu")
    write_suite(pytester.path / "bad", yaml_text=bad_text, data=False)
    write_suite(pytester.path / "yaml", yaml_text="suite: [unclosed\n", data=False)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-v")
    assert outcomes(result) == {"passed": 1, "failed": 2, "skipped": 2}
    result.stdout.fnmatch_lines([
        "bad/cudagate.yaml::suite FAILED*",
        "good/cudagate.yaml::scale2::compile PASSED*",
        "good/cudagate.yaml::scale2::small SKIPPED*",
        "good/cudagate.yaml::scale2::perf SKIPPED*",
        "yaml/cudagate.yaml::suite FAILED*",
    ])
    result.stdout.fnmatch_lines([
        "*the suite file is invalid:*",
        "*kernels[[]0[]].source: file 'nothere.cu' not found*",
    ])
    result.stdout.fnmatch_lines(["*yaml/cudagate.yaml:*", "*not valid YAML*"])
    assert good.is_file()


def test_bad_case_data_fails_the_case_item_with_the_fix(pytester):
    path = write_suite(pytester.path)
    np.save(path.parent / "cases" / "small" / "x.npy", np.zeros(7, dtype=np.float32))
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-v", "-rs")
    assert outcomes(result) == {"passed": 1, "failed": 1, "skipped": 1}
    result.stdout.fnmatch_lines([
        "*cudagate.yaml::scale2::small FAILED*",
        "*cudagate.yaml::scale2::perf SKIPPED*",
    ])
    result.stdout.fnmatch_lines([
        "*case data does not match the signature:*",
        "*x.npy: holds 7 elements, but x has size rows*cols = 150*",
        "*fix: run `cudagate cases generate *cudagate.yaml`*",
    ])


def test_without_the_option_no_cudagate_items(pytester):
    write_suite(pytester.path)
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = pytester.runpytest("-v")
    assert outcomes(result) == {"passed": 1}
    assert "cudagate.yaml" not in result.stdout.str()
    assert "= cudagate =" not in result.stdout.str()


def test_the_option_keeps_ordinary_tests(pytester):
    write_suite(pytester.path)
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned")
    assert outcomes(result) == {"passed": 2, "skipped": 2}


def test_project_settings_name_the_suites(pytester):
    write_suite(pytester.path / "kernels" / "scale")
    write_suite(pytester.path / "unlisted", kernel_source=BROKEN_CU)  # would fail if collected
    pytester.makepyfile(test_other="def test_never():\n    assert False\n")
    pytester.makepyprojecttoml('[tool.cudagate]\nsuites = ["kernels/scale/cudagate.yaml"]\n')
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-v")
    assert outcomes(result) == {"passed": 1, "skipped": 2}
    result.stdout.fnmatch_lines(["kernels/scale/cudagate.yaml::scale2::compile PASSED*"])
    assert "unlisted" not in result.stdout.str()


def test_project_settings_do_not_override_explicit_paths(pytester):
    write_suite(pytester.path / "kernels" / "scale")
    write_suite(pytester.path / "other")
    pytester.makepyprojecttoml('[tool.cudagate]\nsuites = ["kernels/scale"]\n')
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "other", "--collect-only", "-q")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids and all(i.startswith("other/cudagate.yaml::") for i in ids)


def test_project_settings(tmp_path):
    assert load_settings(tmp_path) == Settings(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.cudagate]\nsuites = ["a", "b/c"]\n'
                                             'arch = "sm_80"\ntimeout_s = 5\n')
    settings = load_settings(tmp_path)
    assert settings.suites == ("a", "b/c") and settings.arch == "sm_80" and settings.timeout_s == 5


def test_unknown_project_setting_is_reported(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.cudagate]\nsuits = ["x"]\n')
    with pytest.raises(FileError) as excinfo:
        load_settings(tmp_path)
    assert str(excinfo.value).startswith(str(tmp_path / "pyproject.toml"))
    message = str(excinfo.value)
    assert "unknown key(s) suits; allowed: " in message
    assert "suites" in message.split("allowed: ")[1]


def test_unreadable_project_settings_are_reported(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.cudagate\n")
    with pytest.raises(FileError, match="cannot read"):
        load_settings(tmp_path)


def test_arch_option_and_resources_reach_the_junit_report(pytester):
    write_suite(pytester.path)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-arch", "sm_80", "--junitxml=report.xml")
    assert outcomes(result) == {"passed": 1, "skipped": 2}
    tree = ET.parse(pytester.path / "report.xml")
    case = next(tc for tc in tree.iter("testcase") if tc.get("name") == "compile")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["arch"] == "sm_80" and properties["compiler"].startswith("NVRTC ")
    assert int(properties["registers"]) > 0


def test_a_suite_that_is_not_utf8_does_not_stop_the_others(pytester):
    write_suite(pytester.path / "good")
    bad = write_suite(pytester.path / "bad", data=False)
    bad.write_bytes(SUITE_YAML.replace("row by row", "caf\xe9").encode("latin-1"))
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned")
    assert outcomes(result) == {"passed": 1, "failed": 1, "skipped": 2}


def test_an_unsigned_suite_is_refused_before_any_replay(pytester):
    """Without a GPU too: trust is checked before a replay could be skipped for want of a device, and
    before the kernel text reaches the compiler."""
    write_suite(pytester.path / "kernels" / "scale")
    result = pytester.runpytest("--cuda-gate", "-rf")
    result.assert_outcomes(failed=3)
    # the reasons once, under the first item; each later item says so in one line
    result.stdout.fnmatch_lines(["*the gate refuses to compile this suite's kernels*", "*no trusted signing keys*"])
    # counted in the failure sections: the short summary repeats whole messages when CI is set
    output = result.stdout.str()
    failures = output.split("short test summary info")[0]
    assert failures.count("no trusted signing keys") == 1, output
    assert failures.count("the gate refuses to judge this suite: its oracle or approvals are not trusted (why: listed "
                          "once, under kernels/scale/cudagate.yaml::scale2::compile)") == 2, output
    loud = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned")
    loud.stdout.fnmatch_lines(["*trust checks are OFF*"])


def test_skip_reason_names_the_missing_driver_in_plain_words(pytester):
    write_suite(pytester.path)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-rs")
    result.stdout.fnmatch_lines(["SKIPPED [[]2[]] *no CUDA device (driver not found)*"])
    assert "NVIDIA driver library" not in result.stdout.str()


@pytest.mark.parametrize("value", ["0", "1", "-0.1", "1.5", "nan", "inf"])
def test_a_threshold_outside_zero_to_one_is_refused_naming_the_option(pytester, value):
    write_suite(pytester.path)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", f"--cuda-gate-threshold={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*argument --cuda-gate-threshold: {value!r} is not a number strictly between 0 "
                                 "and 1 (0.02 = 2%; leave it out to use each suite's gate.threshold)*"])


def test_require_gpu_without_the_gate_says_it_does_nothing(pytester):
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--cuda-gate-require-gpu", "-W", "default")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*--cuda-gate-require-gpu does nothing without --cuda-gate*"])


def test_a_gate_run_that_finds_no_suite_says_where_it_looked_and_how_to_list_suites(pytester):
    pytester.mkdir("empty")
    result = pytester.runpytest("--cuda-gate", "empty")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*cudagate: no cudagate.yaml found under empty*[[]tool.cudagate[]] suites*"])


HEAVY = ("numpy", "scipy", "jsonschema", "yaml", "cryptography", "git", "cuda")
# What an installed plugin loads in every pytest run of its environment, --cuda-gate or not: the
# options' converters (boundary.options, in the boundary package) and defaults (config).
OPTIONS_MODULES = {"pytest_cudagate", "pytest_cudagate.plugin", "pytest_cudagate.boundary",
                   "pytest_cudagate.boundary.options", "pytest_cudagate.config", "pytest_cudagate.errors",
                   "pytest_cudagate.host", "pytest_cudagate.host.paths", "pytest_cudagate.hookspecs"}
LOADED = ("import sys\n"
          "def loaded(before):\n"
          "    new = set(sys.modules) - before\n"
          "    print('ours', sorted(m for m in new if m.split('.')[0] == 'pytest_cudagate'))\n"
          "    print('other', sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names\n"
          "                          and m.split('.')[0] not in ('pytest_cudagate', '_pytest', 'pytest')))\n")


def test_importing_the_plugin_loads_pytest_and_the_standard_library_only(pytester):
    script = LOADED + "import pytest\nbefore = set(sys.modules)\nimport pytest_cudagate.plugin\nloaded(before)\n"
    result = pytester.run(sys.executable, "-c", script)
    assert result.stdout.lines[-2:] == ["ours ['pytest_cudagate', 'pytest_cudagate.plugin']", "other []"]
    import pytest_cudagate.plugin

    assert "PYTEST_DONT_REWRITE" in pytest_cudagate.plugin.__doc__  # pytest leaves it unparsed


def test_a_pytest_run_without_the_gate_loads_only_the_options_of_the_plugin(pytester):
    pytester.makeconftest("import sys\n"
                          "def pytest_unconfigure(config):\n"
                          "    print('ours', sorted(m for m in sys.modules if m.split('.')[0] == 'pytest_cudagate'))\n"
                          f"    print('heavy', sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n")
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    assert result.ret == pytest.ExitCode.OK
    ours = next(line for line in result.stdout.lines if line.startswith("ours "))
    assert "'pytest_cudagate.plugin'" in ours and set(eval(ours[5:])) <= OPTIONS_MODULES
    result.stdout.fnmatch_lines(["heavy []"])


MODULES_SEEN = """
import sys

import pytest

LAZY = ("git", "gitdb", "smmap", "scipy", "pytest_cudagate.trust.release", "pytest_cudagate.trust.base_ref",
        "pytest_cudagate.reports.writer", "pytest_cudagate.reports.document", "pytest_cudagate.reports.html_page",
        "pytest_cudagate.reports.plots", "pytest_cudagate.reports.benchmark_json")


def loaded():
    return sorted(m for m in LAZY if m in sys.modules or any(n.startswith(m + ".") for n in sys.modules))


def pytest_sessionstart(session):
    print("after configure:", loaded(), "items:", "pytest_cudagate.items" in sys.modules)


def pytest_unconfigure(config):
    print("at the end:", loaded())
"""


@pytest.mark.slow
def test_a_gate_run_imports_git_scipy_the_release_and_the_report_only_where_used(pytester, monkeypatch):
    # gitpython: release mode and `cudagate gate --trusted-ref`; scipy: a kernel judged against its stored
    # approval runs (no GPU here: no case is judged); the report's modules: a report that is written.
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)  # in Actions the job summary is a report
    write_suite(pytester.path)
    pytester.makeconftest(MODULES_SEEN)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-s", "-p", "no:cacheprovider")
    assert outcomes(result) == {"passed": 1, "skipped": 2}
    result.stdout.fnmatch_lines(["after configure: [[]] items: True", "at the end: [[]]"])

    report = pytester.path / "report"
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-s", "-p", "no:cacheprovider",
                                           f"--cuda-gate-report={report}")
    assert (report / "report.html").is_file()
    result.stdout.fnmatch_lines(["after configure: [[]] items: True", "at the end: *'pytest_cudagate.reports.html_page'*"])
