"""A signed copy of examples/softmax in a temporary project, for the trust tests (no GPU needed)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from pytest_cudagate.config import load_settings
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import (SIGNATURE_FILENAME, SIGNING_KEY_ENV, TRUSTED_IDS_ENV, generate_key_pair,
                                   load_private_key, load_trusted_keys, sign_suite, verify_suite)


REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "softmax"
SIGN_FIX = "a maintainer reviews the change and runs `cudagate sign"
REGENERATE_FIX = "fix: run `cudagate cases generate"

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
def clean_env(monkeypatch, tmp_path):
    for name in (SIGNING_KEY_ENV, TRUSTED_IDS_ENV, "CUDAGATE_SIGNING_KEY_PASSPHRASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def make_project(tmp_path: Path, cuda_reference: bool = False) -> Project:
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


def write_npy(path: Path) -> None:
    """An array file the signature does not cover."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.arange(231, dtype=np.float32))


@pytest.fixture
def project(tmp_path) -> Project:
    return make_project(tmp_path)


@pytest.fixture
def cuda_project(tmp_path) -> Project:
    return make_project(tmp_path, cuda_reference=True)

