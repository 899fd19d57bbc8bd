"""Case data: ``<data>/<case>/<input>.npy`` and ``<data>/<case>/expected/<output>.npy``.

Inputs come from a seeded generator with real variation (never all zeros or ones, which hide
unwritten outputs and wrong indexing); expected outputs come from the suite's trusted reference.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import FLOAT_DTYPES, numpy_dtype

from pytest_cudagate.boundary.npy import npy_header
from pytest_cudagate.defences.reference import ReferenceRunner
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.paths import display_path
from pytest_cudagate.suite.model import Case, Distribution, Param, Suite


class CaseDataError(CudagateError):
    pass


def case_seed(suite: Suite, case: Case) -> int:
    if case.seed is not None:
        return case.seed
    digest = hashlib.sha256(f"{suite.name}/{case.name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def draw(param: Param, shape: tuple[int, ...], dist: Distribution | None, rng: np.random.Generator) -> np.ndarray:
    dtype = numpy_dtype(param.dtype)
    dist = dist or Distribution(distribution="uniform" if param.dtype in FLOAT_DTYPES else "integers",
                                low=-1.0 if param.dtype in FLOAT_DTYPES else (0 if param.dtype.startswith("u") else -100),
                                high=1.0 if param.dtype in FLOAT_DTYPES else 100)
    if dist.distribution == "normal":
        values = rng.normal(dist.mean, dist.std, size=shape)
    elif dist.distribution == "integers":
        values = rng.integers(int(dist.low), int(dist.high), size=shape, endpoint=True)
    else:
        values = rng.uniform(dist.low, dist.high, size=shape)
    return values.astype(dtype)


def draw_inputs(suite: Suite, case: Case, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = suite.resolved(case).shapes
    return {p.name: draw(p, shapes[p.name], suite.inputs.get(p.name), rng)
            for p in suite.buffers if p.is_input}


def write_case(suite: Suite, case: Case, inputs: dict[str, np.ndarray], expected: dict[str, np.ndarray],
               data_dir: Path | None = None) -> Path:
    folder = (data_dir or suite.data_dir) / case.name
    (folder / "expected").mkdir(parents=True, exist_ok=True)
    for name, array in inputs.items():
        np.save(folder / f"{name}.npy", array)
    for name, array in expected.items():
        np.save(folder / "expected" / f"{name}.npy", array)
    return folder


def generate(suite: Suite, cases: list[Case] | None = None, *, client=None, data_dir: Path | None = None,
             seed_offset: int = 0) -> list[Path]:
    """Write inputs and expected outputs for ``cases`` (default: all). Returns the case folders.

    ``seed_offset`` draws different values from the same distributions (fresh inputs).
    """
    cases = list(cases or suite.cases)
    data_dir = data_dir or suite.data_dir
    try:
        inputs = {c.name: draw_inputs(suite, c, case_seed(suite, c) + seed_offset) for c in cases}
    except MemoryError:
        raise CaseDataError(f"{suite.path}: not enough memory to draw the inputs of {len(cases)} case(s); "
                            "check the buffer sizes") from None
    for case in cases:
        for name, array in inputs[case.name].items():
            if array.size > 1 and np.all(array == array.reshape(-1)[0]):
                raise CaseDataError(f"case {case.name!r}: input {name!r} came out constant; widen its distribution in `inputs`")
    expected = ReferenceRunner(suite, client).expected(cases, inputs)  # checked before anything is written
    return [write_case(suite, c, inputs[c.name], expected[c.name], data_dir) for c in cases]


def case_data_fix(suite: Suite) -> str:
    return f"fix: run `cudagate cases generate {display_path(suite.path)}`, review, then have a maintainer re-sign"


def check_case_data(suite: Suite, case: Case) -> list[str]:
    """Problems with a case's files against the signature; empty when sound (fix: case_data_fix)."""
    problems = []
    counts = suite.counts(case)
    for param in suite.buffers:
        wanted = [(suite.input_path(case, param), True)] if param.is_input else []
        if param.is_output:
            wanted.append((suite.expected_path(case, param), False))
        for path, exact_dtype in wanted:
            problems += _file_problems(suite, case, param, path, exact_dtype, counts[param.name])
    return problems


def _file_problems(suite: Suite, case: Case, param: Param, path: Path, exact_dtype: bool, count: int) -> list[str]:
    """A case file against the signature: its header first (nothing is allocated for a bad one),
    then, for an expected output whose tolerance fails NaN, its values."""
    if not path.is_file():
        return [f"{display_path(path)}: missing"]
    try:
        shape, dtype = npy_header(path)
    except FileError as exc:
        return [f"{display_path(path)}: {exc.problems[0]}"]
    size = 1
    for dim in shape:
        size *= dim
    if size != count:
        return [f"{display_path(path)}: holds {size} elements, but {param.name} has size {param.size} = {count} "
                f"in case {case.name!r}"]
    if exact_dtype and dtype != numpy_dtype(param.dtype):
        return [f"{display_path(path)}: holds {dtype}, but the signature says {param.name} is {param.dtype}"]
    tolerance = suite.tolerance.get(param.name)
    if not exact_dtype and dtype.kind == "f" and tolerance is not None and tolerance.nan == "fail":
        values = np.load(path, allow_pickle=False, mmap_mode="r")
        bad = int(np.count_nonzero(~np.isfinite(values)))
        if bad:
            return [f"{display_path(path)}: {bad} of {size} expected values are NaN or Inf, and "
                    f"tolerance.{param.name}.nan is fail, so no kernel could pass; fix the reference"]
    return []
