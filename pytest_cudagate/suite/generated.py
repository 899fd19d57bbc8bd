"""Generated cases (``generated: true``): signed without their arrays, rebuilt at run time.

A large case's arrays are too big to commit (a 2048³ float32 matmul needs 48 MB), so its folder
holds only ``generated.json`` (``schemas/generated-case.schema.json``): the SHA-256 of each input
array drawn from the case's seed, and ``sample/<output>.npy``: the reference's expected values at
up to :data:`SAMPLE_SIZE` indices per output, chosen from the seed. Both are signed in the suite's
manifest like any case file. At run time :func:`materialise` draws the inputs again, checks their
digests, runs the trusted reference, checks its outputs at the sample indices, and writes the
arrays into the run's folder, where the gate then reads them exactly as it reads a stored case.

A warm machine takes the arrays from the per-user cache (suite/generated_cache.py) instead of
drawing and running the reference, keyed by the bytes of ``generated.json`` and the samples, the
case's scalars, the reference's identity and numpy's version, and verifies them just as strictly:
the inputs against the signed digests, the outputs against the digests recorded with them and the
signed sample. An entry that fails is discarded and the case rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import dtype_name, numpy_dtype

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary.npy import npy_header
from pytest_cudagate.defences.reference import ReferenceRunner
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.suite.draw import case_seed, draw_inputs, write_case
from pytest_cudagate.suite.generated_cache import GeneratedCache, cache_root
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


# -- run time (the gate) -------------------------------------------------------------------------


def materialise(suite: Suite, case: Case, *, client, root: Path, notes: list[str] | None = None) -> Path:
    """The folder under ``root`` holding ``case``'s verified arrays, which the suite then reads
    (:meth:`Suite.arrays_dir`); done once per suite object while the folder lasts. The drawn inputs
    may come from the per-user cache (checked against their signed digests like a fresh draw; an
    entry that fails is noted in ``notes``); the expected outputs never do: the trusted reference
    computes them every time, since only a small sample of them is signed.
    :class:`GeneratedCaseError` when the drawn inputs or the reference disagree with what was signed."""
    known = suite.arrays_dir(case)
    if known != suite.case_dir(case) and all(p.is_file() for p in suite.resolved(case).inputs.values()):
        return known
    problems = check_generated(suite, case)
    if problems:
        raise GeneratedCaseError(f"generated case {case.name}: its signed files do not match the suite:\n"
                                 + "\n".join(f"  - {p}" for p in problems))
    record = read_record(suite, case)
    seed = case_seed(suite, case)
    folder = root / case.name
    root.mkdir(parents=True, exist_ok=True)
    cache_folder = cache_root()
    cache = GeneratedCache(cache_folder) if cache_folder is not None else None
    key = _cache_key(suite, case) if cache is not None else None
    inputs = None
    if key is not None and cache.fetch(key, folder):
        try:
            inputs = _cached_inputs(suite, case, record, folder)
        except (CudagateError, OSError, ValueError, EOFError) as exc:
            cache.discard(key)
            if notes is not None:
                notes.append(f"the cached inputs of generated case {case.name} ({display_path(cache.entry(key))}) "
                             f"failed verification and were discarded; they were drawn again: {exc}")
    drawn = inputs is None
    if drawn:
        inputs = drawn_inputs(suite, case, record)
    expected = ReferenceRunner(suite, client, root).expected([case], {case.name: inputs})[case.name]
    for param in suite.outputs:
        check_sample(suite, case, param.name, seed, expected[param.name])
    if drawn:
        shutil.rmtree(folder, ignore_errors=True)
        folder = write_case(suite, case, inputs, expected, root)
        if key is not None:
            cache.store(key, folder, {"case": case.name})
    else:  # the verified inputs stay as the cache placed them (links, never written through): outputs only
        folder = write_case(suite, case, {}, expected, root)
    suite.use_arrays(case, folder)
    return folder


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


def _cache_key(suite: Suite, case: Case) -> str | None:
    """The cache key of ``case``'s drawn inputs: everything they follow from (None when the signed
    files cannot be read). The signed files' bytes cover the seed and the input digests."""
    try:
        signed = [hashlib.sha256(p.read_bytes()).hexdigest() for p in generated_files(suite, case)]
    except OSError:
        return None
    document = {"format": 2, "suite": suite.name, "case": case.name, "scalars": case.scalars, "signed": signed,
                "numpy": np.__version__}
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def _cached_inputs(suite: Suite, case: Case, record: GeneratedRecord, folder: Path) -> dict[str, np.ndarray]:
    """The cached inputs placed in ``folder``, each checked against its signed dtype, shape and
    sha256 exactly as a fresh draw is; raises on the first difference."""
    resolved = suite.resolved(case)
    inputs = {}
    for param in suite.buffers:
        if param.is_input:
            array = np.load(folder / f"{param.name}.npy", allow_pickle=False)
            signed = record.inputs[param.name]
            if array.dtype != numpy_dtype(signed.dtype) or array.shape != resolved.shapes[param.name]:
                raise GeneratedCaseError(f"input {param.name!r} is {array.dtype} {list(array.shape)}")
            if array_sha256(array) != signed.sha256:
                raise GeneratedCaseError(f"input {param.name!r} does not match its signed sha256 {signed.sha256[:16]}…")
            inputs[param.name] = array
    return inputs


def check_sample(suite: Suite, case: Case, output: str, seed: int, computed: np.ndarray) -> None:
    """The reference's ``computed`` output at the sample indices against the signed sample, within the
    output's element-wise tolerance (the sample file was header-checked by :func:`check_generated`)."""
    signed = np.load(sample_path(suite, case, output), allow_pickle=False)
    indices = sample_indices(seed, output, computed.size)
    tolerance = dataclasses.replace(suite.tolerance[output], max_rel_norm=None)  # element-wise on a sample
    check = check_output(output, computed.reshape(-1)[indices], signed, tolerance, output_scale=False)
    if check.ok:
        return
    worst = tuple(int(i) for i in np.unravel_index(int(indices[check.worst_index[0]]), computed.shape))
    raise GeneratedCaseError(
        f"generated case {case.name}: the reference's output {output!r} disagrees with the signed sample at "
        f"{check.mismatches} of {check.total} sampled indices; worst at index {list(worst)}: reference "
        f"{check.worst_actual!r}, signed {check.worst_expected!r}, allowed |diff| {check.worst_allowed:.3g} "
        f"(atol={tolerance.atol:g}, rtol={tolerance.rtol:g}): the reference changed behaviour or is "
        f"nondeterministic; fix it, or if the change is intended {fix(suite, case)}")
