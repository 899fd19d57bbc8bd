"""``python -m cudagate_harness [REQUEST.json]``: serve the JSON-lines protocol, or run one request.

With a request file the harness runs it in this process and prints the response lines: the raw
runner, by hand, without the gate around it (``cudagate run`` adds the correctness verdicts).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from .worker import main as serve


def run_file(path: str) -> int:
    request = json.loads(Path(path).read_text())
    request.setdefault("base_dir", str(Path(path).resolve().parent))
    request.setdefault("output_dir", tempfile.mkdtemp(prefix="cudagate-out-"))
    return serve([json.dumps(request)])


if __name__ == "__main__":
    sys.exit(run_file(sys.argv[1]) if len(sys.argv) > 1 else serve())
