"""Case data: ``<data>/<case>/<input>.npy`` and ``<data>/<case>/expected/<output>.npy``, or for a
generated case ``<data>/<case>/generated.json`` and its output sample (suite/generated.py).

Inputs are drawn from the case's seed (suite/draw.py); expected outputs come from the suite's
trusted reference (defences/expected.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cudagate_harness.protocol import LOW_PRECISION, dtype_name, numpy_dtype, values

from pytest_cudagate.boundary.npy import npy_header
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.suite.draw import case_seed, draw, draw_inputs, write_case
from pytest_cudagate.suite.generated import GENERATED_FILE, check_generated
from pytest_cudagate.suite.model import Case, Param, Suite

__all__ = ["CaseDataError", "case_seed", "draw", "draw_inputs", "write_case", "case_data_fix",
           "check_case_data"]


class CaseDataError(CudagateError):
    pass


# Above this a stored case's arrays are worth not committing: `generated: true` keeps digests and a sample.
LARGE_CASE_BYTES = 64 * 2**20


def stored_files(suite: Suite, case: Case) -> list[Path]:
    """The .npy files a stored case keeps in its folder: its inputs, then its expected outputs."""
    folder = suite.case_dir(case)
    return ([folder / f"{p.name}.npy" for p in suite.buffers if p.is_input]
            + [folder / "expected" / f"{p.name}.npy" for p in suite.buffers if p.is_output])


def large_case_warning(suite: Suite, case: Case) -> str | None:
    """Said by `cases generate` when a stored case's arrays pass :data:`LARGE_CASE_BYTES`."""
    if case.generated:
        return None
    size = sum(path.stat().st_size for path in stored_files(suite, case) if path.is_file())
    if size <= LARGE_CASE_BYTES:
        return None
    return (f"case {case.name!r} stores {size / 2**20:.1f} MiB of arrays (over {LARGE_CASE_BYTES >> 20} MiB) to "
            "commit; `generated: true` on the case keeps only their digests and an output sample, and draws the "
            "arrays at run time")


def stale_files(suite: Suite, case: Case) -> list[Path]:
    """Files of ``case``'s other storage form left in its folder (the arrays of a case now generated; the
    record and sample of one no longer): `cudagate sign` refuses them, and the suite regenerates them."""
    folder = suite.case_dir(case)
    if case.generated:
        paths = stored_files(suite, case)
    else:
        paths = [folder / GENERATED_FILE] + [folder / "sample" / f"{p.name}.npy" for p in suite.buffers if p.is_output]
    return [path for path in paths if path.is_file()]


def case_data_fix(suite: Suite, pull_request: int | None = None) -> str:
    """The fix for case data that is missing, malformed or stale (written with another reference);
    ``pull_request``: the one the signing is for (`cudagate gate --pull-request`)."""
    return (f"fix: run `{command('cudagate', 'cases', 'generate', suite.path)}`, review the data, then have a "
            f"maintainer run `{sign_command(suite, pull_request)}`")


def sign_command(suite: Suite, pull_request: int | None = None) -> str:
    """``cudagate sign SUITE``, for the pull request a signing is for where there is one."""
    return command("cudagate", "sign", suite.path, *(["--pull-request", pull_request] if pull_request else []))


def check_case_data(suite: Suite, case: Case) -> list[str]:
    """Problems with a case's files against the signature; empty when sound (fix: case_data_fix)."""
    if case.generated:
        return check_generated(suite, case)
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
    # A low-precision file holds bits: only its own header tells them from another type's.
    if (exact_dtype or param.dtype in LOW_PRECISION) and dtype != numpy_dtype(param.dtype):
        return [f"{display_path(path)}: holds {dtype_name(dtype)}, but the signature says {param.name} is {param.dtype}"]
    tolerance = suite.tolerance.get(param.name)
    if not exact_dtype and (dtype.kind == "f" or param.dtype in LOW_PRECISION) and tolerance is not None \
            and tolerance.nan == "fail":
        numbers = values(np.load(path, allow_pickle=False, mmap_mode="r"))
        bad = int(np.count_nonzero(~np.isfinite(numbers)))
        if bad:
            return [f"{display_path(path)}: {bad} of {size} expected values are NaN or Inf, and "
                    f"tolerance.{param.name}.nan is fail, so no kernel could pass; fix the reference"]
    return []
