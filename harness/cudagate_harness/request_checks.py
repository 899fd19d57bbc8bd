"""What a harness request may hold, checked before anything of it is used: a request file can come from
a pull request, so the worker (and ``python -m cudagate_harness``) refuse one that names a path outside
their roots, a launch past the device's limits, a step that could write an input or past a buffer, or
fields of the wrong type, each in one line."""

from __future__ import annotations

from pathlib import Path

from .protocol import (BLOCK_MAX, BLOCK_THREADS_MAX, BUFFER_BYTES_MAX, CASES_MAX, GRID_MAX, SAFE_NAME,
                       SHARED_BYTES_MAX, TIMEOUT_S_MAX, numpy_dtype, request_timeout_s, unknown_dtype)
from .steps import kind_of, step_problems


INTENTS = ("in", "out", "inout", "scratch")
# A case's fields that hold others, by the type they must be (a request file can come from anyone).
_CASE_FIELDS = (("buffers", dict, "an object of buffer name to count, input and layout"),
                ("expected", dict, "an object of output name to file"),
                ("fresh", list, "a list of input sets, each an object"), ("scalars", dict, "an object of name to value"))
STEPS_MAX = 16


def _operation_problems(where: str, launch, kernel, params: dict[str, dict], counts: dict[str, int]) -> list[str]:
    """A case's launch: one launch of the whole signature, or a list of steps, each naming one of
    the kernel's ``entries`` and the signature parameters it takes (``params``, by name), or a
    memset, copy or library call on the case's buffers (``counts``: their element counts)."""
    if not isinstance(launch, list):
        return _launch_problems(where, launch)
    entries = kernel.get("entries") if isinstance(kernel, dict) else None
    if not 1 <= len(launch) <= STEPS_MAX:
        return [f"{where}: a kernel of steps has 1 to {STEPS_MAX} steps, not {len(launch)}"]
    if not all(isinstance(step, dict) and isinstance(step.get("entry", ""), str) for step in launch):
        return [f"{where}: each step must be an object: a launch (its entry a name), memset, copy or library call"]
    # The worker compiles every entry: as many as the steps use, each once, the first the kernel's entry.
    used = list(dict.fromkeys(step.get("entry") for step in launch if kind_of(step) == "entry"))
    if not (isinstance(entries, list) and entries and entries == used and entries[0] == kernel.get("entry")):
        return [f"{where}: the kernel's `entries` must be the steps' entries, each once, in order of first use"]
    names = list(params)
    problems = []
    for number, step in enumerate(launch, 1):
        at = f"{where}: step {number}"
        if kind_of(step) != "entry":
            problems += step_problems(at, step, params, counts)
            continue
        problems += _launch_problems(at, step)
        if not isinstance(step, dict):
            continue
        if step.get("entry") not in entries:
            problems.append(f"{at}: entry {str(step.get('entry'))[:80]!r} is not one of the kernel's entries")
        args = step.get("args")
        if not (isinstance(args, list) and all(a in names for a in args) and len(set(args)) == len(args)):
            problems.append(f"{at}: args must name signature parameters, each once")
    return problems


def _launch_problems(where: str, launch) -> list[str]:
    if not isinstance(launch, dict):
        return [f"{where}: launch must be an object with grid, block and shared_bytes"]
    problems = []
    for key, limits in (("grid", GRID_MAX), ("block", BLOCK_MAX)):
        dims = launch.get(key)
        if not (isinstance(dims, list) and len(dims) == 3 and all(type(d) is int for d in dims)):
            problems.append(f"{where}: launch.{key} must be three integers")
        elif not all(1 <= d <= limit for d, limit in zip(dims, limits)):
            problems.append(f"{where}: launch.{key} {dims} is outside the device's limits {list(limits)}")
        elif key == "block" and dims[0] * dims[1] * dims[2] > BLOCK_THREADS_MAX:
            problems.append(f"{where}: launch.block {dims} has more than {BLOCK_THREADS_MAX} threads")
    shared = launch.get("shared_bytes", 0)
    if type(shared) is not int or not 0 <= shared <= SHARED_BYTES_MAX:
        problems.append(f"{where}: launch.shared_bytes must be 0..{SHARED_BYTES_MAX}")
    return problems


def _layout_problems(where: str, layout, count: int, itemsize: int) -> list[str]:
    if not (isinstance(layout, list) and len(layout) == 3 and all(type(v) is int and v >= 0 for v in layout)):
        return [f"{where}: must be [rows, cols, ld], three whole numbers"]
    rows, cols, ld = layout
    if rows * cols != count or ld < cols:
        return [f"{where}: {layout} must hold count ({count}) elements in rows of cols, ld at least cols"]
    if rows * ld * itemsize > BUFFER_BYTES_MAX:
        return [f"{where}: {rows} rows of {ld} elements are over the {BUFFER_BYTES_MAX} bytes a buffer may hold"]
    return []


def _confined(where: str, value, roots: tuple[Path, ...]) -> list[str]:
    if not isinstance(value, str):
        return [f"{where}: expected a path (a string)"]
    if not roots:
        return []
    path = (roots[0] / value).resolve()
    if not any(path.is_relative_to(root) for root in roots):
        return [f"{where}: {value[:80]!r} is outside {' and '.join(map(str, roots))}; keep case data there"]
    return []


def request_problems(request: dict, roots: tuple[Path, ...] = ()) -> list[str]:
    """What makes a ``run`` request unsafe to serve: names that are not plain file names, dtypes
    outside :data:`DTYPES`, buffer sizes or launches beyond the device's limits, and (with
    ``roots``, for request files: its folder first) data paths outside every root. Empty when safe."""
    base = tuple(Path(root).resolve() for root in roots)
    problems = []
    if "timeout_s" in request and request_timeout_s(request) is None:
        problems.append(f"timeout_s: {str(request['timeout_s'])[:40]!r} is not a number of seconds in "
                        f"(0, {TIMEOUT_S_MAX:g}]")
    signature = request.get("signature") or []
    itemsize, params = {}, {}
    for i, param in enumerate(signature if isinstance(signature, list) else []):
        name, dtype = (param.get("name"), param.get("dtype")) if isinstance(param, dict) else (None, None)
        if not (isinstance(name, str) and SAFE_NAME.fullmatch(name)):
            problems.append(f"signature[{i}].name: {str(name)[:80]!r} is not a plain name ({SAFE_NAME.pattern})")
        if isinstance(param, dict) and param.get("kind") == "buffer" and param.get("intent") not in INTENTS:
            problems.append(f"signature[{i}].intent: {str(param.get('intent'))[:40]!r} is not one of {', '.join(INTENTS)}")
        if problem := unknown_dtype(dtype):
            problems.append(f"signature[{i}].dtype: {problem}")
        elif isinstance(name, str):
            itemsize[name], params[name] = numpy_dtype(dtype).itemsize, param
            if "init" in param and not (param.get("intent") == "scratch" and type(param["init"]) is int
                                        and 0 <= param["init"] < 1 << (8 * itemsize[name])):
                problems.append(f"signature[{i}].init: a scratch buffer's initial element, as an integer of "
                                f"{8 * itemsize[name]} bits")
    cases = request.get("cases") or []
    if not isinstance(cases, list):
        problems.append("cases: must be a list of case objects")
        cases = []
    if len(cases) > CASES_MAX:
        problems.append(f"cases: {len(cases)} cases, more than {CASES_MAX} in one request")
        cases = []
    for case in cases:
        name = case.get("name") if isinstance(case, dict) else None
        if not (isinstance(name, str) and SAFE_NAME.fullmatch(name)):
            problems.append(f"case name {str(name)[:80]!r} is not a plain name ({SAFE_NAME.pattern}): "
                            "it names the case's output folder")
            continue
        where = f"case {name!r}"
        shapes = [f"{where}: {key} must be {what}" for key, kind, what in _CASE_FIELDS
                  if not isinstance(case.get(key) or kind(), kind)]
        if shapes:  # the checks below read these as they are meant to be
            problems += shapes
            continue
        for buffer, spec in (case.get("buffers") or {}).items():
            count = spec.get("count") if isinstance(spec, dict) else None
            if type(count) is not int or not 0 <= count * itemsize.get(buffer, 1) <= BUFFER_BYTES_MAX:
                problems.append(f"{where}: buffers.{buffer}.count must be an integer from 0 up to "
                                f"{BUFFER_BYTES_MAX} bytes' worth")
            elif isinstance(spec, dict) and "layout" in spec:
                problems += _layout_problems(f"{where}: buffers.{buffer}.layout", spec["layout"], count,
                                             itemsize.get(buffer, 1))
            if isinstance(spec, dict) and "input" in spec:
                problems += _confined(f"{where}: buffers.{buffer}.input", spec["input"], base)
        for output, path in (case.get("expected") or {}).items():
            problems += _confined(f"{where}: expected.{output}", path, base)
        for fresh in case.get("fresh") or []:
            for key in ("inputs", "expected"):
                files = fresh.get(key) or {} if isinstance(fresh, dict) else None
                if not isinstance(files, dict):
                    problems.append(f"{where}: fresh {key} must be an object of buffer name to file")
                    continue
                for buffer, path in files.items():
                    problems += _confined(f"{where}: fresh {key}.{buffer}", path, base)
        counts = {buffer: spec["count"] for buffer, spec in (case.get("buffers") or {}).items()
                  if isinstance(spec, dict) and type(spec.get("count")) is int}
        problems += _operation_problems(where, case.get("launch"), request.get("kernel"), params, counts)
    return problems
