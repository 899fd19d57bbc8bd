"""Per-class variants of a kernel (``classes:`` in the suite): the class's cases, and only they, run
the kernel compiled with the variant's options and launched with its launch; approvals pin the
variants, the manifest signs their launches, and every consumer resolves a case's build alike."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fake_worker import install, scale_kernels
from helpers import EXAMPLES, KERNEL_CU, SUITE_YAML, line_of, replace_once, write_suite
from pytest_cudagate.trust.approvals import Ledger, build_identity
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import generate_key_pair

pytest_plugins = ["pytester"]

VARIANT = '      large: {options: ["-DWIDE=1"], launch: {grid: [rows], block: [256]}}\n'
VARIANT_YAML = replace_once(
    replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                 "    launch: {grid: [rows], block: [128]}\n"
                 "    launch_overrides: {big_override: {grid: [rows], block: [32]}}\n"
                 "    classes:\n" + VARIANT),
    "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n",
    "  - {name: perf, kind: performance, class: small, scalars: {rows: 64, cols: 256}}\n"
    "  - {name: big, kind: performance, class: large, scalars: {rows: 128, cols: 512}}\n"
    "  - {name: big_override, kind: performance, class: large, scalars: {rows: 96, cols: 512}}\n")
# A variant's options reach the compiler: this one makes the source fail to compile.
GUARDED_CU = "#ifdef BROKEN\n#error the large variant is broken\n#endif\n" + KERNEL_CU


def per_case(requests: list[dict]) -> dict[str, tuple]:
    """Per case of the suite's kernel: (op, current options, current block, approved options, approved block)."""
    found = {}
    for request in requests:
        if request["op"] == "run" and request["kernel"]["entry"] == "scale2":
            for case in request["cases"]:
                found.setdefault(case["name"], ("run", request["kernel"]["options"], case["launch"]["block"][0]))
        elif request["op"] == "compare":
            kernels, launches = request["kernels"], request["launches"]
            found.setdefault(request["case"]["name"], (
                "compare", kernels["current"]["options"], launches["current"]["block"][0],
                kernels["approved"]["options"], launches["approved"]["block"][0]))
    return found


def gate(pytester, suite_path: Path):
    return pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(suite_path.parent), "-p", "no:cacheprovider")


def test_a_variant_changes_the_build_and_launch_of_its_classs_cases_only(pytester, monkeypatch):
    suite_path = write_suite(pytester.path / "scale", yaml_text=VARIANT_YAML)
    workers = install(monkeypatch, pytester.path, scale_kernels())
    gate(pytester, suite_path).assertoutcome(passed=5)  # compile and four cases
    found = per_case(workers[0].requests)
    assert found["small"] == ("run", [], 128)  # no class: the kernel as declared
    assert found["perf"] == ("run", [], 128)  # class small has no variant
    assert found["big"] == ("run", ["-DWIDE=1"], 256)
    # launch_overrides of a case win over its class variant's launch; the variant's options still apply
    assert found["big_override"] == ("run", ["-DWIDE=1"], 32)


@pytest.mark.slow
def test_an_approval_pins_the_variants_and_a_changed_variant_is_timed_against_the_approved_one(
        pytester, monkeypatch, capsys):
    suite_path = write_suite(pytester.path / "scale", yaml_text=VARIANT_YAML)
    workers = install(monkeypatch, pytester.path, scale_kernels())
    assert main(["approve", str(suite_path), "--approved-by", "reviewer", "--runs", "1"]) == 0
    approval = Ledger.for_suite(load_suite(suite_path)).approvals["scale2"]
    assert approval.classes == {"large": {"options": ["-DWIDE=1"],
                                          "launch": {"grid": ["rows"], "block": ["256"], "shared_bytes": "0"}}}
    assert build_identity(load_suite(suite_path).kernels[0]) == approval.identity()
    assert approval.identity()["classes"] == approval.classes

    workers.clear()
    gate(pytester, suite_path).assertoutcome(passed=5)
    assert {case: entry[0] for case, entry in per_case(workers[0].requests).items()} == {
        "small": "run", "perf": "run", "big": "run", "big_override": "run"}  # identical: timed alone

    suite_path.write_text(suite_path.read_text().replace('"-DWIDE=1"', '"-DWIDE=2"'))
    assert build_identity(load_suite(suite_path).kernels[0]) != approval.identity()
    workers.clear()
    gate(pytester, suite_path).assertoutcome(passed=5)
    found = per_case(workers[0].requests)
    assert found["big"] == ("compare", ["-DWIDE=2"], 256, ["-DWIDE=1"], 256)
    assert found["big_override"] == ("compare", ["-DWIDE=2"], 32, ["-DWIDE=1"], 32)
    assert found["perf"] == ("compare", [], 128, [], 128)

    capsys.readouterr()
    assert main(["diff", str(suite_path), "scale2"]) == 0
    out = capsys.readouterr().out
    assert ("  variant of class large: options ['-DWIDE=1'], grid ['rows'] block ['256'] shared 0 -> "
            "options ['-DWIDE=2'], grid ['rows'] block ['256'] shared 0") in out
    assert "unchanged" not in out


def test_a_kernel_without_variants_keeps_its_approval_identity_and_ledger_entry(tmp_path, monkeypatch):
    suite_path = write_suite(tmp_path / "scale")
    install(monkeypatch, tmp_path, scale_kernels())
    assert main(["approve", str(suite_path), "--approved-by", "reviewer", "--runs", "1"]) == 0
    entry = json.loads((suite_path.parent / "cudagate.approvals.json").read_text())["approvals"]["scale2"]
    assert "classes" not in entry
    approval = Ledger.for_suite(load_suite(suite_path)).approvals["scale2"]
    assert "classes" not in approval.identity() and build_identity(load_suite(suite_path).kernels[0]) == approval.identity()


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """The variant suite in a project with a trusted key, approved (fake worker) and signed."""
    root = tmp_path / "proj"
    suite_path = write_suite(root / "scale", yaml_text=VARIANT_YAML)
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    key = tmp_path / "alice.key"
    generate_key_pair("alice", private_path=key, public_path=root / ".cudagate/trusted_keys/alice.pub")
    install(monkeypatch, tmp_path, scale_kernels())
    assert main(["approve", str(suite_path), "--approved-by", "alice", "--runs", "1"]) == 0
    assert main(["sign", str(suite_path), "--key", str(key)]) == 0
    return suite_path


def test_a_tampered_variant_in_the_signed_ledger_is_refused(project, capsys):
    assert main(["verify", str(project)]) == 0
    path = project.parent / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw["approvals"]["scale2"]["classes"]["large"]["options"] = ["-DWIDE=9"]
    path.write_text(json.dumps(raw))
    capsys.readouterr()
    assert main(["verify", str(project)]) == 1
    out = capsys.readouterr().out
    assert "cudagate.approvals.json: the signature by key" in out and "it was altered after signing" in out, out
    assert "fix: a maintainer reviews the approvals" in out


def test_a_variants_launch_is_signed_and_its_options_are_not(project, capsys):
    project.write_text(project.read_text().replace('"-DWIDE=1"', '"-DWIDE=2"'))
    assert main(["verify", str(project)]) == 0  # options, like the kernel's, are what pull requests change
    project.write_text(project.read_text().replace("block: [256]", "block: [512]"))
    capsys.readouterr()
    assert main(["verify", str(project)]) == 1
    assert "kernels.scale2.classes.large.launch.block: [256] → [512]" in capsys.readouterr().out


def test_compile_failures_name_the_variant(pytester, capsys):
    text = VARIANT_YAML.replace('"-DWIDE=1"', '"-DBROKEN"')
    suite_path = write_suite(pytester.path, yaml_text=text, kernel_source=GUARDED_CU)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-rf")
    result.stdout.fnmatch_lines([
        "*scale.cu (scale2 (variant of class large: options [[]'-DBROKEN'[]])) does not compile for sm_90:*",
        "*the large variant is broken*",
        "FAILED cudagate.yaml::scale2::compile*",
    ])
    assert main(["check", str(suite_path)]) == 1
    out = capsys.readouterr().out
    assert "  scale2: compiles for sm_90" in out
    assert "  scale2 (variant of class large: options ['-DBROKEN']): does NOT compile for sm_90:" in out


def test_bad_variants_are_refused_naming_the_file_line_field_and_fix(tmp_path, capsys):
    bad = VARIANT_YAML.replace(
        VARIANT, '      large: {options: ["-rdc=true"], launch: {grid: [rows], block: [threads]}}\n'
                 '      huge: {options: ["-DWIDE=1"]}\n')
    suite_path = write_suite(tmp_path / "scale", yaml_text=bad, data=False)
    assert main(["check", str(suite_path)]) == 2
    err = capsys.readouterr().err
    assert str(suite_path) in err or "cudagate.yaml" in err
    assert (f"line {line_of(bad, '-rdc=true')}: kernels[0].classes.large.options[0]: option '-rdc=true' is not "
            "allowed: relocatable device code") in err and "; remove it from the variant" in err
    assert (f"line {line_of(bad, 'threads')}: kernels[0].classes.large.launch.block[0]: 'threads' uses threads, which "
            "is not a scalar parameter") in err
    assert (f"line {line_of(bad, 'huge')}: kernels[0].classes.huge: no case has class 'huge' (the cases' classes: "
            "default, large, small); name one of those, or give the cases it is for `class: huge`") in err


def test_an_empty_variant_is_refused_by_the_schema(tmp_path, capsys):
    bad = VARIANT_YAML.replace(VARIANT, "      large: {}\n")
    suite_path = write_suite(tmp_path / "scale", yaml_text=bad, data=False)
    assert main(["check", str(suite_path)]) == 2
    assert "kernels[0].classes.large" in capsys.readouterr().err


def test_the_shipped_examples_still_verify_with_unchanged_identities(capsys):
    """Suites and ledgers signed before variants existed: same manifests, same ledger payloads."""
    for suite_dir in sorted(p for p in EXAMPLES.iterdir() if (p / "cudagate.sig.json").is_file()):
        suite = load_suite(suite_dir / "cudagate.yaml")
        assert main(["verify", str(suite.path)]) == 0, capsys.readouterr().out
        for name, approval in Ledger.for_suite(suite).approvals.items():
            assert "classes" not in approval.identity() and "classes" not in approval.signed_payload()


def test_the_examples_matmul_approval_is_byte_identical_to_its_kernel(tmp_path):
    shutil.copytree(EXAMPLES / "matmul", tmp_path / "matmul")
    suite = load_suite(tmp_path / "matmul" / "cudagate.yaml")
    approval = Ledger.for_suite(suite).approvals["matmul_f32"]
    assert build_identity(suite.kernels[0]) == approval.identity()
