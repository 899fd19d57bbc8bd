"""A kernel of a saved harness request (``cudagate run`` format), launched through CuPy.

The benchmarks measure cudagate against other tools on exactly what the gate replays, so they take the
kernel, launch and inputs from the ``run`` requests that ``pytest --cuda-gate --cuda-gate-report DIR``
saves under ``DIR/requests/`` (schemas/harness-request.schema.json), never from the package's internals.
CuPy (on the GPU image) compiles the source with NVRTC (templated entries through name expressions, the
toolkit headers from the same pinned packages the gate compiles with) and launches it on whatever stream
it is given: every step of a kernel of steps, in order, each with the parameters it names, its memsets,
copies and cuBLAS calls too (through the harness's adapter, on that stream). Low-precision buffers travel
as their bits.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cudagate_harness.protocol import element_words, low_precision, numpy_dtype
from cudagate_harness.compiler import toolkit_include_dirs

SCALARS = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64,
           "float32": np.float32, "float64": np.float64}


@dataclass(frozen=True)
class StepLaunch:
    """One launch of the kernel: its entry, grid, block, dynamic shared bytes and parameter names."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[str, ...]


@dataclass(frozen=True)
class OtherStep:
    """A memset, copy or library step as the request resolves it (cudagate_harness/steps.py)."""

    spec: dict


@dataclass
class RequestKernel:
    """One kernel × case of a run request: source, its launches, and the host data of its buffers."""

    label: str
    source: str
    options: tuple[str, ...]
    headers: dict[str, str]
    steps: tuple[StepLaunch | OtherStep, ...]
    params: list[dict]
    scalars: dict[str, int | float]
    host: dict[str, np.ndarray] = field(repr=False)

    @property
    def entry(self) -> str:
        return self.launches[0].entry

    @property
    def launches(self) -> tuple[StepLaunch, ...]:
        return tuple(step for step in self.steps if isinstance(step, StepLaunch))

    @classmethod
    def load(cls, path: Path, label: str | None = None, source: str | None = None) -> RequestKernel:
        """The first case of the run request in ``path``; ``source`` replaces the kernel's text."""
        request = json.loads(Path(path).read_text(encoding="utf-8"))
        if request.get("op") != "run" or not request.get("cases"):
            raise ValueError(f"{path}: not a run request with a case (write one with pytest --cuda-gate-report)")
        base = Path(request.get("base_dir") or Path(path).resolve().parent)
        case = request["cases"][0]
        kernel = request["kernel"]
        host = {}
        for param in request["signature"]:
            if param["kind"] != "buffer":
                continue
            spec = case["buffers"][param["name"]]
            dtype = numpy_dtype(param["dtype"])
            array = (np.load(base / spec["input"], allow_pickle=False).reshape(-1).astype(dtype, copy=False)
                     if "input" in spec else np.zeros(spec["count"], dtype=dtype))
            host[param["name"]] = element_words(array) if low_precision(dtype) else array  # bfloat16, FP8: bits
        names = tuple(p["name"] for p in request["signature"])
        launches = case["launch"] if isinstance(case["launch"], list) else [
            {**case["launch"], "entry": kernel["entry"], "args": list(names)}]
        steps = tuple(StepLaunch(str(l["entry"]), tuple(l["grid"]), tuple(l["block"]), int(l.get("shared_bytes", 0)),
                                 tuple(l["args"])) if "entry" in l else OtherStep(l) for l in launches)
        return cls(label=label or f"{kernel['name']}::{case['name']}", source=source or kernel["source"],
                   options=tuple(kernel.get("options", [])), headers=dict(kernel.get("headers") or {}), steps=steps,
                   params=request["signature"], scalars=dict(case["scalars"]), host=host)

    def launcher(self, cupy):
        """A function ``launch(stream)`` that launches the kernel (every step) once on a CuPy stream.
        Host arrays are uploaded; device arrays put in ``host`` (``dataclasses.replace``) are used as they are."""
        include = Path(tempfile.mkdtemp(prefix="cudagate-headers-"))
        for name, text in self.headers.items():
            (include / name).parent.mkdir(parents=True, exist_ok=True)
            (include / name).write_text(text, encoding="utf-8")
        toolkit = tuple(f"-I{folder}" for folder in toolkit_include_dirs())
        entries = list(dict.fromkeys(step.entry for step in self.launches))
        module = cupy.RawModule(code=self.source, options=(*self.options, f"-I{include}", *toolkit), backend="nvrtc",
                                name_expressions=entries)
        by_name = {p["name"]: p for p in self.params}
        device = {name: cupy.asarray(array) for name, array in self.host.items()}
        calls = []
        for step in self.steps:
            if isinstance(step, OtherStep):
                calls.append((None, step, other_step(cupy, step.spec, device, by_name)))
                continue
            function = module.get_function(step.entry)
            if step.shared_bytes > 48 * 1024:  # past the default limit a kernel must opt in, as the harness does
                function.max_dynamic_shared_size_bytes = step.shared_bytes
            args = tuple(device[name] if by_name[name]["kind"] == "buffer"
                         else SCALARS[by_name[name]["dtype"]](self.scalars[name]) for name in step.args)
            calls.append((function, step, args))

        def launch(stream) -> None:
            for function, step, args in calls:
                if function is None:
                    args(stream)
                else:
                    function(step.grid, step.block, args, shared_mem=step.shared_bytes, stream=stream)

        return launch


def other_step(cupy, spec: dict, device: dict, params: dict):
    """``run(stream)`` for a memset, copy or library step on the kernel's device arrays."""
    from cudagate_harness import library

    if "memset" in spec:
        words = device[spec["memset"]["buffer"]]
        words = words.view({1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32, 8: cupy.uint64}[words.dtype.itemsize])
        bits = spec["memset"]["bits"]

        def run(stream):
            with stream:
                words.fill(bits)
        return run
    if "copy" in spec:
        source, target, count = device[spec["copy"]["from"]], device[spec["copy"]["to"]], spec["copy"]["count"]

        def run(stream):
            with stream:
                target[:count] = source[:count]
        return run
    adapter = library.ADAPTERS[spec["library"]]
    pointers = {role: device[name].data.ptr for role, name in spec["args"].items()}
    dtypes = {role: params[name]["dtype"] for role, name in spec["args"].items()}
    calls = {}  # one library handle per stream it is enqueued on

    def run(stream):
        if stream.ptr not in calls:
            calls[stream.ptr] = adapter.load(type("OnStream", (), {"stream": stream.ptr})())
        calls[stream.ptr].enqueue(pointers, dtypes, spec["options"])
    return run
