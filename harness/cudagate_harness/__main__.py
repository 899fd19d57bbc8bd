"""``python -m cudagate_harness [REQUEST.json [--root DIR ...]]``: serve the JSON-lines protocol, or run one request.

With a request file the harness runs it in this process and prints the response lines: the raw
runner, by hand, without the gate around it (``cudagate run`` adds the correctness verdicts).
A request file may come from anyone: it is read with a size cap, and its data paths must stay in
its folder, the working folder or a ``--root`` the caller names; a bad one is one line on stderr and
exit code 2.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from . import library
from .messages import Request, from_json
from .request_checks import request_problems
from .worker import main as serve

MAX_REQUEST_BYTES = 16 * 1024 * 1024


def run_file(path: str, roots: list[str] = ()) -> int:
    try:
        if not Path(path).is_file():  # a regular file only: no device or FIFO behind the name
            raise ValueError("not a regular file")
        with open(path, "rb") as handle:
            data = handle.read(MAX_REQUEST_BYTES + 1)
        if len(data) > MAX_REQUEST_BYTES:
            raise ValueError(f"over {MAX_REQUEST_BYTES} bytes")
        request = json.loads(data.decode("utf-8"))
        if not isinstance(request, dict):
            raise ValueError("expected a JSON object")
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        print(f"cudagate_harness: {path}: cannot read the request: {str(exc)[:200]}", file=sys.stderr)
        return 2
    base = Path(path).resolve().parent
    problems = request_problems(request, (base, Path.cwd(), *map(Path, roots)))
    if not problems:
        try:  # the worker reads it so again; here a malformed one is refused before the GPU is touched
            from_json(Request, request)
        except TypeError as exc:
            problems = [f"malformed request: {exc}"]
    if problems:
        print(f"cudagate_harness: {path}: " + "; ".join(problems[:5]), file=sys.stderr)
        return 2
    request["base_dir"] = str(base)
    request.setdefault("output_dir", tempfile.mkdtemp(prefix="cudagate-out-"))
    return serve([json.dumps(request)])


def main(argv: list[str]) -> int:
    library.read_plugin_adapters()  # the harness's own process: it may import what a gate run named
    if not argv:
        return serve()
    path, rest = argv[0], argv[1:]
    if len(rest) % 2 or any(flag != "--root" for flag in rest[::2]):
        print("usage: python -m cudagate_harness [REQUEST.json [--root DIR ...]]", file=sys.stderr)
        return 2
    return run_file(path, rest[1::2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
