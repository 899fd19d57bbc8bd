"""Dtype instantiations (issue 44 item 4): `instantiate: {T: [float32, bfloat16]}` gates one kernel
template once per type, `gelu[T=bfloat16]` everywhere, with case data, tolerances and approvals of
its own, and the instantiations signed as a whole."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from instantiated import GELU_YAML, write_gelu
from helpers import replace_once
from trust_project import Project, clean_env  # noqa: F401 - clean_env is an autouse fixture
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import generate_key_pair, verify_suite

pytest_plugins = ["pytester"]

# The fake GPU's kernels: one per instantiation's C++ entry, each computing in float32 and storing its type.
CONFTEST = """
import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, {tests!r})
from fake_worker import FakeKernel, FakeWorker, use_client  # noqa: E402


def params(dtype):
    return [{{"name": "x", "kind": "buffer", "dtype": dtype, "intent": "in"}},
            {{"name": "y", "kind": "buffer", "dtype": dtype, "intent": "out"}},
            {{"name": "n", "kind": "scalar", "dtype": "int32"}}]


def gelu(v):
    return 0.5 * v * (1.0 + np.tanh(np.float32(0.7978845608) * (v + np.float32(0.044715) * v * v * v)))


def f32(launch):
    n = launch.args["n"]
    launch.array("y", np.float32, n)[:] = gelu(launch.array("x", np.float32, n))


def bf16(launch):
    n = launch.args["n"]
    x = launch.array("x", np.uint16, n).view(ml_dtypes.bfloat16).astype(np.float32)
    launch.array("y", np.uint16, n)[:] = gelu(x){shift}.astype(ml_dtypes.bfloat16).view(np.uint16)


use_client(lambda **options: FakeWorker({{"gelu<float>": FakeKernel(f32, params("float32")),
                                         "gelu<__nv_bfloat16>": FakeKernel(bf16, params("bfloat16"))}}, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


def cli(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.slow
def test_cases_generate_draws_each_instantiation_and_check_compiles_each_entry(tmp_path, capsys):
    path = write_gelu(tmp_path / "gelu")
    code, out = cli(capsys, "cases", "generate", path)
    assert code == 0, out
    cases = tmp_path / "gelu" / "cases"
    x32, xbf = np.load(cases / "T=float32" / "perf" / "x.npy"), np.load(cases / "T=bfloat16" / "perf" / "x.npy")
    assert x32.dtype == np.float32 and xbf.dtype.names == ("bfloat16",)
    # the same draw (the case's seed), rounded to each type: bfloat16 keeps 8 bits of the float32 value
    bf = xbf.view(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(bf, x32, rtol=2.0**-8, atol=0)
    assert not np.array_equal(bf, x32)
    code, out = cli(capsys, "check", "--allow-unsigned", path)
    assert code == 0, out
    lines = out.splitlines()
    assert "  instantiation T=float32: gelu[T=float32]; case data in " + str(cases / "T=float32") in lines
    assert "  instantiation T=bfloat16: gelu[T=bfloat16]; case data in " + str(cases / "T=bfloat16") in lines
    assert "expected outputs of 4 case(s) agree with the reference reference.py:gelu run now" in out
    # NVRTC (on this CPU) compiles the template for each type from its C++ spelling, and the parameters fit
    assert any(line.startswith("  gelu[T=float32]: compiles for sm_90 with NVRTC") for line in lines), out
    assert any(line.startswith("  gelu[T=bfloat16]: compiles for sm_90 with NVRTC") for line in lines), out


def test_each_instantiation_has_its_kernel_name_entry_types_and_tolerance(tmp_path):
    suite = load_suite(write_gelu(tmp_path / "gelu"))
    assert [(s.label, s.kernels[0].name, s.kernels[0].entry, s.signature[0].dtype, s.tolerance["y"].rtol)
            for s in suite.instances] == [("T=float32", "gelu[T=float32]", "gelu<float>", "float32", 1.0e-5),
                                          ("T=bfloat16", "gelu[T=bfloat16]", "gelu<__nv_bfloat16>", "bfloat16", 1.6e-2)]
    assert [s.data_dir.name for s in suite.instances] == ["T=float32", "T=bfloat16"]
    assert suite.instance_of("gelu[T=bfloat16]") is suite.instances[1]


def fake_gpu(folder: Path, shift: str = "") -> None:
    (folder / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).resolve().parents[1]), shift=shift))


@pytest.mark.slow
def test_the_gate_runs_and_reports_each_instantiation(pytester, monkeypatch, capsys):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    path = write_gelu(pytester.path / "gelu")
    assert main(["cases", "generate", str(path)]) == 0, capsys.readouterr()
    fake_gpu(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider", "-v",
                                           "--cuda-gate-report", "out", timeout=300)
    result.stdout.fnmatch_lines_random(["*cudagate.yaml::gelu?T=float32?::compile PASSED*",
                                        "*cudagate.yaml::gelu?T=float32?::perf PASSED*",
                                        "*cudagate.yaml::gelu?T=bfloat16?::small PASSED*",
                                        "*cudagate.yaml::gelu?T=bfloat16?::perf PASSED*"])
    result.assert_outcomes(passed=6)  # two compile items, two cases each
    document = json.loads((pytester.path / "out" / "report.json").read_text(encoding="utf-8"))
    assert {(i["kernel"], i["case"]) for i in document["items"]} == {
        (f"gelu[T={t}]", c) for t in ("float32", "bfloat16") for c in ("small", "perf")}


def test_an_instantiation_is_judged_on_its_own_data_and_tolerance(pytester, monkeypatch, capsys):
    # The bfloat16 kernel is off by 3% (beyond its rtol 1.6e-2); the float32 one is right.
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "compile-cache"))
    path = write_gelu(pytester.path / "gelu")
    assert main(["cases", "generate", str(path)]) == 0, capsys.readouterr()
    fake_gpu(pytester.path, shift=" * np.float32(1.03)")
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider", "-v",
                                           timeout=300)
    result.stdout.fnmatch_lines_random(["*cudagate.yaml::gelu?T=float32?::small PASSED*",
                                        "*cudagate.yaml::gelu?T=bfloat16?::small FAILED*"])
    result.assert_outcomes(passed=4, failed=2)


def signed_gelu(tmp_path: Path) -> Project:
    root = tmp_path / "proj"
    (root / "pyproject.toml").parent.mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n', encoding="utf-8")
    keys = tmp_path / "keys"
    alice = generate_key_pair("alice", private_path=keys / "alice.key",
                              public_path=root / ".cudagate" / "trusted_keys" / "alice.pub")
    project = Project(root, root / "gelu", alice, keys)
    write_gelu(project.suite_dir)
    assert main(["cases", "generate", str(project.suite_file)]) == 0
    project.sign()
    return project


def test_instantiate_and_every_instantiation_are_signed(tmp_path):
    project = signed_gelu(tmp_path)
    assert project.verify().ok
    for suite in project.load().instances:  # whichever instantiation the gate holds
        assert verify_suite(suite, project.trusted()).ok
    project.edit(lambda raw: raw["tolerance"]["y"]["bfloat16"].update(rtol=0.5))
    result = project.verify()
    assert not result.ok
    assert any("instances.T=bfloat16.tolerance.y.rtol: 0.016 → 0.5" in p for p in result.problems), result.problems
    project.edit(lambda raw: raw["tolerance"]["y"]["bfloat16"].update(rtol=1.6e-2))
    assert project.verify().ok
    project.edit(lambda raw: raw.update(instantiate={"T": ["float32"]}))  # dropping a type is a change too
    project.edit(lambda raw: raw["tolerance"]["y"].pop("bfloat16"))
    result = project.verify()
    assert not result.ok and any("instantiate.T" in p for p in result.problems), result.problems


def test_a_file_planted_beside_the_instantiations_data_is_refused(tmp_path):
    project = signed_gelu(tmp_path)
    np.save(project.suite_dir / "cases" / "stray.npy", np.zeros(3, np.float32))
    result = project.verify()
    assert not result.ok
    assert any("unexpected file gelu/cases/stray.npy" in p or "stray.npy" in p for p in result.problems), result.problems


def test_the_ledger_accounts_for_each_instantiation_apart(tmp_path, capsys):
    project = signed_gelu(tmp_path)
    code, out = cli(capsys, "sign", "--key", project.alice.private_path, project.suite_file)
    assert code == 0, out
    ledger = json.loads((project.suite_dir / "cudagate.approvals.json").read_text(encoding="utf-8"))
    assert sorted(ledger["pending"]) == ["gelu[T=bfloat16]", "gelu[T=float32]"]
    assert "signed 2 case(s), 8 data file(s)" in out


def test_bisect_names_the_instantiations_when_no_kernel_is_given(tmp_path, capsys):
    path = write_gelu(tmp_path / "gelu")
    code, out = cli(capsys, "bisect", "HEAD~1", "HEAD", path)
    assert code == 2, out
    assert "has 2 kernels (gelu[T=float32], gelu[T=bfloat16]): name one as KERNEL" in out


@pytest.mark.parametrize("old, new, message", [
    ("    bfloat16: {atol: 1.0e-2, rtol: 1.6e-2}\n", "",
     "line 11: tolerance.y: no tolerance for bfloat16 (T = bfloat16 is instantiated); add `bfloat16: {atol: ..., "
     "rtol: ...}` under y"),
    ("[float32, bfloat16]", "[float32, bfloat17]",
     "line 2: instantiate.T: 'bfloat17' is not a dtype cudagate knows; write one of float16,"),
    ('"gelu<{T}>"', '"gelu<{U}>"', "line 16: kernels[0].entry: {U} names no type variable of instantiate (T); "
                                   "declare it"),
    ("{T: [float32, bfloat16]}", "{T: [float32, bfloat16], U: [int32]}",
     "line 2: instantiate.U: U is used by no signature type nor kernel entry"),
    ("{T: [float32, bfloat16]}", "{T: []}", "line 2: instantiate.T: T lists no type; list the types to gate"),
    ("  y:\n    float32: {atol: 1.0e-6, rtol: 1.0e-5}\n    bfloat16: {atol: 1.0e-2, rtol: 1.6e-2}\n",
     "  y: {atol: 1.0e-2}\n", "line 10: tolerance.y: y is typed {T}: give a tolerance per type"),
])
def test_a_bad_instantiation_is_one_line_naming_the_field(tmp_path, capsys, old, new, message):
    path = write_gelu(tmp_path / "gelu", replace_once(GELU_YAML, old, new))
    code, out = cli(capsys, "check", "--allow-unsigned", path)
    assert code == 2, out
    assert message in out
    assert len([line for line in out.splitlines() if line.startswith("  - ")]) == 1, out


def test_a_reference_that_names_the_type_variable_gets_the_types_name(tmp_path, capsys):
    # A bfloat16 input reaches a Python reference as float32 (exact), so the type comes by name.
    path = write_gelu(tmp_path / "gelu")
    reference = tmp_path / "gelu" / "reference.py"
    reference.write_text(reference.read_text().replace("def gelu(x, n):", "def gelu(x, n, T):\n"
                                                       "    return x * {'float32': 1, 'bfloat16': 2}[T]\n"))
    code, out = cli(capsys, "cases", "generate", path)
    assert code == 0, out
    for dtype, factor in (("float32", 1), ("bfloat16", 2)):
        folder = tmp_path / "gelu" / "cases" / f"T={dtype}" / "small"
        x, y = (np.load(folder / name).view(np.uint16 if dtype == "bfloat16" else np.float32) for name in
                ("x.npy", "expected/y.npy"))
        if dtype == "bfloat16":
            x, y = (a.view(ml_dtypes.bfloat16).astype(np.float32) for a in (x, y))
        np.testing.assert_array_equal(y, x * factor)
