"""Every malformed input of issue 13's families and issue 28's fuzz findings (trusted refs and base
files under `cudagate gate --trusted-ref`, report merges, replay folders, tunables), each run in a
subprocess under a memory limit and a CPU-time bound (tests/bad_input_cases.py).

    python benchmarks/bad_inputs.py

Prints one line per input (verdict, exit code, wall and CPU seconds, peak MB) and the totals in the
form "inputs tried / tracebacks / hangs / wrongly accepted" (the target is N / 0 / 0 / 0).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bad_input_cases import run_all, table  # noqa: E402

if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="cudagate-bad-inputs-") as root:
        rows = run_all(Path(root))
    print(table(rows))
    sys.exit(0 if all(v == "refused" for _, _, v in rows) else 1)
