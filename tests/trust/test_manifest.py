"""trust.manifest: what a suite's signature covers, and every change to it detected (tamper, case data,
line endings, canonical form)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import diff_manifests, file_sha256, manifest_bytes, suite_manifest
from trust_project import (EXAMPLE, REFERENCE_CU, REFERENCE_CUH, REGENERATE_FIX, SIGN_FIX, Project, clean_env, cuda_project,  # noqa: F401
                           project, write_npy)


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
    ("unexpected-npy", lambda p: write_npy(p.suite_dir / "cases" / "correct_7x33" / "extra.npy"),
     ["unexpected file cases/correct_7x33/extra.npy"]),
    ("unexpected-expected-npy", lambda p: write_npy(p.suite_dir / "cases" / "correct_7x33" / "expected" / "z.npy"),
     ["unexpected file cases/correct_7x33/expected/z.npy"]),
    ("unexpected-case-folder", lambda p: write_npy(p.suite_dir / "cases" / "sneaky" / "x.npy"),
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
    # after a reference change the expected outputs are stale: they are generated again before signing
    reference = any(piece.startswith(("reference", "ref_common")) for piece in expected)
    assert (REGENERATE_FIX if reference else SIGN_FIX) in result.fix, result.fix
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

