"""Generated cases (``generated: true``): signed without their arrays, rebuilt at run time.

A large case's arrays are too big to commit (a 2048³ float32 matmul needs 48 MB), so its folder
holds only ``generated.json`` (``schemas/generated-case.schema.json``): the SHA-256 of each input
array drawn from the case's seed, and ``sample/<output>.npy``: the reference's expected values at
up to :data:`SAMPLE_SIZE` indices per output, chosen from the seed. Both are signed in the suite's
manifest like any case file. At run time the case is rebuilt from them and checked against them
(:func:`pytest_cudagate.defences.expected.materialise`, which runs the trusted reference).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import dtype_name, numpy_dtype

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary.npy import npy_header
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.suite.draw import case_seed, draw_inputs
from pytest_cudagate.suite.model import Case, Suite

GENERATED_FILE = "generated.json"
GENERATED_FORMAT = 1
SAMPLE_SIZE = 4096  # expected values signed per output
MAX_GENERATED_BYTES = 64 * 1024  # generated.json: digests and shapes only


class GeneratedCaseError(CudagateError):
    """A generated case whose drawn inputs or reference outputs do not match what was signed."""


@dataclass(frozen=True)
class InputDigest:
    dtype: str
    shape: tuple[int, ...]
    sha256: str


@dataclass(frozen=True)
class GeneratedRecord:
    """``generated.json`` as read: what the maintainer signed for one generated case."""

    case: str
    seed: int
    inputs: dict[str, InputDigest]
    sample: dict[str, int]  # values signed per output
    note: str = ""


def record_path(suite: Suite, case: Case) -> Path:
    return suite.case_dir(case) / GENERATED_FILE


def sample_path(suite: Suite, case: Case, output: str) -> Path:
    return suite.case_dir(case) / "sample" / f"{output}.npy"


def generated_files(suite: Suite, case: Case) -> list[Path]:
    """The signed files of a generated case: its record and one sample per output."""
    return [record_path(suite, case)] + [sample_path(suite, case, p.name) for p in suite.outputs]


def array_sha256(array: np.ndarray) -> str:
    """SHA-256 of an array's elements in C order, little-endian (its shape and dtype are stored beside)."""
    values = np.ascontiguousarray(array)
    values = values.astype(values.dtype.newbyteorder("<"), copy=False)
    return hashlib.sha256(values.reshape(-1).view(np.uint8)).hexdigest()  # the bytes in place, no copy


def sample_indices(seed: int, output: str, total: int) -> np.ndarray:
    """Flat indices, ascending, of the expected values signed for ``output`` (all of them when few)."""
    if total <= SAMPLE_SIZE:
        return np.arange(total)
    rng = np.random.default_rng([seed, zlib.crc32(output.encode())])
    return np.sort(rng.choice(total, size=SAMPLE_SIZE, replace=False))


def fix(suite: Suite, case: Case) -> str:
    return f"re-run `{command('cudagate', 'cases', 'generate', suite.path, '--case', case.name)}` and re-sign"


# -- writing (cudagate cases generate) -----------------------------------------------------------


def write_generated(suite: Suite, case: Case, seed: int, inputs: dict[str, np.ndarray],
                    expected: dict[str, np.ndarray], folder: Path, note: str = "") -> Path:
    """Write ``generated.json`` and the output samples of ``case`` into ``folder`` (never its arrays)."""
    (folder / "sample").mkdir(parents=True, exist_ok=True)
    document = {
        "format": GENERATED_FORMAT, "suite": suite.name, "case": case.name, "seed": seed,
        "inputs": {name: {"dtype": dtype_name(a.dtype), "shape": list(a.shape), "sha256": array_sha256(a)}
                   for name, a in inputs.items()},
        "sample": {},
    }
    for name, array in expected.items():
        flat = array.reshape(-1)
        values = flat[sample_indices(seed, name, flat.size)]
        np.save(folder / "sample" / f"{name}.npy", values)
        document["sample"][name] = {"dtype": dtype_name(values.dtype), "count": int(values.size)}
    if note:
        document["note"] = note
    path = folder / GENERATED_FILE
    schema.validate(document, "generated-case", path)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return folder


# -- reading (cudagate check, the gate) ----------------------------------------------------------


def read_record(suite: Suite, case: Case) -> GeneratedRecord:
    """``generated.json`` of ``case``, size- and depth-bounded and schema-checked (it is read before
    or without a signature check by ``cudagate check``); :class:`FileError` otherwise."""
    path = record_path(suite, case)
    try:
        document = boundary.load_json(path, MAX_GENERATED_BYTES, "generated-case file")
    except FileNotFoundError:
        raise FileError(path, [f"missing (case {case.name} is generated: true); {fix(suite, case)}"]) from None
    if not isinstance(document, dict):
        raise FileError(path, ["(top level): expected a JSON object (a generated case's digests and sample)"])
    schema.validate(document, "generated-case", path)
    return GeneratedRecord(
        case=document["case"], seed=document["seed"],
        inputs={name: InputDigest(d["dtype"], tuple(d["shape"]), d["sha256"]) for name, d in document["inputs"].items()},
        sample={name: s["count"] for name, s in document["sample"].items()}, note=document.get("note", ""))


def check_generated(suite: Suite, case: Case) -> list[str]:
    """Problems of a generated case's files against the suite; empty when sound."""
    try:
        record = read_record(suite, case)
    except FileError as exc:
        return [f"{display_path(exc.path)}: {p}" for p in exc.problems]
    where = display_path(record_path(suite, case))
    problems = []
    if record.case != case.name:
        problems.append(f"{where}: case: {record.case!r}, but it lies in the folder of case {case.name!r}")
    if record.seed != case_seed(suite, case):
        problems.append(f"{where}: seed: {record.seed}, but the case's seed is {case_seed(suite, case)}")
    resolved = suite.resolved(case)
    inputs = [p for p in suite.buffers if p.is_input]
    if sorted(record.inputs) != sorted(p.name for p in inputs):
        problems.append(f"{where}: inputs: {sorted(record.inputs)}, but the signature's inputs are "
                        f"{sorted(p.name for p in inputs)}")
    for param in inputs:
        digest = record.inputs.get(param.name)
        if digest is not None and (digest.dtype != param.dtype or digest.shape != resolved.shapes[param.name]):
            problems.append(f"{where}: inputs.{param.name}: {digest.dtype} {list(digest.shape)}, but the signature "
                            f"says {param.dtype} {list(resolved.shapes[param.name])} in case {case.name!r}")
    for param in suite.outputs:
        want = min(SAMPLE_SIZE, resolved.counts[param.name])
        if record.sample.get(param.name) != want:
            problems.append(f"{where}: sample.{param.name}: count {record.sample.get(param.name)}, but output "
                            f"{param.name!r} needs {want} sampled values")
            continue
        problems += _sample_problems(sample_path(suite, case, param.name), param.dtype, want)
    return [f"{p}; {fix(suite, case)}" for p in problems]


def _sample_problems(path: Path, dtype: str, count: int) -> list[str]:
    if not path.is_file():
        return [f"{display_path(path)}: missing"]
    try:
        shape, found = npy_header(path, limit=count * 16)
    except FileError as exc:
        return [f"{display_path(path)}: {exc.problems[0]}"]
    if shape != (count,) or found != numpy_dtype(dtype):
        return [f"{display_path(path)}: holds {dtype_name(found)} {list(shape)}, but the sample is {dtype} [{count}]"]
    return []


def drawn_inputs(suite: Suite, case: Case, record: GeneratedRecord) -> dict[str, np.ndarray]:
    """``case``'s inputs drawn from its seed, each checked against the sha256 ``record`` signs;
    :class:`GeneratedCaseError` at the first that differs."""
    seed = case_seed(suite, case)
    inputs = draw_inputs(suite, case, seed)
    where = display_path(record_path(suite, case))
    for name, array in inputs.items():
        signed, found = record.inputs[name].sha256, array_sha256(array)
        if found != signed:
            raise GeneratedCaseError(
                f"generated case {case.name}: input {name!r} drawn from seed {seed} has sha256 {found[:16]}…, "
                f"but {where} signs {signed[:16]}…: numpy's generator changed or the case was edited; "
                f"{fix(suite, case)}")
    return inputs
