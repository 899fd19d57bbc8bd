"""How many launches the driver takes behind a held stream before cuLaunchKernel blocks the host.

    python benchmarks/hold_queue.py [--launches 256,512,1000,1024,2048] [--watchdog 5]

A held stream waits on a word the host writes only after enqueueing the event pair and the launches
(harness/cudagate_harness/driver.py, Device.hold). Once the driver's launch queue is full, the next
cuLaunchKernel waits for room the waiting stream never frees: the host would block for ever. For
each N, this enqueues one hold, N launches of an empty 4-parameter kernel and the end event; a
watchdog thread releases the hold after ``--watchdog`` seconds if the host is still enqueueing, and
the row says so. The harness holds at most runner.HELD_LAUNCHES launches per hold. Needs a GPU.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from cudagate_harness.driver import Device  # noqa: E402
from cudagate_harness.messages import Kernel  # noqa: E402
from cudagate_harness.runner import HELD_LAUNCHES  # noqa: E402
from cudagate_harness.worker import Worker  # noqa: E402

EMPTY = 'extern "C" __global__ void cudagate_probe(float* a, float* b, float* c, int n) {}'


def enqueue(device: Device, function, params: np.ndarray, launches: int, watchdog_s: float) -> tuple[float, bool]:
    """Seconds the host spent enqueueing ``launches`` behind one hold, and whether the watchdog had to release it."""
    start, end = device.event(), device.event()
    enqueued = threading.Event()
    rescued = []

    def watch() -> None:
        if not enqueued.wait(watchdog_s):
            rescued.append(True)
            device.release()

    device.hold()
    threading.Thread(target=watch, daemon=True).start()
    t0 = time.perf_counter()
    device.record(start)
    for _ in range(launches):
        device.launch(function, (1, 1, 1), (32, 1, 1), 0, params)
    device.record(end)
    seconds = time.perf_counter() - t0
    enqueued.set()
    if not rescued:
        device.release()
    device.synchronize()
    device.destroy_event(start)
    device.destroy_event(end)
    return seconds, bool(rescued)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", default="256,512,1000,1024,2048",
                        type=lambda text: [int(n) for n in text.split(",")], help="comma-separated launch counts")
    parser.add_argument("--watchdog", type=float, default=5.0, help="seconds before a blocked host is released")
    args = parser.parse_args(argv)
    device = Device(0)
    worker = Worker(device, lambda message: None, iter(()))
    if not worker.held:
        print("this driver cannot hold a stream (no stream memory operations): nothing to measure")
        return 1
    _, function = worker.function_for(Kernel(entry="cudagate_probe", source=EMPTY), device.arch)
    pointers = [np.zeros(1, np.uint64) for _ in range(3)] + [np.zeros(1, np.int32)]
    params = np.array([p.ctypes.data for p in pointers], np.uint64)
    print(f"{worker.info['name']}, {device.arch}; the harness holds at most {HELD_LAUNCHES} launches per hold\n")
    print("| launches behind one hold | host enqueue s | host blocked until the watchdog released the hold |")
    print("|---|---|---|")
    for launches in args.launches:
        seconds, blocked = enqueue(device, function, params, launches, args.watchdog)
        print(f"| {launches} | {seconds:.3f} | {'yes' if blocked else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
