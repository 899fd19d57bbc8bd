"""When the harness worker says hello, counted from the pytest process's start, on a CPU machine.

    python benchmarks/worker_start.py                       # this tree, 10 runs
    python benchmarks/worker_start.py --against /tmp/base   # alternating with another checkout's package

`pytest --cuda-gate examples` runs in fresh processes with tests/stub_worker.py standing for the
harness worker: it sleeps ``--start-s`` seconds before its hello, as the real one spends them in
cuInit, a context and the device description (0.73 s on the H200), then answers every case. A
``-p`` plugin points the worker client at the stub and notes when the client has the hello. Prints
a markdown table of medians: process start to hello, the run phase ``worker_wait`` (the first item's
wait) and ``configure``, and the wall time of the command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gate_speed import run_phases  # noqa: E402

STUB = ROOT / "tests" / "stub_worker.py"
# Loaded with -p before cudagate configures: the worker client (light) runs the stub, and each hello
# the client reads appends the process's age to $HELLO_LOG.
PLUGIN = f"""
import os
import sys

from pytest_cudagate import phases
from pytest_cudagate.worker import client

client.HarnessClient.__init__.__kwdefaults__["command"] = (sys.executable, {str(STUB)!r}, "answer")
_start = client.HarnessClient.start


def start(self):
    hello = _start(self)
    with open(os.environ["HELLO_LOG"], "a") as log:
        log.write(f"{{phases.process_age():.3f}}\\n")
    return hello


client.HarnessClient.start = start
"""


def one_run(tmp: Path, root: Path, start_s: float) -> dict[str, float]:
    """One run in ``root``, whose package `python -m pytest` imports (the working folder comes first)."""
    log = Path(tempfile.mkstemp(prefix="hello-", suffix=".log", dir=tmp)[1])
    env = {**os.environ, "PYTHONPATH": str(tmp), "HELLO_LOG": str(log), "STUB_START_S": str(start_s),
           "CUDAGATE_LOCK_DIR": str(tmp / "locks"), "CUDAGATE_CACHE_DIR": str(tmp / "cache")}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "--cuda-gate", "examples", "-q", "-p",
                           "no:cacheprovider", "-p", "stub_worker_plugin", "--cuda-gate-durations", "0"],
                          cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1) or not log.read_text():
        raise SystemExit(f"the gate did not run (exit {done.returncode}):\n{done.stdout[-3000:]}\n"
                         f"{done.stderr[-3000:]}")
    phases = run_phases(done.stdout)
    return {"hello": float(log.read_text().split()[0]), "worker_wait": phases.get("worker_wait", 0.0),
            "configure": phases.get("configure", 0.0), "wall": wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--start-s", type=float, default=0.73, help="the stub's sleep before its hello")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (`git archive main | tar -x -C DIR`), run alternately in its own folder")
    args = parser.parse_args()
    variants = {"this tree": ROOT}
    if args.against is not None:
        variants = {str(args.against): args.against.resolve(), **variants}
    with tempfile.TemporaryDirectory(prefix="cudagate-worker-start-") as tmp:
        folder = Path(tmp)
        (folder / "stub_worker_plugin.py").write_text(PLUGIN)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for root in variants.values():  # warm the bytecode and the compile cache
            one_run(folder, root, args.start_s)
        for _ in range(args.repeats):  # alternate, so the machine's drift hits every variant alike
            for name, root in variants.items():
                results[name].append(one_run(folder, root, args.start_s))
    print(f"\n### Worker start with a stub of {args.start_s:g} s (medians of {args.repeats}, seconds)\n")
    print("| package | process start → hello | run phase `worker_wait` | run phase `configure` | wall |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        cells = [statistics.median(run[key] for run in runs) for key in ("hello", "worker_wait", "configure", "wall")]
        print(f"| {name} | " + " | ".join(f"{value:.3f}" for value in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
