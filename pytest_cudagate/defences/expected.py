"""Case data completed by the suite's trusted reference: the expected outputs it computes.

``cudagate cases generate`` draws each case's inputs and writes them with the reference's expected
outputs, about to be signed (a generated case: its ``generated.json`` and output sample instead).
At run time :func:`materialise` rebuilds a generated case (suite/generated.py): it draws the inputs
again, checks their digests, runs the trusted reference, checks its outputs at the sample indices,
and writes the arrays into the run's folder, where the gate then reads them exactly as it reads a
stored case.

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
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import numpy_dtype

from pytest_cudagate.defences.reference import ReferenceRunner
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.suite.cases import CaseDataError
from pytest_cudagate.suite.draw import case_seed, draw_inputs, write_case
from pytest_cudagate.suite.generated import (GeneratedCaseError, GeneratedRecord, array_sha256, check_generated,
                                             drawn_inputs, fix, generated_files, read_record, sample_indices,
                                             sample_path, write_generated)
from pytest_cudagate.suite.generated_cache import GeneratedCache, cache_root
from pytest_cudagate.suite.model import Case, Suite


def generate(suite: Suite, cases: list[Case] | None = None, *, client=None, data_dir: Path | None = None,
             seed_offset: int = 0) -> list[Path]:
    """Write inputs and expected outputs for ``cases`` (default: all). Returns the case folders.

    A generated case gets its ``generated.json`` and output sample instead of its arrays.
    ``seed_offset`` draws different values from the same distributions (fresh inputs).
    """
    cases = list(cases or suite.cases)
    data_dir = data_dir or suite.data_dir
    seeds = {c.name: case_seed(suite, c) + seed_offset for c in cases}
    try:
        inputs = {c.name: draw_inputs(suite, c, seeds[c.name]) for c in cases}
    except MemoryError:
        raise CaseDataError(f"{suite.path}: not enough memory to draw the inputs of {len(cases)} case(s); "
                            "check the buffer sizes") from None
    for case in cases:
        for name, array in inputs[case.name].items():
            if array.size > 1 and np.all(array == array.reshape(-1)[0]):
                raise CaseDataError(f"case {case.name!r}: input {name!r} came out constant; widen its distribution in `inputs`")
    # checked before anything is written; run as it stands, since these outputs are about to be signed
    expected = ReferenceRunner(suite, client, signed=False).expected(cases, inputs)
    return [write_generated(suite, c, seeds[c.name], inputs[c.name], expected[c.name], data_dir / c.name)
            if c.generated else write_case(suite, c, inputs[c.name], expected[c.name], data_dir) for c in cases]


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
