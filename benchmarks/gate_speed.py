"""What the gate costs around the kernels it times. Prints markdown tables.

    python benchmarks/gate_speed.py                 # plugin-off cost (CPU) + warm gate on examples/ (GPU)
    python benchmarks/gate_speed.py --plugin-only   # the CPU part alone

1. Plugin off: a one-test project, run in fresh processes alternately with cudagate loaded and with
   `-p no:cudagate`; the medians of each and their difference (target: ≤ 30 ms).
2. `pytest --cuda-gate examples` in fresh processes, first run with an empty compile cache and then
   warm: wall time of the whole command, and the per-phase split every case records in report.json
   (summed over the cases, then the phases summed over the run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wall(args: list[str], cwd: Path, env: dict | None = None) -> tuple[float, int]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, done.returncode


def plugin_off(repeats: int) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="cudagate-speed-") as tmp:
        project = Path(tmp)
        (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        common = ["-q", "-p", "no:cacheprovider", "test_one.py"]
        _wall(common, project)  # warm the file system cache and bytecode
        on, off = [], []
        for _ in range(repeats):  # alternate so drift of the machine hits both alike
            on.append(_wall(common, project)[0])
            off.append(_wall([*common, "-p", "no:cudagate"], project)[0])
    m_on, m_off = statistics.median(on), statistics.median(off)
    return [
        (f"one-test project, cudagate installed (median of {repeats})", f"{m_on * 1000:.0f} ms"),
        (f"same with `-p no:cudagate` (median of {repeats})", f"{m_off * 1000:.0f} ms"),
        ("cost of the installed plugin when off (target ≤ 30 ms)", f"{(m_on - m_off) * 1000:+.0f} ms "
                                                                    f"(ratio {m_on / m_off:.3f})"),
    ]


def gate_runs(repeats: int) -> list[tuple[str, str]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="cudagate-speed-") as tmp:
        env = {**os.environ, "CUDAGATE_CACHE_DIR": str(Path(tmp) / "cache")}
        walls, phases = [], []
        for i in range(repeats + 1):
            report = Path(tmp) / f"report-{i}"
            wall, code = _wall(["--cuda-gate", "examples", "-q", "-p", "no:cacheprovider", "--cuda-gate-require-gpu",
                                "--cuda-gate-report", str(report)], ROOT, env)
            if code not in (0, 1):
                rows.append((f"run {i}", f"exit {code}: the gate did not run"))
                return rows
            document = json.loads((report / "report.json").read_text())
            split: dict[str, float] = defaultdict(float)
            for item in document["items"]:
                for phase, seconds in (item.get("phases") or {}).items():
                    split[phase] += seconds
            walls.append(wall)
            phases.append(split)
    rows.append(("first run, empty compile cache: wall", f"{walls[0]:.2f} s"))
    rows.append((f"warm runs: wall, median of {repeats}", f"{statistics.median(walls[1:]):.2f} s"))
    names = sorted({name for split in phases for name in split}, key=lambda n: -phases[-1].get(n, 0))
    for name in names:
        rows.append((f"  warm, phase `{name}` summed over cases (median)",
                     f"{statistics.median(split.get(name, 0.0) for split in phases[1:]):.3f} s"))
    return rows


def table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"\n### {title}\n\n| {'what'.ljust(width)} | value |\n|{'-' * (width + 2)}|---|")
    for what, value in rows:
        print(f"| {what.ljust(width)} | {value} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin-only", action="store_true", help="only the CPU measurement of the plugin when off")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    table("Plugin off", plugin_off(args.repeats))
    if not args.plugin_only:
        table("`pytest --cuda-gate examples`", gate_runs(max(args.repeats // 2, 3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
