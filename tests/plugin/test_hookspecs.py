"""The hooks of pytest_cudagate.hookspecs, implemented by a pytester project's conftest.py: fields in
report.json, another output format, another library adapter; and each way a plugin gets them wrong
is one line naming it, never a lost report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cudagate_harness import library
from fake_worker import FakeKernel, install
from helpers import replace_once, write_suite
from test_library import MM_YAML, PARAMS, mm_kernel, write_mm

from pytest_cudagate import extensions
from pytest_cudagate.boundary import schema

pytest_plugins = ["pytester"]

GATE = ("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-report", "out", "-p", "no:cacheprovider")
WRITERS = """
import json


class Csv:
    name = "csv"

    def write(self, report, folder):
        rows = [f"{i['kernel']},{i['case']},{i['status']}" for i in report["items"]]
        (folder / "report.csv").write_text("\\n".join(rows) + "\\n")


class Broken:
    name = "broken"

    def write(self, report, folder):
        raise RuntimeError("no disk for you")


def pytest_cudagate_report_writers(config):
    return [Broken(), Csv()]
"""


def run_gate(pytester, conftest: str):
    write_suite(pytester.path)
    pytester.makeconftest(conftest)
    result = pytester.runpytest_inprocess(*GATE)
    report = pytester.path / "out" / "report.json"
    return result, json.loads(report.read_text()) if report.is_file() else None


def test_a_conftest_adds_fields_under_extra_and_report_json_keeps_them(pytester):
    result, document = run_gate(pytester, "def pytest_cudagate_update_report(config, report):\n"
                                          "    report['extra']['ci'] = {'items': len(report['items']), 'pool': 'a'}\n")
    assert result.ret == pytest.ExitCode.OK
    assert document["extra"] == {"ci": {"items": 2, "pool": "a"}}
    assert schema.problems(document, "report") == []


def test_a_report_no_plugin_extends_has_no_extra(pytester):
    result, document = run_gate(pytester, "")
    assert result.ret == pytest.ExitCode.OK and "extra" not in document


@pytest.mark.parametrize("body, line", [
    ("report['pool'] = 'a'",
     "cudagate: pytest_cudagate_update_report of conftest.py made report.json invalid: (top level): Additional "
     "properties are not allowed ('pool' was unexpected); allowed keys: counts, created, extra, format, items, runs, "
     "suites, tool_version, verdict, version; add fields under report[\"extra\"]; the report is written without them"),
    ("raise KeyError('pool')",
     "cudagate: pytest_cudagate_update_report of conftest.py raised KeyError: 'pool'; the report is written without "
     "its fields"),
])
def test_a_hook_that_breaks_the_report_is_one_line_and_the_report_is_written_without_it(pytester, body, line):
    result, document = run_gate(pytester, f"def pytest_cudagate_update_report(config, report):\n    {body}\n")
    assert line in result.outlines
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR  # an output that was asked for is missing
    assert "pool" not in document and "extra" not in document and len(document["items"]) == 2
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_conftest_writer_writes_beside_the_report_and_a_failing_one_is_one_line(pytester):
    result, document = run_gate(pytester, WRITERS)
    out = pytester.path / "out"
    assert (out / "report.csv").read_text().splitlines() == sorted(
        f"{i['kernel']},{i['case']},{i['status']}" for i in document["items"])  # written after the failing one
    assert ("cudagate: report writer 'broken' of conftest.py failed: RuntimeError: no disk for you; report.json and "
            "report.html are written") in result.outlines
    assert (out / "report.html").is_file() and result.ret == pytest.ExitCode.INTERNAL_ERROR


def test_a_writer_hook_that_returns_no_writer_is_one_line(pytester):
    result, document = run_gate(pytester, "def pytest_cudagate_report_writers(config):\n    return ['csv']\n")
    assert ("cudagate: pytest_cudagate_report_writers of conftest.py returned str, not a writer (a name and "
            "write(report, folder))") in result.outlines
    assert document is not None and result.ret == pytest.ExitCode.INTERNAL_ERROR


ADAPTER_MODULE = f"""
import dataclasses
import sys

sys.path[:0] = {[str(Path(__file__).resolve().parents[1] / folder) for folder in ("", "judge", "optimize")]!r}
from cudagate_harness.library import ADAPTERS  # noqa: E402
from test_library import FakeSgemm  # noqa: E402

SGEMM = dataclasses.replace(ADAPTERS["cublas_sgemm"], label="House SGEMM", load=FakeSgemm)
"""


def test_a_conftest_adapter_times_beside_the_kernel_and_leaves_the_registry_as_it_was(pytester, monkeypatch):
    (pytester.path / "house_adapters.py").write_text(ADAPTER_MODULE)
    pytester.makeconftest("def pytest_cudagate_library_adapters(config):\n"
                          "    return {'house_sgemm': 'house_adapters:SGEMM'}\n")
    suite = write_mm(pytester.path / "mm")  # its case data, drawn while the adapter is not known here
    suite.write_text(replace_once(MM_YAML, "adapter: cublas_sgemm", "adapter: house_sgemm"))
    workers = install(monkeypatch, pytester.path, {"mm": FakeKernel(mm_kernel, PARAMS)})
    result = pytester.runpytest_inprocess(*GATE, str(suite.parent))
    result.assert_outcomes(passed=4)
    items = {i["case"]: i for i in json.loads((pytester.path / "out" / "report.json").read_text())["items"]}
    assert items["square"]["library"]["label"] == "House SGEMM" and items["square"]["library"]["error"] is None
    assert items["square"]["library"]["estimate"]["ratio"] == pytest.approx(2.0)
    # the worker is told where to import it from, and nothing is left registered after the run
    assert json.loads(workers[0].env[extensions.ADAPTERS_ENV]) == {"house_sgemm": "house_adapters:SGEMM"}
    assert "house_sgemm" not in library.ADAPTERS


@pytest.mark.parametrize("returned, line", [
    ("{'house': house_sgemm}",
     "ERROR: pytest_cudagate_library_adapters of conftest.py: 'house': <function house_sgemm at *> is not "
     '"module:ATTRIBUTE"; the worker imports the adapter by that path, so nothing else can be passed'),
    ("{'house': 'no_such_module:SGEMM'}",
     "ERROR: pytest_cudagate_library_adapters: library adapter 'house': cannot import no_such_module:SGEMM: "
     "ModuleNotFoundError: No module named 'no_such_module'"),
    ("{'cublas_sgemm': 'cudagate_harness.library:ADAPTERS'}",
     "ERROR: pytest_cudagate_library_adapters: library adapter 'cublas_sgemm' (cudagate_harness.library:ADAPTERS): "
     "the name is taken by cuBLAS SGEMM"),
    ("['house_adapters:SGEMM']",
     "ERROR: pytest_cudagate_library_adapters of conftest.py returned a list; return {name: \"module:ATTRIBUTE\"}, "
     "the module importable by the harness worker"),
])
def test_an_adapter_that_cannot_be_had_is_one_usage_error(pytester, returned, line):
    write_suite(pytester.path)
    pytester.makeconftest(f"def house_sgemm():\n    pass\n\n\n"
                          f"def pytest_cudagate_library_adapters(config):\n    return {returned}\n")
    result = pytester.runpytest_inprocess(*GATE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    assert "Traceback" not in result.stderr.str()


WORKER_BIND = """
import json
from cudagate_harness import library
from cudagate_harness.messages import LibrarySpec

library.read_plugin_adapters()  # as the worker does at its start
launch = library.bind(LibrarySpec(adapter="house_sgemm", rounds=1, args={r: r for r in "abcmnk"}), None, {})
print(json.dumps(launch if isinstance(launch, str) else launch.adapter.label))
"""


@pytest.mark.parametrize("where, said", [
    ("house_adapters:SGEMM", "House SGEMM"),
    ("house_adapters:MISSING", "library adapter 'house_sgemm': cannot import house_adapters:MISSING: AttributeError: "
                               "module 'house_adapters' has no attribute 'MISSING'"),
])
def test_the_worker_process_imports_an_adapter_its_environment_names(tmp_path, where, said):
    """The harness worker is another process: it imports the adapter when a request first names it, and
    one it cannot have is the baseline's column message (library.bind's string), as a missing cuBLAS."""
    (tmp_path / "house_adapters.py").write_text(ADAPTER_MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), **extensions.worker_env({"house_sgemm": where})}
    done = subprocess.run([sys.executable, "-c", WORKER_BIND], env=env, capture_output=True, text=True, cwd="/",
                          check=True)
    assert json.loads(done.stdout) == said


def test_the_plugin_spells_the_worker_s_environment_name_as_the_harness():
    assert extensions.ADAPTERS_ENV == library.ADAPTERS_ENV
