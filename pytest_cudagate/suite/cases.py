"""Case data: ``<data>/<case>/<input>.npy`` and ``<data>/<case>/expected/<output>.npy``.

Inputs come from a seeded generator with real variation (never all zeros or ones, which hide
unwritten outputs and wrong indexing); expected outputs come from the suite's trusted reference.
"""

from __future__ import annotations

import hashlib
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import FLOAT_DTYPES, numpy_dtype

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.paths import display_path
from pytest_cudagate.suite.model import Case, Distribution, Param, Suite
from pytest_cudagate.worker.requests import run_request


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


def python_reference(suite: Suite) -> Callable[..., object]:
    file_name, function = suite.reference.python.rsplit(":", 1)
    path = suite.root / file_name
    spec = importlib.util.spec_from_file_location(f"cudagate_reference_{suite.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # trusted: the reference file is part of the signed manifest
    if not hasattr(module, function):
        raise CaseDataError(f"{path}: no function {function!r} (reference.python in {suite.path})")
    return getattr(module, function)


def python_expected(suite: Suite, case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call the Python reference with every input buffer and scalar by name."""
    function = python_reference(suite)
    result = function(**{k: v.copy() for k, v in inputs.items()}, **case.scalars)
    outputs = [p.name for p in suite.outputs]
    if isinstance(result, np.ndarray) and len(outputs) == 1:
        result = {outputs[0]: result}
    elif isinstance(result, (tuple, list)):
        result = dict(zip(outputs, result))
    if not isinstance(result, dict) or set(result) != set(outputs):
        raise CaseDataError(f"{suite.reference.python} must return the outputs {outputs} (an array, a tuple in "
                            f"signature order, or a dict by name); it returned {type(result).__name__}")
    return {name: np.asarray(value) for name, value in result.items()}


def write_case(suite: Suite, case: Case, inputs: dict[str, np.ndarray], expected: dict[str, np.ndarray],
               data_dir: Path | None = None) -> Path:
    folder = (data_dir or suite.data_dir) / case.name
    (folder / "expected").mkdir(parents=True, exist_ok=True)
    for name, array in inputs.items():
        np.save(folder / f"{name}.npy", array)
    for name, array in expected.items():
        np.save(folder / "expected" / f"{name}.npy", array)
    return folder


def cuda_expected(suite: Suite, cases: list[Case], client, data_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """Run the CUDA reference on the inputs already written under ``data_dir``."""
    program = suite.reference.program
    with tempfile.TemporaryDirectory(prefix="cudagate-ref-") as out:
        request = run_request(suite, program, cases, output_dir=Path(out), data_dir=data_dir)
        result = client.run(request)
        if not result.compile.get("ok"):
            raise CaseDataError(f"the reference {program.source} does not compile:\n{result.compile.get('log', '')}")
        expected = {}
        for case in cases:
            body = result.cases.get(case.name, {})
            if body.get("status") != "ok":
                raise CaseDataError(f"the reference failed on case {case.name!r}: {body.get('error', {}).get('message')}")
            expected[case.name] = {name: np.load(o["path"]).reshape(suite.resolved(case).shapes[name])
                                   for name, o in body["outputs"].items()}
            for name, o in body["outputs"].items():
                if o.get("unwritten"):
                    raise CaseDataError(f"the reference left {o['unwritten']} elements of {name!r} unwritten in case {case.name!r}")
    return expected


def generate(suite: Suite, cases: list[Case] | None = None, *, client=None, data_dir: Path | None = None,
             seed_offset: int = 0) -> list[Path]:
    """Write inputs and expected outputs for ``cases`` (default: all). Returns the case folders.

    ``seed_offset`` draws different values from the same distributions (fresh inputs).
    """
    cases = list(cases or suite.cases)
    data_dir = data_dir or suite.data_dir
    inputs = {c.name: draw_inputs(suite, c, case_seed(suite, c) + seed_offset) for c in cases}
    for case in cases:
        for name, array in inputs[case.name].items():
            if array.size > 1 and np.all(array == array.reshape(-1)[0]):
                raise CaseDataError(f"case {case.name!r}: input {name!r} came out constant; widen its distribution in `inputs`")
    if suite.reference.python:
        expected = {c.name: python_expected(suite, c, inputs[c.name]) for c in cases}
    else:
        if client is None:
            raise CaseDataError(f"{suite.path}: the reference is a CUDA kernel, so generating expected outputs needs a GPU")
        for case in cases:
            write_case(suite, case, inputs[case.name], {}, data_dir)
        expected = cuda_expected(suite, cases, client, data_dir)
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
            if not path.is_file():
                problems.append(f"{display_path(path)}: missing")
                continue
            try:
                array = np.load(path, allow_pickle=False, mmap_mode="r")
            except (OSError, ValueError, EOFError) as exc:  # EOFError: an empty file
                problems.append(f"{display_path(path)}: not a readable .npy file ({exc})")
                continue
            if array.size != counts[param.name]:
                problems.append(f"{display_path(path)}: holds {array.size} elements, but {param.name} has size "
                                f"{param.size} = {counts[param.name]} in case {case.name!r}")
            if exact_dtype and array.dtype != numpy_dtype(param.dtype):
                problems.append(f"{display_path(path)}: holds {array.dtype}, but the signature says {param.name} is {param.dtype}")
            elif not exact_dtype and array.dtype.kind not in "fiub":
                problems.append(f"{display_path(path)}: holds {array.dtype}, not numbers")
    return problems
