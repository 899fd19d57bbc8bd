"""The suite's trusted reference, run on any input sets: Python in process, CUDA through the worker.

One runner serves ``cudagate cases generate`` (expected outputs written to disk and signed) and the
gate's fresh inputs (expected outputs computed at gate time). What the reference returns is checked
before anyone uses it: every output present, its element count and shape, its dtype, and NaN/Inf
against the output's ``nan:`` tolerance. A Python reference that fails is reported with its own
file and line, not a traceback, and one outside the suite's folder is never run.

A Python reference is one file, run from its source text: read once, checked against the sha256
its suite's signature signs, compiled and executed in a module of its own. It is never imported, so
no ``__pycache__`` is read (bytecode may carry the signed source's hash and other code) or written
into the checkout, and, in no package, it cannot import a file beside it (`cudagate gate` also keeps
the checkout off sys.path: it imports installed packages only).
"""

from __future__ import annotations

import inspect
import os
import tempfile
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import LOW_PRECISION, encode, finfo, low_precision, numpy_dtype, values

from pytest_cudagate import boundary

from pytest_cudagate.host import trash
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.suite.cases import case_data_fix
from pytest_cudagate.suite.model import Case, Suite
from pytest_cudagate.trust import instance_manifest, load_signature_file, signature_path
from pytest_cudagate.trust.canonical import normalize_newlines, sha256_bytes
from pytest_cudagate.worker.requests import case_spec, run_request

CALLING_CONVENTION = ("a Python reference is called as FUNCTION(**inputs, **scalars): every input buffer as a "
                      "numpy array (a bfloat16 or float8 one as float32 holding its values exactly) and every "
                      "scalar the case gives (a derived one only if the function names it), by name, all as keywords; it returns the outputs as an array (one output), a tuple "
                      "in signature order, or a dict by name, a bfloat16 or float8 output as any float array, "
                      "rounded to nearest by the gate")


class ReferenceFailure(CudagateError):
    """The reference cannot be run, failed, or returned something the signature does not allow."""


def _where(exc: BaseException, path: Path) -> str:
    """``file:line`` of the innermost frame in the reference's own file ('' when none is)."""
    if isinstance(exc, SyntaxError) and exc.filename == str(path):
        return f"{path}:{exc.lineno}"
    # the frames' lines are not looked up: that would read the file again
    frames = [f for f in traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__), lookup_lines=False)
              if f.filename == str(path)]
    return f"{path}:{frames[-1].lineno}" if frames else ""


def _signed_sha256(suite: Suite, path: Path) -> tuple[Path, str | None]:
    """The suite's signature file, and the sha256 it signs for the Python reference at ``path``
    (None where no readable signature signs that file: an unsigned suite, judged only when unsigned
    suites are allowed, whose trust check the gate has not passed anyway)."""
    signature = signature_path(suite)
    if not signature.is_file():
        return signature, None
    try:
        signed = instance_manifest(load_signature_file(signature)["manifest"], suite)["reference"].get("python")
    except (FileError, KeyError, AttributeError, TypeError):
        return signature, None
    if not isinstance(signed, dict) or Path(os.path.normpath(suite.root / str(signed.get("file")))) != path:
        return signature, None
    return signature, signed["sha256"] if isinstance(signed.get("sha256"), str) else None


class ReferenceRunner:
    def __init__(self, suite: Suite, client=None, work: Path | None = None, *, signed: bool = True):
        """``signed``: a Python reference runs only as its suite's signature signs it, where one does;
        False for ``cases generate``, which computes the outputs about to be signed."""
        self.suite = suite
        self.client = client
        self.work = work
        self.signed = signed
        self.runs = 0
        self._function = None
        self._path: Path | None = None  # the file the function was compiled from, as its frames name it

    # -- Python ---------------------------------------------------------------------------------
    def python_function(self):
        """The reference function, its module run once from the source text (it is signed, and inside the suite)."""
        if self._function is not None:
            return self._function
        name = self.suite.reference.python.rsplit(":", 1)[1]
        path, source = self._source()
        module = types.ModuleType(f"cudagate_reference_{self.suite.name}")
        module.__file__ = str(path)
        try:
            # the bytes hashed are the bytes compiled (PEP 263 decoding, as an import would do)
            exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - signed
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the reference's own error, reported at its line
            where = _where(exc, path) or str(path)
            raise ReferenceFailure(f"{where}: the Python reference cannot be imported: "
                                   f"{type(exc).__name__}: {str(exc)[:300]}") from None
        function = getattr(module, name, None)
        if not callable(function):
            raise ReferenceFailure(f"{path}: no function {name!r} (reference.python in {self.suite.path})")
        self._function, self._path = function, path
        return function

    def _source(self) -> tuple[Path, bytes]:
        """The reference's file and its source, read once; :class:`ReferenceFailure` where it lies
        outside the suite's folder, cannot be read, or is not the text its suite's signature signs."""
        spelled = self.suite.reference.python
        root = self.suite.root
        # Normalised as the manifest normalises it, so the file read is the file signed: resolved, a
        # spelling like `link/../reference.py` would name another file than the one the manifest hashes.
        path = Path(os.path.normpath(root / spelled.rsplit(":", 1)[0]))
        if not path.resolve().is_relative_to(root.resolve()):
            raise ReferenceFailure(f"{self.suite.path}: reference.python {spelled!r} is outside the suite's folder; "
                                   "keep the reference beside the suite")
        try:
            source = normalize_newlines(boundary.read_bytes(path, boundary.MAX_SOURCE_BYTES, "Python reference"))
        except FileNotFoundError:
            raise ReferenceFailure(f"{path}: missing (reference.python in {self.suite.path})") from None
        except FileError as exc:
            raise ReferenceFailure(f"{path}: {exc.problems[0]}") from None
        signature, signed = _signed_sha256(self.suite, path) if self.signed else (None, None)
        if signed is not None and sha256_bytes(source) != signed:
            raise ReferenceFailure(f"{path}: its sha256 {sha256_bytes(source)[:16]}… differs from the reference signed "
                                   f"in {display_path(signature)} ({signed[:16]}…), so it is not run; "
                                   f"{case_data_fix(self.suite)}")
        return path, source

    def python(self, case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The Python reference's outputs for ``inputs``, checked; :class:`ReferenceFailure` otherwise."""
        function = self.python_function()
        path = self._path
        scalars = self.scalars(function, case)
        try:
            # numpy has no bfloat16 or float8 arithmetic: such an input arrives as float32 (a copy, as
            # every input is), which holds each of its values exactly
            arguments = {k: v.copy() if low_precision(v.dtype) is None else values(v) for k, v in inputs.items()}
            result = function(**arguments, **scalars)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported at the reference's line, not as a traceback
            where = _where(exc, path)
            message = f"{type(exc).__name__}: {str(exc)[:300]}"
            if not where:  # the call itself failed: most likely the parameters
                raise ReferenceFailure(f"{path}: calling {self.suite.reference.python} on case {case.name!r} failed: "
                                       f"{message}; {CALLING_CONVENTION} (here: "
                                       f"{', '.join([*inputs, *scalars])})") from None
            raise ReferenceFailure(f"{where}: the Python reference failed on case {case.name!r}: {message}") from None
        outputs = [p.name for p in self.suite.outputs]
        if isinstance(result, np.ndarray) and len(outputs) == 1:
            result = {outputs[0]: result}
        elif isinstance(result, (tuple, list)) and len(result) == len(outputs):
            result = dict(zip(outputs, result))
        if not isinstance(result, dict) or set(result) != set(outputs):
            raise ReferenceFailure(f"{path}: {self.suite.reference.python} must return the outputs {outputs}; it "
                                   f"returned {type(result).__name__}; {CALLING_CONVENTION}")
        return self.checked(case, result, f"{path}: {self.suite.reference.python}")

    def scalars(self, function, case: Case) -> dict:
        """What the Python reference is given besides the inputs: every scalar the case gives, and a
        derived scalar only where the function names it as a parameter (a reference written before
        the suite derived it keeps working); so does a type variable of an instantiated suite (its
        type's name, e.g. T="bfloat16", for a reference that rounds as the kernel's type does)."""
        derived = list(self.suite.derived)
        if not derived and not self.suite.types:
            return dict(case.scalars)
        try:
            named = {name for name, p in inspect.signature(function).parameters.items()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        except (TypeError, ValueError):  # no signature to read: it gets the case's scalars only
            named = set()
        values = self.suite.scalars(case)
        return {**case.scalars, **{name: values[name] for name in derived if name in named},
                **{name: dtype for name, dtype in self.suite.types.items() if name in named}}

    # -- what a reference returns -----------------------------------------------------------------
    def checked(self, case: Case, result: dict, who: str) -> dict[str, np.ndarray]:
        """``result`` as arrays of the signature's shape and dtype; :class:`ReferenceFailure` naming
        ``who`` when an output has the wrong size or dtype, or NaN/Inf its tolerance fails. A
        bfloat16 or float8 output may come as any float array (float32, as the reference computes):
        it is rounded to nearest, ties to even, into the output's type, and checked after rounding
        (a value past the type's range has become Inf, or NaN in float8_e4m3fn)."""
        checked = {}
        for param in self.suite.outputs:
            value = result[param.name]
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            shape, dtype = self.suite.shape(param, case), numpy_dtype(param.dtype)
            if param.dtype in LOW_PRECISION and array.dtype != dtype:
                if not (array.dtype.kind == "f" or array.dtype.name in LOW_PRECISION):  # numpy's or ml_dtypes' floats
                    raise ReferenceFailure(f"{who} returned {array.dtype} for {param.name!r} in case {case.name!r}, but "
                                           f"the signature says {param.dtype}: return its values as floats (e.g. "
                                           f"float32), which the gate rounds to {param.dtype}")
                array = encode(array, param.dtype)
            if array.dtype != dtype:
                raise ReferenceFailure(f"{who} returned {array.dtype} for {param.name!r} in case {case.name!r}, but the "
                                       f"signature says {param.dtype}: convert it (e.g. .astype(np.{param.dtype}))")
            if array.size != int(np.prod(shape, dtype=object)):
                raise ReferenceFailure(f"{who} returned {array.size} elements for {param.name!r} in case {case.name!r}, "
                                       f"but its size is {param.size} = {int(np.prod(shape, dtype=object))}")
            tolerance = self.suite.tolerance.get(param.name)
            if (array.dtype.kind == "f" or param.dtype in LOW_PRECISION) and (tolerance is None or tolerance.nan == "fail"):
                bad = int(np.count_nonzero(~np.isfinite(values(array))))
                if bad:
                    rounded = (f" once rounded to {param.dtype} (values beyond ±{float(finfo(param.dtype).max):g} "
                               "do not fit it)" if param.dtype in LOW_PRECISION else "")
                    raise ReferenceFailure(f"{who} returned {bad} NaN/Inf value(s) for {param.name!r} in case "
                                           f"{case.name!r}{rounded}, and tolerance.{param.name}.nan is fail: no kernel "
                                           "could pass; fix the reference or its inputs (or set nan: equal)")
            checked[param.name] = array.reshape(shape)
        return checked

    # -- CUDA -----------------------------------------------------------------------------------
    def cuda(self, sets: list[tuple[Case, dict[str, np.ndarray] | Path]], *, plain: bool) -> list[dict | str]:
        """The CUDA reference's outputs for each ``(case, inputs)``, in one worker request; a string
        says why where it failed. ``inputs``: arrays, written here for the worker, or a data folder
        that holds them as ``FOLDER/<case>/<input>.npy``. ``plain``: one launch per set, no guard
        zones or scrub (fresh inputs); otherwise the full checks, so unwritten outputs are found
        (generated cases)."""
        suite, program = self.suite, self.suite.reference.program
        self.runs += 1
        folder = Path(tempfile.mkdtemp(prefix="cudagate-ref-", dir=self.work))
        try:
            specs = []
            for i, (case, inputs) in enumerate(sets):
                data = inputs if isinstance(inputs, Path) else folder / f"c{i}"
                if not isinstance(inputs, Path):
                    (data / case.name).mkdir(parents=True)
                    for name, array in inputs.items():
                        np.save(data / case.name / f"{name}.npy", array)
                spec = case_spec(suite, program, case, data_dir=data)
                spec["name"] = f"{case.name}.{i}"
                specs.append(spec)
            request = run_request(suite, program, [], output_dir=folder / "out")
            request["cases"] = specs
            if plain:
                request["checks"] = {"guards": False, "scrub_shared": False, "timed_outputs": False,
                                     "second_launch": False}
            result = self.client.run(request)
            if not result.compile.get("ok"):
                return [f"the reference {program.source} does not compile:\n{result.compile.get('log', '')}"] * len(sets)
            outputs = []
            for (case, _), spec in zip(sets, specs):
                body = result.cases.get(spec["name"], {})
                if body.get("status") != "ok":
                    outputs.append(f"the reference failed on case {case.name!r}: {body.get('error', {}).get('message')}")
                    continue
                unwritten = {name: o["unwritten"] for name, o in body["outputs"].items() if o.get("unwritten")}
                if unwritten:
                    outputs.append(f"the reference left elements unwritten in case {case.name!r}: {unwritten}")
                    continue
                try:
                    arrays = {name: np.load(o["path"], allow_pickle=False) for name, o in body["outputs"].items()}
                    outputs.append(self.checked(case, arrays, f"the reference {program.source}"))
                except ReferenceFailure as exc:
                    outputs.append(str(exc))
            return outputs
        finally:
            trash.discard(folder)  # its arrays are read: delete them while the worker runs the next request

    # -- the two uses ---------------------------------------------------------------------------
    def expected(self, cases: list[Case], inputs: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
        """Expected outputs per case for ``cases generate``; the first failure raises."""
        if self.suite.reference.python:
            return {c.name: self.python(c, inputs[c.name]) for c in cases}
        if self.client is None:
            raise ReferenceFailure(f"{self.suite.path}: the reference is a CUDA kernel, so generating expected "
                                   "outputs needs a GPU")
        results = self.cuda([(c, inputs[c.name]) for c in cases], plain=False)
        for result in results:
            if isinstance(result, str):
                raise ReferenceFailure(result)
        return {c.name: r for c, r in zip(cases, results)}

    def outputs(self, case: Case, candidates: Sequence[dict[str, np.ndarray] | Path], *, first_usable: bool = False,
                usable=None) -> list:
        """Reference outputs per candidate (arrays; for a CUDA reference, or data folders as
        :meth:`cuda` takes), None where it failed (fresh inputs). With ``first_usable`` the Python
        reference stops at the first candidate ``usable`` accepts (the rest stay None)."""
        if self.suite.reference.python:
            results = []
            for inputs in candidates:
                try:
                    with np.errstate(all="ignore"):
                        results.append(self.python(case, inputs))
                except ReferenceFailure:  # a reference that cannot take these values: not usable
                    results.append(None)
                if first_usable and usable is not None and usable(self.suite, results[-1]):
                    results += [None] * (len(candidates) - len(results))
                    break
            return results
        if self.client is None:
            return [None] * len(candidates)
        try:
            results = self.cuda([(case, inputs) for inputs in candidates], plain=True)
        except Exception:  # noqa: BLE001 - the worker refused or died: no fresh expected outputs
            return [None] * len(candidates)
        return [None if isinstance(r, str) else r for r in results]
