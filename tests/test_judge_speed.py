"""benchmarks/judge_speed.py runs without a GPU and prints its table: both norms, 1 and 3 threads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_judge_speed_prints_both_norms_for_one_and_three_threads():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "judge_speed.py"), "--size", "4096",
                           "--repeats", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "3"]
    for row in rows:
        blas, own = (float(cell) for cell in row.split("|")[2:4])
        assert blas > 0 and own > 0
    assert "Euclidean norm of 4096 float64 values" in done.stdout
