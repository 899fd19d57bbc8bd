"""Trust layer: signed suite manifests, tamper detection, trusted keys, key handling, no leaked secrets.

Everything runs on a copy of examples/softmax (committed case data, a Python reference), so no GPU.
"""

from __future__ import annotations

import base64
import json
import os
import py_compile
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.config import load_settings
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import (SIGNATURE_FILENAME, SIGNING_KEY_ENV, TRUSTED_IDS_ENV, SignatureError,
                                   canonical_bytes, diff_manifests, file_sha256, find_project_root, gate_problems,
                                   generate_key_pair, key_id, load_private_key, load_public_key,
                                   load_signature_file, load_trusted_keys, manifest_bytes, sign_document, sign_suite,
                                   suite_manifest, verify_document, verify_suite)
from pytest_cudagate.trust.cli import main as trust_main
import hashlib
import argparse
from pytest_cudagate.trust.cli import register

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "softmax"
SIGN_FIX = "a maintainer reviews the change and runs `cudagate sign"

REFERENCE_CU = """// trusted reference, one thread per row
#include "ref_common.cuh"
extern "C" __global__ void softmax_ref(const float* x, float* y, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) row_softmax(x + r * cols, y + r * cols, cols);
}
"""
REFERENCE_CUH = """#pragma once
__device__ void row_softmax(const float* x, float* y, int n) {
    float m = x[0];
    for (int i = 1; i < n; ++i) m = fmaxf(m, x[i]);
    double s = 0;
    for (int i = 0; i < n; ++i) s += exp((double)(x[i] - m));
    for (int i = 0; i < n; ++i) y[i] = (float)(exp((double)(x[i] - m)) / s);
}
"""


@dataclass
class Project:
    root: Path
    suite_dir: Path
    alice: object  # GeneratedKey
    keys_dir: Path

    @property
    def suite_file(self) -> Path:
        return self.suite_dir / "cudagate.yaml"

    def load(self):
        return load_suite(self.suite_file)

    def key(self, generated=None):
        return load_private_key((generated or self.alice).private_path)

    def sign(self, generated=None, signer="alice") -> Path:
        return sign_suite(self.load(), self.key(generated), signer)

    def trusted(self):
        return load_trusted_keys(self.root, load_settings(self.root))

    def verify(self):
        return verify_suite(self.load(), self.trusted())

    def new_key(self, name: str, trusted: bool = True):
        public = (self.root / ".cudagate" / "trusted_keys" if trusted else self.keys_dir) / f"{name}.pub"
        return generate_key_pair(name, private_path=self.keys_dir / f"{name}.key", public_path=public)

    def raw(self) -> dict:
        return yaml.safe_load(self.suite_file.read_text(encoding="utf-8"))

    def edit(self, change) -> None:
        raw = self.raw()
        change(raw)
        self.suite_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")

    def case(self, raw: dict, name: str) -> dict:
        return next(c for c in raw["cases"] if c["name"] == name)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in (SIGNING_KEY_ENV, TRUSTED_IDS_ENV, "CUDAGATE_SIGNING_KEY_PASSPHRASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _make_project(tmp_path: Path, cuda_reference: bool = False) -> Project:
    root = tmp_path / "proj"
    suite_dir = root / "kernels" / "softmax"
    # Without the example's approvals: they are signed by the project's own key, not this test's.
    shutil.copytree(EXAMPLE, suite_dir, ignore=shutil.ignore_patterns(
        "__pycache__", SIGNATURE_FILENAME, "cudagate.approvals.json", "approved"))
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n', encoding="utf-8")
    keys_dir = tmp_path / "keys"
    alice = generate_key_pair("alice", private_path=keys_dir / "alice.key",
                              public_path=root / ".cudagate" / "trusted_keys" / "alice.pub")
    project = Project(root, suite_dir, alice, keys_dir)
    if cuda_reference:
        (suite_dir / "reference.cu").write_text(REFERENCE_CU, encoding="utf-8")
        (suite_dir / "ref_common.cuh").write_text(REFERENCE_CUH, encoding="utf-8")
        project.edit(lambda raw: raw.update(reference={"source": "reference.cu", "entry": "softmax_ref",
                                                       "launch": {"grid": ["cdiv(rows, 128)"], "block": [128]}}))
    project.sign()
    assert project.verify().ok
    return project


@pytest.fixture
def project(tmp_path) -> Project:
    return _make_project(tmp_path)


@pytest.fixture
def cuda_project(tmp_path) -> Project:
    return _make_project(tmp_path, cuda_reference=True)


def _flip_byte(path: Path, offset: int = -3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _add_case(p: Project) -> None:
    shutil.copytree(p.suite_dir / "cases" / "correct_7x33", p.suite_dir / "cases" / "extra_7x33")
    p.edit(lambda raw: raw["cases"].append({"name": "extra_7x33", "kind": "correctness", "scalars": {"rows": 7, "cols": 33}}))


def _remove_case(p: Project, keep_data: bool = False) -> None:
    p.edit(lambda raw: raw.update(cases=[c for c in raw["cases"] if c["name"] != "perf_2048x128"]))
    if not keep_data:
        shutil.rmtree(p.suite_dir / "cases" / "perf_2048x128")


def _move_data(p: Project) -> None:
    (p.suite_dir / "cases").rename(p.suite_dir / "data")
    p.edit(lambda raw: raw.update(data="data"))


def _swap_files(p: Project) -> None:
    a, b = p.suite_dir / "cases" / "perf_256x1024" / "x.npy", p.suite_dir / "cases" / "perf_2048x128" / "x.npy"
    tmp = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(tmp)


def _write_npy(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.arange(231, dtype=np.float32))


def _python_ref_swap(p: Project) -> None:
    (p.suite_dir / "other.py").write_text((p.suite_dir / "reference.py").read_text() + "\n# other\n")
    p.edit(lambda raw: raw["reference"].update(python="other.py:softmax_rows"))


# Each: (id, mutate(project), substrings the problems must contain). Every one must be detected.
TAMPERS = [
    ("case-scalar", lambda p: p.edit(lambda r: p.case(r, "correct_7x33")["scalars"].update(cols=34)),
     ["case correct_7x33: scalars.cols: 33 → 34"]),
    ("case-kind", lambda p: p.edit(lambda r: p.case(r, "correct_7x33").update(kind="performance")),
     ["case correct_7x33: kind: correctness → performance"]),
    ("case-holdout", lambda p: p.edit(lambda r: p.case(r, "holdout_300x700").update(holdout=False)),
     ["case holdout_300x700: holdout: true → false"]),
    ("case-holdout-added", lambda p: p.edit(lambda r: p.case(r, "correct_3x5000").update(holdout=True)),
     ["case correct_3x5000: holdout: false → true"]),
    ("case-seed", lambda p: p.edit(lambda r: p.case(r, "perf_256x1024").update(seed=7)),
     ["case perf_256x1024: seed: none → 7"]),
    ("case-added", _add_case, ["case extra_7x33 added"]),
    ("case-removed", _remove_case, ["case perf_2048x128 removed"]),
    ("case-removed-data-kept", lambda p: _remove_case(p, keep_data=True),
     ["case perf_2048x128 removed", "unexpected file cases/perf_2048x128/x.npy",
      "unexpected file cases/perf_2048x128/expected/y.npy"]),
    ("case-files-swapped", _swap_files,
     ["cases/perf_256x1024/x.npy: sha256 changed", "cases/perf_2048x128/x.npy: sha256 changed"]),
    ("case-file-missing", lambda p: (p.suite_dir / "cases" / "perf_256x1024" / "x.npy").unlink(),
     ["cases/perf_256x1024/x.npy: missing"]),
    ("case-expected-missing", lambda p: (p.suite_dir / "cases" / "correct_7x33" / "expected" / "y.npy").unlink(),
     ["cases/correct_7x33/expected/y.npy: missing"]),
    ("unexpected-npy", lambda p: _write_npy(p.suite_dir / "cases" / "correct_7x33" / "extra.npy"),
     ["unexpected file cases/correct_7x33/extra.npy"]),
    ("unexpected-expected-npy", lambda p: _write_npy(p.suite_dir / "cases" / "correct_7x33" / "expected" / "z.npy"),
     ["unexpected file cases/correct_7x33/expected/z.npy"]),
    ("unexpected-case-folder", lambda p: _write_npy(p.suite_dir / "cases" / "sneaky" / "x.npy"),
     ["unexpected file cases/sneaky/x.npy"]),
    ("data-folder-moved", _move_data, ["cases/correct_7x33/x.npy: no longer part of case correct_7x33"]),
    ("tolerance-atol", lambda p: p.edit(lambda r: r["tolerance"]["y"].update(atol=1.0e-2)),
     ["tolerance.y.atol: 1e-06 → 0.01"]),
    ("tolerance-rtol", lambda p: p.edit(lambda r: r["tolerance"]["y"].update(rtol=0.5)),
     ["tolerance.y.rtol: 0.0001 → 0.5"]),
    ("tolerance-nan", lambda p: p.edit(lambda r: r["tolerance"]["y"].update(nan="equal")),
     ["tolerance.y.nan: fail → equal"]),
    ("tolerance-max-rel-norm", lambda p: p.edit(lambda r: r["tolerance"]["y"].update(max_rel_norm=0.5)),
     ["tolerance.y.max_rel_norm: none → 0.5"]),
    ("input-distribution", lambda p: p.edit(lambda r: r["inputs"]["x"].update(std=1)),
     ["inputs.x.std: 3.0 → 1.0"]),
    ("python-reference-source",
     lambda p: (p.suite_dir / "reference.py").write_text((p.suite_dir / "reference.py").read_text().replace("float64", "float32")),
     ["reference.py: sha256 changed"]),
    ("python-reference-comment",
     lambda p: (p.suite_dir / "reference.py").write_text((p.suite_dir / "reference.py").read_text() + "# note\n"),
     ["reference.py: sha256 changed"]),
    ("python-reference-function", lambda p: p.edit(lambda r: r["reference"].update(python="reference.py:softmax_cols")),
     ["reference.function: softmax_rows → softmax_cols"]),
    ("python-reference-file", _python_ref_swap, ["reference.file: reference.py → other.py"]),
    ("param-dtype", lambda p: p.edit(lambda r: r["signature"][0].update(buffer="float64")),
     ["signature.x.dtype: float32 → float64"]),
    ("param-intent", lambda p: p.edit(lambda r: r["signature"][1].update(intent="inout")),
     ["signature.y.intent: out → inout"]),
    ("param-size", lambda p: p.edit(lambda r: r["signature"][0].update(size="cols*rows")),
     ["signature.x.size: rows*cols → cols*rows"]),
    ("param-shape", lambda p: p.edit(lambda r: r["signature"][0].update(shape=["cols", "rows"])),
     ["signature.x.shape: [rows, cols] → [cols, rows]"]),
    ("param-scalar-dtype", lambda p: p.edit(lambda r: r["signature"][2].update(scalar="int64")),
     ["signature.rows.dtype: int32 → int64"]),
    ("param-order", lambda p: p.edit(lambda r: r.update(signature=r["signature"][:2] + r["signature"][2:][::-1])),
     ["signature: parameters (x, y, rows, cols) → (x, y, cols, rows)"]),
    ("kernel-launch-block", lambda p: p.edit(lambda r: r["kernels"][0]["launch"].update(block=[128])),
     ["kernels.softmax_rows.launch.block: [256] → [128]"]),
    ("kernel-launch-grid", lambda p: p.edit(lambda r: r["kernels"][0]["launch"].update(grid=["cdiv(rows, 2)"])),
     ["kernels.softmax_rows.launch.grid: [rows] → [cdiv(rows, 2)]"]),
    ("kernel-launch-shared", lambda p: p.edit(lambda r: r["kernels"][0]["launch"].update(shared_bytes=1024)),
     ["kernels.softmax_rows.launch.shared_bytes: 0 → 1024"]),
    ("kernel-launch-override",
     lambda p: p.edit(lambda r: r["kernels"][0].update(launch_overrides={"perf_256x1024": {"grid": ["rows"], "block": [512]}})),
     ["kernels.softmax_rows.launch_overrides.perf_256x1024.block: added ([512])"]),
    ("kernel-entry", lambda p: p.edit(lambda r: r["kernels"][0].update(entry="softmax_other")),
     ["kernels.softmax_rows.entry: softmax_rows → softmax_other"]),
    ("kernel-added", lambda p: p.edit(lambda r: r["kernels"].append({"name": "softmax_v2", "source": "softmax.cu",
                                                                     "launch": {"grid": ["rows"], "block": [64]}})),
     ["kernel softmax_v2 added"]),
    ("timing-repeat", lambda p: p.edit(lambda r: r.update(timing={"repeat": 5})), ["timing.repeat: 100 → 5"]),
    ("timing-warmup", lambda p: p.edit(lambda r: r.update(timing={"warmup": 0})), ["timing.warmup: 10 → 0"]),
    ("timing-cache", lambda p: p.edit(lambda r: r.update(timing={"cache": "hot"})), ["timing.cache: cold → hot"]),
    ("timing-warmup-ms", lambda p: p.edit(lambda r: r.update(timing={"warmup_ms": 0})), ["timing.warmup_ms: 50.0 → 0.0"]),
    ("timing-batch", lambda p: p.edit(lambda r: r.update(timing={"cache": "hot", "batch": 4})), ["timing.batch: 1 → 4"]),
    ("gate-threshold", lambda p: p.edit(lambda r: r.update(gate={"threshold": 0.5})), ["gate.threshold: 0.02 → 0.5"]),
    ("suite-name", lambda p: p.edit(lambda r: r.update(suite="softmax2")), ["suite: softmax → softmax2"]),
]


def _assert_detected(p: Project, expected: list[str]) -> None:
    result = p.verify()
    assert not result.ok
    text = "\n".join(result.problems)
    for piece in expected:
        assert piece in text, f"{piece!r} not in:\n{text}"
    assert SIGN_FIX in result.fix
    assert result.key_id == p.alice.key_id  # still says who signed what is on file


@pytest.mark.parametrize("mutate, expected", [t[1:] for t in TAMPERS], ids=[t[0] for t in TAMPERS])
def test_tamper_detected(project, mutate, expected):
    mutate(project)
    _assert_detected(project, expected)


DATA_FILES = sorted(p.relative_to(EXAMPLE).as_posix() for p in (EXAMPLE / "cases").rglob("*.npy"))


@pytest.mark.parametrize("rel", DATA_FILES)
@pytest.mark.parametrize("where", ["header", "data"])
def test_every_case_data_byte_change_detected(project, rel, where):
    _flip_byte(project.suite_dir / rel, offset=20 if where == "header" else -3)
    _assert_detected(project, [f"{rel}: sha256 changed"])


def test_case_data_files_are_all_covered():
    assert len(DATA_FILES) == 10  # 5 cases × (input x, expected y)


CUDA_TAMPERS = [
    ("reference-source", lambda p: (p.suite_dir / "reference.cu").write_text(REFERENCE_CU.replace("r < rows", "r <= rows")),
     ["reference.cu: sha256 changed (the reference source)"]),
    ("reference-header", lambda p: (p.suite_dir / "ref_common.cuh").write_text(REFERENCE_CUH.replace("double s", "float s")),
     ["ref_common.cuh: sha256 changed (a header the reference includes)"]),
    ("reference-entry", lambda p: p.edit(lambda r: r["reference"].update(entry="softmax_fast")),
     ["reference.entry: softmax_ref → softmax_fast"]),
    ("reference-launch", lambda p: p.edit(lambda r: r["reference"]["launch"].update(block=[64])),
     ["reference.launch.block: [128] → [64]"]),
    ("reference-options", lambda p: p.edit(lambda r: r["reference"].update(options=["-use_fast_math"])),
     ["reference.options: [] → [-use_fast_math]"]),
    ("reference-to-python", lambda p: p.edit(lambda r: r.update(reference={"python": "reference.py:softmax_rows"})),
     ["reference: a CUDA reference kernel → a Python reference"]),
]


@pytest.mark.parametrize("mutate, expected", [t[1:] for t in CUDA_TAMPERS], ids=[t[0] for t in CUDA_TAMPERS])
def test_cuda_reference_tamper_detected(cuda_project, mutate, expected):
    mutate(cuda_project)
    _assert_detected(cuda_project, expected)


NOT_PROTECTED = [
    ("kernel-source", lambda p: (p.suite_dir / "softmax.cu").write_text(
        (p.suite_dir / "softmax.cu").read_text().replace("#define BLOCK 256", "#define BLOCK 128"))),
    ("kernel-source-rewritten", lambda p: (p.suite_dir / "softmax.cu").write_text("// a proposal\n")),
    ("description", lambda p: p.edit(lambda r: r.update(description="reworded"))),
    ("yaml-comments-and-layout", lambda p: p.suite_file.write_text(
        "# reformatted\n" + yaml.safe_dump(p.raw(), sort_keys=True, default_flow_style=False), encoding="utf-8")),
    ("int-vs-float-tolerance", lambda p: p.edit(lambda r: r["tolerance"]["y"].update(rtol=0.0001))),
]


@pytest.mark.parametrize("mutate", [t[1] for t in NOT_PROTECTED], ids=[t[0] for t in NOT_PROTECTED])
def test_changes_outside_the_manifest_still_verify(project, mutate):
    before = manifest_bytes(suite_manifest(project.load()))
    mutate(project)
    assert manifest_bytes(suite_manifest(project.load())) == before
    result = project.verify()
    assert result.ok, result.problems


def test_equal_numbers_sign_alike(project):
    before = manifest_bytes(suite_manifest(project.load()))
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0))
    zero_int = manifest_bytes(suite_manifest(project.load()))
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.0))
    assert manifest_bytes(suite_manifest(project.load())) == zero_int != before


# --------------------------------------------------------------------------- line endings, determinism


def _to_crlf(path: Path) -> None:
    data = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    path.write_bytes(data)
    assert b"\r\n" in path.read_bytes()


@pytest.mark.parametrize("files", [["cudagate.yaml"], ["reference.py"], ["softmax.cu"],
                                   ["cudagate.yaml", "reference.py", "softmax.cu"]])
def test_crlf_does_not_change_the_manifest(project, files):
    before = manifest_bytes(suite_manifest(project.load()))
    for name in files:
        _to_crlf(project.suite_dir / name)
    assert manifest_bytes(suite_manifest(project.load())) == before
    assert project.verify().ok


def test_crlf_in_cuda_reference_and_header(cuda_project):
    before = manifest_bytes(suite_manifest(cuda_project.load()))
    for name in ("reference.cu", "ref_common.cuh", "cudagate.yaml"):
        _to_crlf(cuda_project.suite_dir / name)
    assert manifest_bytes(suite_manifest(cuda_project.load())) == before
    assert cuda_project.verify().ok


def test_npy_files_are_hashed_as_binary(tmp_path):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    a.write_bytes(b"\x93NUMPY\x01\x00\r\n\x00")
    b.write_bytes(b"\x93NUMPY\x01\x00\n\x00")
    assert file_sha256(a) != file_sha256(b)
    ca, cb = tmp_path / "a.cu", tmp_path / "b.cu"
    ca.write_bytes(b"int x;\r\nint y;\r\n")
    cb.write_bytes(b"int x;\nint y;\n")
    assert file_sha256(ca) == file_sha256(cb)


def test_manifest_is_canonical_and_location_independent(project, tmp_path):
    one = manifest_bytes(suite_manifest(project.load()))
    assert one == manifest_bytes(suite_manifest(project.load()))
    assert b"\n" not in one and b", " not in one and b": " not in one
    text = one.decode("utf-8")
    assert json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False) == text
    assert str(tmp_path) not in text and "\\" not in text  # paths are relative, with '/'
    manifest = json.loads(text)
    assert set(manifest["cases"]["perf_256x1024"]["files"]) == {"cases/perf_256x1024/x.npy",
                                                                 "cases/perf_256x1024/expected/y.npy"}
    assert manifest["reference"] == {"python": {"file": "reference.py", "function": "softmax_rows",
                                                "sha256": file_sha256(project.suite_dir / "reference.py")}}
    assert "source" not in json.dumps(manifest["kernels"]) and "sha256" not in json.dumps(manifest["kernels"])
    elsewhere = tmp_path / "elsewhere" / "deep" / "softmax"
    shutil.copytree(project.suite_dir, elsewhere)
    assert manifest_bytes(suite_manifest(load_suite(elsewhere / "cudagate.yaml"))) == one


def test_diff_of_identical_manifests_is_empty(project):
    manifest = suite_manifest(project.load())
    assert diff_manifests(manifest, json.loads(json.dumps(manifest))) == []


# --------------------------------------------------------------------------- signing refuses what it cannot vouch for


def test_sign_refuses_unexpected_and_missing_files(project):
    _write_npy(project.suite_dir / "cases" / "correct_7x33" / "extra.npy")
    with pytest.raises(FileError) as info:
        project.sign()
    assert any("unexpected file cases/correct_7x33/extra.npy" in p for p in info.value.problems)
    (project.suite_dir / "cases" / "correct_7x33" / "extra.npy").unlink()
    (project.suite_dir / "cases" / "correct_7x33" / "x.npy").unlink()
    with pytest.raises(FileError) as info:
        project.sign()
    assert any("cases/correct_7x33/x.npy: missing" in p for p in info.value.problems)


def test_sign_refuses_case_data_that_does_not_fit_the_signature(project):
    np.save(project.suite_dir / "cases" / "correct_7x33" / "x.npy", np.zeros(5, dtype=np.float32))
    with pytest.raises(FileError) as info:
        project.sign()
    assert any("case correct_7x33" in p and "x.npy" in p for p in info.value.problems)


def test_resign_after_review_makes_it_trusted_again(project):
    project.edit(lambda r: r["tolerance"]["y"].update(atol=1e-5))
    assert not project.verify().ok
    project.sign()
    assert project.verify().ok


# --------------------------------------------------------------------------- keys: unknown, rotation, revocation


def test_signature_by_unknown_key_fails_naming_it(project):
    mallory = project.new_key("mallory", trusted=False)
    project.sign(mallory, signer="mallory")
    result = project.verify()
    assert not result.ok and result.key_id == mallory.key_id
    text = "\n".join(result.problems)
    assert f"signed by key {mallory.key_id} (signer mallory), which is not trusted" in text
    assert SIGNATURE_FILENAME in text
    assert p_fix_mentions_trusted_keys(result.fix)


def p_fix_mentions_trusted_keys(fix: str) -> bool:
    return ".cudagate/trusted_keys/" in fix and "cudagate sign" in fix


def test_key_rotation_either_trusted_key_verifies(project):
    bob = project.new_key("bob")
    assert set(project.trusted()) == {project.alice.key_id, bob.key_id}
    project.sign(bob, signer="bob")
    result = project.verify()
    assert result.ok and result.key_id == bob.key_id and result.signer == "bob"
    project.sign(project.alice)
    result = project.verify()
    assert result.ok and result.key_id == project.alice.key_id and result.signer == "alice"


def test_revocation_removing_the_signers_pub_fails_naming_the_key(project):
    project.new_key("bob")
    project.alice.public_path.unlink()
    result = project.verify()
    assert not result.ok
    text = "\n".join(result.problems)
    assert project.alice.key_id in text and "not trusted" in text
    assert "signer alice" in text


def test_trusted_keys_from_settings(project, tmp_path):
    carol = generate_key_pair("carol", private_path=tmp_path / "ext" / "carol.key", public_path=tmp_path / "ext" / "carol.pub")
    project.sign(carol, signer="carol")
    assert not project.verify().ok
    (project.root / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\n[tool.cudagate]\ntrusted_keys = [{json.dumps(str(tmp_path / "ext" / "carol.pub"))}]\n')
    assert carol.key_id in project.trusted()
    assert project.verify().ok


def test_missing_settings_key_path_is_a_clear_error(project):
    (project.root / "pyproject.toml").write_text('[tool.cudagate]\ntrusted_keys = ["keys/nowhere.pub"]\n')
    with pytest.raises(FileError) as info:
        project.trusted()
    assert info.value.path.endswith("pyproject.toml") and "keys/nowhere.pub" in str(info.value)


def test_trusted_key_ids_env_pins_the_trust_root(project, monkeypatch):
    intruder = project.new_key("intruder")  # a pull request adding its own .pub
    project.sign(intruder, signer="intruder")
    assert project.verify().ok
    monkeypatch.setenv(TRUSTED_IDS_ENV, project.alice.key_id)
    result = project.verify()
    assert not result.ok and f"{TRUSTED_IDS_ENV} does not list it" in "\n".join(result.problems)
    project.sign()
    assert project.verify().ok


def test_public_key_file_holding_a_private_key_is_refused(project):
    leaked = project.root / ".cudagate" / "trusted_keys" / "oops.pub"
    pem = project.alice.private_path.read_text()
    leaked.write_text(pem)
    with pytest.raises(FileError) as info:
        project.trusted()
    assert "PRIVATE key" in str(info.value) and pem.splitlines()[1] not in str(info.value)


def test_public_keys_in_openssh_form_are_accepted(project, tmp_path):
    public = load_public_key(project.alice.public_path)
    ssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (tmp_path / "alice_ssh.pub").write_bytes(ssh + b" alice@laptop\n")
    assert key_id(load_public_key(tmp_path / "alice_ssh.pub")) == project.alice.key_id


def test_key_id_is_sha256_prefix_of_raw_public_key(project):
    raw = load_public_key(project.alice.public_path).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert project.alice.key_id == hashlib.sha256(raw).hexdigest()[:16]


def test_find_project_root(project, tmp_path):
    assert find_project_root(project.suite_dir) == project.root.resolve()
    assert find_project_root(project.suite_file) == project.root.resolve()
    (tmp_path / "git_only" / ".git").mkdir(parents=True)
    (tmp_path / "git_only" / "a" / "b").mkdir(parents=True)
    assert find_project_root(tmp_path / "git_only" / "a" / "b") == (tmp_path / "git_only").resolve()


# --------------------------------------------------------------------------- the signature file itself


def _sig(project) -> Path:
    return project.suite_dir / SIGNATURE_FILENAME


def _rewrite(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


BROKEN_SIGNATURE_FILES = [
    ("truncated", lambda path: path.write_text(path.read_text()[: len(path.read_text()) // 2]), "not valid JSON"),
    ("empty", lambda path: path.write_text(""), "not valid JSON"),
    ("not-an-object", lambda path: path.write_text("[1, 2]"), "expected an object"),
    ("missing-key-id", lambda path: _rewrite(path, lambda d: d["signature"].pop("key_id")), "'key_id' is a required property"),
    ("wrong-algorithm", lambda path: _rewrite(path, lambda d: d["signature"].update(algorithm="rsa")), "signature.algorithm"),
    ("bad-value", lambda path: _rewrite(path, lambda d: d["signature"].update(value="not base64!")), "signature.value"),
    ("manifest-not-object", lambda path: _rewrite(path, lambda d: d.update(manifest=[])), "manifest"),
    ("unknown-field", lambda path: _rewrite(path, lambda d: d.update(extra=1)), "extra"),
    ("bad-hash", lambda path: _rewrite(path, lambda d: d["manifest"]["cases"]["perf_256x1024"]["files"].update(
        {"cases/perf_256x1024/x.npy": "abc"})), "manifest.cases.perf_256x1024.files.cases/perf_256x1024/x.npy"),
]


@pytest.mark.parametrize("breaks, message", [b[1:] for b in BROKEN_SIGNATURE_FILES],
                         ids=[b[0] for b in BROKEN_SIGNATURE_FILES])
def test_broken_signature_file_is_a_clear_error(project, breaks, message):
    breaks(_sig(project))
    with pytest.raises(FileError) as info:
        load_signature_file(_sig(project))
    assert info.value.path.endswith(SIGNATURE_FILENAME)
    assert message in str(info.value), str(info.value)
    result = project.verify()
    assert not result.ok
    assert all(SIGNATURE_FILENAME in p for p in result.problems) and message in "\n".join(result.problems)


def test_missing_signature_file(project):
    _sig(project).unlink()
    result = project.verify()
    assert not result.ok and "cudagate.sig.json: missing: this suite has not been signed" in result.problems[0]


def test_manifest_edited_inside_the_signature_file_is_caught(project):
    # An attacker relaxes the tolerance in both the suite and the stored manifest.
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.5))
    _rewrite(_sig(project), lambda d: d["manifest"]["tolerance"]["y"].update(atol=0.5))
    result = project.verify()
    assert not result.ok
    assert any("does not match the signed content" in p and project.alice.key_id in p for p in result.problems)


@pytest.mark.parametrize("field, value", [("signer", "bob"), ("signed_at", "2020-01-01T00:00:00Z"),
                                          ("tool_version", "9.9.9")])
def test_signature_metadata_is_signed_too(project, field, value):
    _rewrite(_sig(project), lambda d: d["signature"].update({field: value}))
    result = project.verify()
    assert not result.ok and any("does not match the signed content" in p for p in result.problems)


def test_signature_value_bit_flip(project):
    def flip(d):
        raw = bytearray(base64.b64decode(d["signature"]["value"]))
        raw[0] ^= 1
        d["signature"]["value"] = base64.b64encode(bytes(raw)).decode()
    _rewrite(_sig(project), flip)
    assert not project.verify().ok


def test_unchecked_hash_pyc_beside_python_reference_is_refused(project):
    source = project.suite_dir / "reference.py"
    cache = project.suite_dir / "__pycache__" / f"reference.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(source), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert project.verify().ok
    cache.unlink()
    py_compile.compile(str(source), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    result = project.verify()
    assert not result.ok and any("unchecked hash-based bytecode" in p for p in result.problems)


# --------------------------------------------------------------------------- generic documents (approvals ledger)


def test_sign_and_verify_document(project):
    key = project.key()
    trusted = project.trusted()
    entry = {"kernel": "softmax_rows", "source_sha256": "ab" * 32, "baseline_ms": 0.125, "note": "ünïcode"}
    record = sign_document(entry, key, signer="alice", purpose="approval")
    assert record["algorithm"] == "ed25519" and record["key_id"] == project.alice.key_id
    assert record["signed_at"].endswith("Z")
    verify_document(dict(reversed(list(entry.items()))), record, trusted)  # key order is irrelevant
    verify_document(entry, record, trusted, purpose="approval")
    with pytest.raises(SignatureError) as info:
        verify_document({**entry, "baseline_ms": 0.5}, record, trusted)
    assert info.value.reason == "invalid" and info.value.key_id == project.alice.key_id
    with pytest.raises(SignatureError) as info:
        verify_document(entry, record, trusted, purpose="suite-manifest")
    assert info.value.reason == "purpose"
    with pytest.raises(SignatureError) as info:
        verify_document(entry, {**record, "signer": "bob"}, trusted)
    assert info.value.reason == "invalid"
    with pytest.raises(SignatureError) as info:
        verify_document(entry, record, {})
    assert info.value.reason == "untrusted" and project.alice.key_id in str(info.value)
    with pytest.raises(SignatureError) as info:
        verify_document(entry, {"algorithm": "ed25519"}, trusted)
    assert info.value.reason == "malformed"


def test_suite_signature_is_not_valid_for_another_purpose(project):
    doc = json.loads(_sig(project).read_text())
    with pytest.raises(SignatureError):
        verify_document(doc["manifest"], doc["signature"], project.trusted(), purpose="approval")
    verify_document(doc["manifest"], doc["signature"], project.trusted())


def test_canonical_bytes_refuse_nan():
    with pytest.raises(ValueError):
        canonical_bytes({"x": float("nan")})
    assert canonical_bytes({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode("utf-8")


# --------------------------------------------------------------------------- the gate hook


def test_gate_problems(project):
    suite = project.load()
    assert gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=False) == []
    assert gate_problems(suite, None, None, allow_unsigned=False) == []  # finds the root itself
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.5))
    suite = project.load()
    problems = gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=False)
    assert "tolerance.y.atol: 1e-06 → 0.5" in problems
    assert problems[-1].startswith("fix: ") and "cudagate sign" in problems[-1]
    assert gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=True) == []
    _sig(project).unlink()
    problems = gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=False)
    assert any(SIGNATURE_FILENAME in p and "not been signed" in p for p in problems)


def test_gate_problems_without_any_trusted_key(project):
    shutil.rmtree(project.root / ".cudagate")
    problems = gate_problems(project.load(), project.root, None, allow_unsigned=False)
    assert problems and "no trusted signing keys" in problems[0] and "cudagate keygen" in problems[-1]


# --------------------------------------------------------------------------- keygen, private keys, the CLI


def test_keygen_writes_0600_private_key_and_refuses_to_overwrite(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    assert trust_main(["keygen", "--name", "dave"]) == 0
    out = capsys.readouterr().out
    private = Path(os.environ["XDG_CONFIG_HOME"]) / "cudagate" / "keys" / "dave.key"
    public = project.root / ".cudagate" / "trusted_keys" / "dave.pub"
    assert private.is_file() and public.is_file()
    if sys.platform != "win32":
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    kid = key_id(load_private_key(private))
    assert kid in out and key_id(load_public_key(public)) == kid
    before = private.read_bytes(), public.read_bytes()
    assert trust_main(["keygen", "--name", "dave"]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "dave.key" in err
    assert (private.read_bytes(), public.read_bytes()) == before
    # the public half alone existing also stops it (replacing it would silently revoke)
    private.unlink()
    assert trust_main(["keygen", "--name", "dave"]) == 2
    assert "dave.pub" in capsys.readouterr().err and not private.exists()


def test_keygen_out_dir_and_bad_name(tmp_path, capsys):
    assert trust_main(["keygen", "--name", "ci", "--out", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "ci.key").is_file() and (tmp_path / "k" / "ci.pub").is_file()
    if sys.platform != "win32":
        assert stat.S_IMODE((tmp_path / "k" / "ci.key").stat().st_mode) == 0o600
    assert trust_main(["keygen", "--name", "../evil", "--out", str(tmp_path / "k")]) == 2
    assert "key name" in capsys.readouterr().err


def _secrets(private_path: Path) -> list[bytes]:
    pem = private_path.read_bytes()
    key = load_private_key(private_path)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
    forms = [pem.strip(), body, raw, raw.hex().encode(), raw.hex().upper().encode(), base64.b64encode(raw),
             base64.b64encode(raw).rstrip(b"="), base64.urlsafe_b64encode(raw).rstrip(b"=")]
    return forms


def _scan(secrets: list[bytes], text: bytes, where: str) -> None:
    for secret in secrets:
        assert secret not in text, f"private key material found in {where}"


def test_private_key_never_leaks(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    captured = []

    def run(argv, env_value=None):
        if env_value is None:
            monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
        else:
            monkeypatch.setenv(SIGNING_KEY_ENV, env_value)
        rc = trust_main(argv)
        out = capsys.readouterr()
        captured.append(out.out + out.err)
        return rc

    assert run(["keygen", "--name", "erin"]) == 0
    private = Path(os.environ["XDG_CONFIG_HOME"]) / "cudagate" / "keys" / "erin.key"
    secrets = _secrets(private)
    pem = private.read_text()
    raw_b64 = base64.b64encode(_secrets(private)[2]).decode()
    suite = str(project.suite_file)
    assert run(["sign", suite, "--key", str(private)]) == 0
    assert run(["verify", suite]) == 0
    assert run(["sign", suite, "--signer", "erin"]) == 0  # found in the default key folder
    assert run(["sign", suite], env_value=pem) == 0
    assert run(["sign", suite], env_value=raw_b64) == 0
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.5))
    assert run(["verify", suite]) == 1
    # broken keys: the error must describe, never echo
    assert run(["sign", suite], env_value=pem[:-40]) == 2
    assert run(["sign", suite], env_value=raw_b64[:-3] + "!!") == 2
    assert run(["sign", suite], env_value=raw_b64 + "AAAA") == 2
    broken = tmp_path / "broken.key"
    broken.write_text(pem.replace("\n-----END", "X\n-----END"))
    assert run(["sign", suite, "--key", str(broken)]) == 2
    assert run(["sign", suite, "--key", str(project.alice.public_path)]) == 2
    for text in captured:
        _scan(secrets, text.encode(), "command output")
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.resolve() != private.resolve() and path != broken:
            _scan(secrets, path.read_bytes(), str(path))
    assert any("not shown" in t for t in captured)


def test_private_key_errors_name_the_source_without_material(project, monkeypatch, tmp_path):
    pem = project.alice.private_path.read_text()
    monkeypatch.setenv(SIGNING_KEY_ENV, pem.replace("M", "N"))
    with pytest.raises(CudagateError) as info:
        load_private_key(None)
    assert SIGNING_KEY_ENV in str(info.value)
    for line in pem.splitlines()[1:-1]:
        assert line not in str(info.value) and line.replace("M", "N") not in str(info.value)
    monkeypatch.delenv(SIGNING_KEY_ENV)
    with pytest.raises(CudagateError) as info:
        load_private_key(None)
    assert "--key FILE" in str(info.value) and SIGNING_KEY_ENV in str(info.value)
    with pytest.raises(FileError) as info:
        load_private_key(tmp_path / "nope.key")
    assert info.value.path.endswith("nope.key")


@pytest.mark.parametrize("form", ["pem", "pem-escaped-newlines", "base64", "base64-urlsafe-nopad", "hex"])
def test_env_var_signing_key(project, monkeypatch, capsys, form):
    key = project.key()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    pem = project.alice.private_path.read_text()
    value = {"pem": pem, "pem-escaped-newlines": pem.replace("\n", "\\n"), "base64": base64.b64encode(raw).decode(),
             "base64-urlsafe-nopad": base64.urlsafe_b64encode(raw).decode().rstrip("="), "hex": raw.hex()}[form]
    monkeypatch.setenv(SIGNING_KEY_ENV, value)
    assert key_id(load_private_key(None)) == project.alice.key_id
    project.edit(lambda r: r["tolerance"]["y"].update(atol=1e-5))
    assert trust_main(["sign", str(project.suite_dir)]) == 0
    out = capsys.readouterr().out
    assert f"as alice with key {project.alice.key_id}" in out  # signer named after the trusted alice.pub
    result = project.verify()
    assert result.ok and result.key_id == project.alice.key_id


def test_encrypted_private_key_needs_passphrase(project, tmp_path, monkeypatch):
    key = project.key()
    enc = tmp_path / "enc.key"
    enc.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"s3cret-pass")))
    with pytest.raises(FileError) as info:
        load_private_key(enc)
    assert "CUDAGATE_SIGNING_KEY_PASSPHRASE" in str(info.value)
    monkeypatch.setenv("CUDAGATE_SIGNING_KEY_PASSPHRASE", "s3cret-pass")
    assert key_id(load_private_key(enc)) == project.alice.key_id


def test_cli_verify_output_and_exit_codes(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    assert trust_main(["verify", "kernels"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "OK" in out and project.alice.key_id in out and "alice" in out
    np.save(project.suite_dir / "cases" / "perf_256x1024" / "x.npy", np.ones((256, 1024), dtype=np.float32))
    project.edit(lambda r: r["tolerance"]["y"].update(atol=1e-2))
    assert trust_main(["verify", str(project.suite_file)]) == 1
    out = capsys.readouterr().out
    assert "NOT TRUSTED" in out
    assert "cases/perf_256x1024/x.npy: sha256 changed" in out
    assert "tolerance.y.atol: 1e-06 → 0.01" in out
    assert "cudagate sign kernels/softmax/cudagate.yaml" in out


def test_cli_sign_warns_when_key_not_trusted(project, tmp_path, capsys):
    frank = generate_key_pair("frank", private_path=tmp_path / "f" / "frank.key", public_path=tmp_path / "f" / "frank.pub")
    assert trust_main(["sign", str(project.suite_file), "--key", str(frank.private_path), "--signer", "frank"]) == 0
    err = capsys.readouterr().err
    assert frank.key_id in err and "not among the project's trusted keys" in err


def test_cli_sign_without_any_key_is_a_clear_error(project, capsys):
    assert trust_main(["sign", str(project.suite_file)]) == 2
    err = capsys.readouterr().err
    assert "no signing key" in err and SIGNING_KEY_ENV in err


def test_register_sets_func_for_each_subcommand():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    for argv in (["keygen", "--name", "x"], ["sign", "s.yaml", "--key", "k", "--signer", "n"], ["verify", "s.yaml"]):
        assert callable(parser.parse_args(argv).func)
