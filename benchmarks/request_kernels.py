"""A kernel of a saved harness request (``cudagate run`` format), launched through CuPy.

The benchmarks measure cudagate against other tools on exactly what the gate replays, so they take the
kernel, launch and inputs from the ``run`` requests that ``pytest --cuda-gate --cuda-gate-report DIR``
saves under ``DIR/requests/`` (schemas/harness-request.schema.json), never from the package's internals.
CuPy (on the GPU image) compiles the source with NVRTC and launches it on whatever stream it is given.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SCALARS = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64,
           "float32": np.float32, "float64": np.float64}


@dataclass
class RequestKernel:
    """One kernel × case of a run request: source, launch, and the host data of its buffers."""

    label: str
    source: str
    entry: str
    options: tuple[str, ...]
    headers: dict[str, str]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    params: list[dict]
    scalars: dict[str, int | float]
    host: dict[str, np.ndarray] = field(repr=False)

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
            if "input" in spec:
                host[param["name"]] = np.load(base / spec["input"]).reshape(-1).astype(param["dtype"], copy=False)
            else:
                host[param["name"]] = np.zeros(spec["count"], dtype=param["dtype"])
        launch = case["launch"]
        return cls(label=label or f"{kernel['name']}::{case['name']}", source=source or kernel["source"],
                   entry=kernel["entry"], options=tuple(kernel.get("options", [])),
                   headers=dict(kernel.get("headers") or {}), grid=tuple(launch["grid"]),
                   block=tuple(launch["block"]), shared_bytes=int(launch.get("shared_bytes", 0)),
                   params=request["signature"], scalars=dict(case["scalars"]), host=host)

    def launcher(self, cupy):
        """A function ``launch(stream)`` that launches the kernel once on a CuPy stream. Host arrays are
        uploaded; device arrays put in ``host`` (``dataclasses.replace``) are used as they are."""
        include = Path(tempfile.mkdtemp(prefix="cudagate-headers-"))
        for name, text in self.headers.items():
            (include / name).parent.mkdir(parents=True, exist_ok=True)
            (include / name).write_text(text, encoding="utf-8")
        module = cupy.RawModule(code=self.source, options=(*self.options, f"-I{include}"), backend="nvrtc")
        function = module.get_function(self.entry)
        if self.shared_bytes > 48 * 1024:  # past the default limit a kernel must opt in, as the harness does
            function.max_dynamic_shared_size_bytes = self.shared_bytes
        args = tuple(cupy.asarray(self.host[p["name"]]) if p["kind"] == "buffer"
                     else SCALARS[p["dtype"]](self.scalars[p["name"]]) for p in self.params)

        def launch(stream) -> None:
            function(self.grid, self.block, args, shared_mem=self.shared_bytes, stream=stream)

        return launch
