"""What checking every timed launch's outputs costs: the GPU digest per launch, and a timed round's wall time.

    python benchmarks/digest_cost.py [--sizes 1024,262144,4194304,16777216] [--rounds 200] [--repeats 3] [--json FILE]

For each output size (float32 elements), a y = 2x kernel is timed cold, as the gate times a case
(flush, pads, held launches, rotating copies), once without digests and once with every timed
launch digested (harness/cudagate_harness/digest.py), alternating ``--repeats`` times; the table
gives the medians. "digest µs" is the digest kernel's GPU time alone over the output (launches held,
so the host's enqueueing is not in it); "wall ms/launch" is the host's time per timed launch of the whole loop, which is what
a gate run pays. Needs a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from cudagate_harness.digest import buffer_key  # noqa: E402
from cudagate_harness.driver import Device  # noqa: E402
from cudagate_harness.messages import Case, Kernel, Param, from_json  # noqa: E402
from cudagate_harness.protocol import POISON_FIRST  # noqa: E402
from cudagate_harness.runner import CaseRun, Launchable, rotation_copies  # noqa: E402
from cudagate_harness.worker import Worker  # noqa: E402

SOURCE = r"""
extern "C" __global__ void scale2(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
SIGNATURE = (Param(name="x", kind="buffer", dtype="float32", intent="in"),
             Param(name="y", kind="buffer", dtype="float32", intent="out"),
             Param(name="n", kind="scalar", dtype="int32"))


def timed_loop(worker: Worker, kernel: Launchable, case: Case, base: Path, rounds: int, digests: bool) -> tuple[float, dict]:
    """Seconds per timed launch of ``rounds`` cold rounds, and the digests' record."""
    device = worker.device
    copies = rotation_copies(SIGNATURE, case, None)
    with CaseRun(device, SIGNATURE, case, base, worker.flush_l2, worker.pad(), copies=copies, hold=worker.held,
                 digester=worker.digester() if digests else None) as run:
        run.prepare(kernel)
        run.validation_launch(kernel, POISON_FIRST)
        run.expect(kernel, 0)
        run.warm_up([kernel], 10, 20.0)
        start = time.perf_counter()
        run.time_rounds([kernel], rounds, cold=True)
        seconds = (time.perf_counter() - start) / rounds
        return seconds, dict(run.digests.get(0, {}))


def digest_us(worker: Worker, nbytes: int, reps: int = 50) -> float:
    """The digest kernel alone over ``nbytes``, µs of GPU time per launch: events around ``reps``
    launches enqueued behind a hold (so the host's enqueueing is not timed), where the driver can."""
    device = worker.device
    data, out = device.alloc(nbytes), device.alloc(8)
    start, end = device.event(), device.event()
    try:
        device.fill(data, 0x3C, nbytes)
        digester = worker.digester()
        digester.add(data, nbytes, buffer_key(1, 0), out)
        if worker.held:
            device.hold()
        device.record(start)
        for _ in range(reps):
            digester.add(data, nbytes, buffer_key(1, 0), out)
        device.record(end)
        if worker.held:
            device.release()
        device.synchronize()
        return device.elapsed_ms(start, end) * 1000 / reps
    finally:
        device.destroy_event(start)
        device.destroy_event(end)
        device.free(data)
        device.free(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,262144,4194304,16777216")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = Device(0)
    worker = Worker(device, lambda message: None, iter(()))
    result, function = worker.function_for(Kernel(entry="scale2", source=SOURCE), device.arch)
    if function is None:
        print(result.log)
        return 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="cudagate-digest-") as tmp:
        base = Path(tmp)
        for n in (int(s) for s in args.sizes.split(",")):
            np.save(base / f"x{n}.npy", np.random.default_rng(n).standard_normal(n).astype(np.float32))
            launch = {"grid": [-(-n // 256), 1, 1], "block": [256, 1, 1]}
            case = from_json(Case, {"name": f"n{n}", "buffers": {"x": {"count": n, "input": f"x{n}.npy"}, "y": {"count": n}},
                                    "scalars": {"n": n}, "launch": launch})
            kernel = Launchable.operation({"scale2": function}, case.launch)
            off, on, checked = [], [], {}
            for _ in range(args.repeats):
                off.append(timed_loop(worker, kernel, case, base, args.rounds, False)[0])
                seconds, checked = timed_loop(worker, kernel, case, base, args.rounds, True)
                on.append(seconds)
            without, with_ = statistics.median(off) * 1000, statistics.median(on) * 1000
            rows.append({"elements": n, "output_bytes": 4 * n, "digest_us": round(digest_us(worker, 4 * n), 2),
                         "wall_ms_per_launch_without": round(without, 4), "wall_ms_per_launch_with": round(with_, 4),
                         "added_pct": round(100 * (with_ / without - 1), 1), "launches_checked": checked.get("launches", 0),
                         "differing": checked.get("differing", 0)})
    print(f"digest cost on {worker.info['name']} ({args.rounds} cold rounds, medians of {args.repeats})")
    print(f"{'output bytes':>14} {'digest µs':>10} {'wall ms/launch, without':>24} {'with':>8} {'added':>7} {'checked':>8}")
    for r in rows:
        print(f"{r['output_bytes']:>14} {r['digest_us']:>10.2f} {r['wall_ms_per_launch_without']:>24.4f} "
              f"{r['wall_ms_per_launch_with']:>8.4f} {r['added_pct']:>6.1f}% {r['launches_checked']:>8}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        args.json.write_text(json.dumps({"device": worker.info["name"], "uuid": worker.info.get("uuid"),
                                         "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                         "commit": commit.stdout.strip() or None, "rounds": args.rounds,
                                         "repeats": args.repeats, "rows": rows}, indent=1))
    return 0 if all(r["differing"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
