"""Latency of the matmul pilot's kernels after `cudagate optimize`, against cuBLAS SGEMM (H200).

    python benchmarks/optimize_matmul.py --autotune-pack results/run-001 --replay-pack results/run-002 [--reps 300]
    python benchmarks/optimize_matmul.py --template BM=128,BN=128,BK=8,TM=8,TN=8,PAD=4 --template BM=64,BN=64

Rows: the performance cases of examples/matmul (256³, 384×256×320) and 2048³. Columns: the initial (shipped)
kernel, the autotune winner and the replayed winner (best.cu and the launch in each pack's summary.json),
the SGEMM template the autotune proposer searches (the kernel's tuning_source) at each ``--template`` point
(tunables not named keep their defaults), and cuBLAS SGEMM through PyTorch (FP32 math, TF32 off). Everything is timed the same way: cold L2 (a 2×L2
memset before every launch), a random 0-3 empty launches before each, one CUDA event pair per launch
measured on the device, median of ``--reps`` launches. Our kernels run through the harness worker (the
gate's own timing code); the cuBLAS call is captured once in a CUDA graph (CuPy refuses cuBLAS calls during
stream capture; PyTorch does not), so no host-side dispatch sits between its events (timing a Python call
per launch read 32 µs for a 10 µs kernel on this GPU). Each kernel's output is checked against cuBLAS's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

try:  # PyTorch first: imported after cuda.bindings/cupy/scipy it has failed in one process (h200-timing-notes)
    import torch
except ImportError:  # no cuBLAS baseline then
    torch = None

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_cudagate.worker.client import HarnessClient  # noqa: E402
from pytest_cudagate.optimize.candidate import Candidate, launch_from_json  # noqa: E402
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer  # noqa: E402
from pytest_cudagate.worker.requests import run_request  # noqa: E402
from pytest_cudagate.suite.loader import load_suite  # noqa: E402
from pytest_cudagate.suite.model import Case, Variant  # noqa: E402

SUITE = REPO / "examples" / "matmul" / "cudagate.yaml"
BIG = (2048, 2048, 2048)


def winner(pack: Path, label: str) -> Candidate | None:
    if pack is None:
        return None
    summary = json.loads((pack / "summary.json").read_text())
    best = summary.get("best")
    if not best or not (pack / "best.cu").is_file():
        print(f"{pack}: no gated winner ({summary.get('outcome')}); skipping {label}", file=sys.stderr)
        return None
    classes = {name: Variant(tuple(v["options"]), launch_from_json(v["launch"]) if v.get("launch") else None)
               for name, v in (best.get("classes") or {}).items()}  # a per-class winner's variants
    return Candidate(source=(pack / "best.cu").read_text(), launch=launch_from_json(best["launch"]),
                     launch_overrides={k: launch_from_json(v) for k, v in best["launch_overrides"].items()},
                     origin=best["origin"], label=f"{label}: {best['label']}", classes=classes)


def template_point(suite, spec: str) -> Candidate:
    """The autotune candidate at ``NAME=VALUE,...`` (the other tunables at their defaults)."""
    kernel = suite.kernel("matmul_f32")
    tuner = AutotuneProposer(suite, kernel, [c for c in suite.cases if not c.holdout])
    values = {name: values[0] for name, values in kernel.tunables.items()}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if name not in values or not value.lstrip("-").isdigit():
            raise SystemExit(f"--template {spec}: {item!r} is not NAME=INTEGER with NAME one of {', '.join(values)}")
        values[name] = int(value)
    point = tuple(values[n] for n in tuner.names)
    candidate = tuner.candidate(point)
    if candidate is None:
        raise SystemExit(f"--template {spec}: {tuner.skipped[point]}")
    candidate.label = f"template {candidate.label}"
    return candidate


def shapes(suite) -> list[Case]:
    cases = [c for c in suite.cases if c.kind == "performance" and not c.holdout]
    m, n, k = BIG
    big = [Case(f"bench_{m}x{n}x{k}", "performance", {"m": m, "n": n, "k": k}, shape_class="large")]
    return [c for c in cases if c.scalars != big[0].scalars] + big  # the suite's own 2048³ case is timed once


def write_inputs(folder: Path, case: Case) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    s = case.scalars
    data = {"a": rng.uniform(-1, 1, (s["m"], s["k"])).astype(np.float32),
            "b": rng.uniform(-1, 1, (s["k"], s["n"])).astype(np.float32)}
    (folder / case.name).mkdir(parents=True, exist_ok=True)
    for name, array in data.items():
        np.save(folder / case.name / f"{name}.npy", array)
    return data


def time_ours(client, suite, candidate: Candidate, case: Case, data_dir: Path, out: Path, reps: int) -> tuple[float, np.ndarray | None]:
    program = candidate.program(suite.kernel("matmul_f32"))  # the bench 2048³ case runs the large class's build
    timing = {"warmup": 10, "repeat": reps, "cache": "cold", "warmup_ms": 50}
    request = run_request(suite, program, [case], output_dir=out, timing=timing, source_text=candidate.text,
                          data_dir=data_dir)
    result = client.run(request)
    if not result.compile.get("ok"):
        raise RuntimeError(f"{candidate.label} does not compile: {result.compile.get('log')}")
    body = result.cases[case.name]
    if body.get("status") != "ok":
        raise RuntimeError(f"{candidate.label} on {case.name}: {body.get('error')}")
    output = np.load(body["outputs"]["c"]["path"]) if "c" in body.get("outputs", {}) else None
    return float(np.median(body["timing"]["samples_ms"])), output


def time_cublas(a: np.ndarray, b: np.ndarray, reps: int) -> tuple[float, np.ndarray, str]:
    """cuBLAS SGEMM through PyTorch (TF32 off), captured once in a CUDA graph and replayed: cold L2 and
    0-3 pad launches before each replay, one event pair around it, as the harness times our kernels."""
    if torch is None:
        raise RuntimeError("PyTorch is not importable: no cuBLAS baseline")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    da, db = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
    dc = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32, device=device)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.matmul(da, db, out=dc)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.matmul(da, db, out=dc)
    method = "PyTorch cuBLAS SGEMM (TF32 off) replayed from a CUDA graph"
    rng = np.random.default_rng(0)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    remaining = reps
    while remaining:
        chunk = min(remaining, 200)
        events = []
        for _ in range(chunk):
            flush.zero_()
            for _ in range(int(rng.integers(0, 4))):
                torch.cuda._sleep(1)  # an (almost) empty kernel, like the harness's pad launches
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        samples += [s.elapsed_time(e) for s, e in events]
        remaining -= chunk
    return float(np.median(samples)), dc.cpu().numpy(), method


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--autotune-pack", type=Path)
    parser.add_argument("--replay-pack", type=Path)
    parser.add_argument("--template", action="append", default=[], metavar="NAME=V,...",
                        help="also time the SGEMM template at this point of its space (repeatable)")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--json", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()

    suite = load_suite(SUITE)
    kernels = [("initial", Candidate.initial(suite.kernel("matmul_f32")))]
    for label, pack in (("autotune winner", args.autotune_pack), ("replayed winner", args.replay_pack)):
        found = winner(pack, label)
        if found is not None:
            kernels.append((label, found))
    kernels += [(spec, template_point(suite, spec)) for spec in args.template]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as work, HarnessClient(timeout_s=120) as client:
        client.start()
        work = Path(work)
        for case in shapes(suite):
            data = write_inputs(work / "data", case)
            cublas_ms, reference, method = time_cublas(data["a"], data["b"], args.reps)
            row = {"case": case.name, "shape": [case.scalars[x] for x in ("m", "n", "k")], "cublas_ms": cublas_ms,
                   "cublas_method": method}
            for label, candidate in kernels:
                ms, output = time_ours(client, suite, candidate, case, work / "data", work / "out", args.reps)
                error = None
                if output is not None:
                    error = float(np.max(np.abs(output.reshape(reference.shape) - reference)) /
                                  max(float(np.max(np.abs(reference))), 1e-30))
                row[label] = {"ms": ms, "max_rel_error_vs_cublas": error, "kernel": candidate.label}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    labels = [label for label, _ in kernels]
    head = "| case | " + " | ".join(labels) + " | cuBLAS SGEMM | " + " | ".join(
        f"{l} vs initial" for l in labels[1:]) + " | best vs cuBLAS |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in rows:
        cells = [f"{row[l]['ms'] * 1000:.2f} µs" for l in labels]
        speedups = [f"{row['initial']['ms'] / row[l]['ms']:.2f}×" for l in labels[1:]]
        best = min(row[l]["ms"] for l in labels)
        print(f"| {row['case']} | " + " | ".join(cells) + f" | {row['cublas_ms'] * 1000:.2f} µs | " + " | ".join(speedups)
              + f" | {best / row['cublas_ms']:.2f}× |")
    print(f"\ncold L2, median of {args.reps} launches each, one event pair per launch; cuBLAS: {rows[0]['cublas_method']}")
    if args.json:
        args.json.write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
