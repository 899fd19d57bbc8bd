"""Our matmul kernels against cuBLAS SGEMM, timed the same way, interleaved, with an interval on the ratio.

    python benchmarks/vs_library.py [--quick] [--rounds 300] [--procs 3] [--request LABEL=RUN_REQUEST.json ...]
                                    [--pack LABEL=OPTIMIZE_PACK ...]

Rows: the shipped matmul kernel on the example's performance cases (256³, 384×256×320) and on 2048³ (inputs
drawn here, its grid scaled from the 256³ case's), plus any ``--request`` (e.g. ``best-case-N.json`` of a
``cudagate optimize`` pack, a run request for one case), plus each ``--pack``'s winner (its best.cu and
summary.json) on the same three shapes, each shape built as the gate builds it: with the variant of its
shape class for a per-class winner (2048³ is class ``large``), on inputs drawn here. Kernels come from the
run requests the gate saves (``pytest --cuda-gate --cuda-gate-report``). Both sides get exactly the same
treatment:
- each is captured once in a CUDA graph (ours launched by CuPy, cuBLAS by PyTorch with TF32 off), so no
  host-side dispatch sits between the events of either;
- warm-up alternates the two until 50 ms have passed (and 10 launches each), the gate's time floor;
- every round times one replay of each in random order, each after a 2×L2 memset and 0-3 empty launches,
  between its own event pair;
- the ratio ours/cuBLAS is the Hodges-Lehmann estimate of the per-round log ratios with its 99 % Wilcoxon
  interval (``pytest_cudagate.judge.stats.paired_ratio``, the gate's own rule), per fresh process.
Needs a GPU, torch and cupy.
"""

from __future__ import annotations

import torch  # first: importing torch after cuda-bindings and cupy has failed on the GPU image

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cupy
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from request_kernels import RequestKernel  # noqa: E402
from optimize_matmul import SUITE, shapes, winner, write_inputs  # noqa: E402
from timing_fidelity import gate_requests, scaled, with_repeat  # noqa: E402

from pytest_cudagate.judge import stats  # noqa: E402
from pytest_cudagate.suite.loader import load_suite  # noqa: E402
from pytest_cudagate.worker.requests import run_request  # noqa: E402

WARMUP_S, WARMUP_MIN = 0.050, 10


def graph_of(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def measure(kernel: RequestKernel, rounds: int, seed: int) -> dict:
    """One fresh process's interleaved comparison of ``kernel`` with cuBLAS on the same inputs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m, n, k = (int(kernel.scalars[x]) for x in ("m", "n", "k"))
    a = torch.from_numpy(kernel.host["a"].reshape(m, k)).cuda()
    b = torch.from_numpy(kernel.host["b"].reshape(k, n)).cuda()
    c_lib = torch.empty((m, n), dtype=torch.float32, device="cuda")
    c_ours = cupy.zeros(m * n, dtype=cupy.float32)
    ours_args = {"a": cupy.asarray(a.reshape(-1)), "b": cupy.asarray(b.reshape(-1)), "c": c_ours}
    launch = dataclasses.replace(kernel, host=ours_args).launcher(cupy)
    graphs = {"ours": graph_of(lambda: launch(cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))),
              "cuBLAS": graph_of(lambda: torch.matmul(a, b, out=c_lib))}
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    rng = np.random.default_rng(seed)
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < WARMUP_S or count < WARMUP_MIN:
        for graph in graphs.values():
            graph.replay()
        torch.cuda.synchronize()
        count += 1
    events = {name: [] for name in graphs}
    for _ in range(rounds):
        for name in rng.permutation(list(graphs)):
            flush.zero_()
            for _ in range(int(rng.integers(0, 4))):
                torch.cuda._sleep(1)  # an (almost) empty kernel, like the harness's pad launches
            pair = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            pair[0].record()
            graphs[name].replay()
            pair[1].record()
            events[name].append(pair)
    torch.cuda.synchronize()
    ms = {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()}
    estimate = stats.paired_ratio(ms["ours"], ms["cuBLAS"])
    expected = c_lib.cpu().numpy()
    error = float(np.max(np.abs(cupy.asnumpy(c_ours).reshape(m, n) - expected)) / max(float(np.max(np.abs(expected))), 1e-30))
    return {"ours_us": float(np.median(ms["ours"])) * 1000, "cublas_us": float(np.median(ms["cuBLAS"])) * 1000,
            "ratio": estimate.ratio, "low": estimate.low, "high": estimate.high, "rounds": rounds,
            "max_rel_error": error}


def pack_requests(label: str, pack: Path, work: Path) -> dict[str, Path]:
    """Run requests of ``pack``'s winner on the matmul shapes, one per shape (its class's build)."""
    suite = load_suite(SUITE)
    candidate = winner(pack, label)
    if candidate is None:
        raise SystemExit(f"--pack {label}={pack}: no gated winner in that pack")
    program = candidate.program(suite.kernel("matmul_f32"))
    found = {}
    for case in shapes(suite):
        folder = work / f"pack-{len(found)}-{case.name}"
        write_inputs(folder, case)
        request = run_request(suite, program, [case], output_dir=folder / "out", source_text=candidate.text,
                              data_dir=folder)
        path = folder / "request.json"
        path.write_text(json.dumps(request))
        s = case.scalars
        shape = f"{s['m']}³" if s["m"] == s["n"] == s["k"] else f"{s['m']}×{s['n']}×{s['k']}"
        found[f"{label}, {shape}"] = path
    return found


def child(args) -> int:
    spec = json.loads(Path(args.child).read_text())
    answer = {}
    for i, entry in enumerate(spec["kernels"]):
        kernel = RequestKernel.load(Path(entry["request"]), entry["label"])
        answer[entry["label"]] = measure(kernel, spec["rounds"], seed=spec["seed"] * 100 + i)
    Path(spec["out"]).write_text(json.dumps(answer))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256³ and 2048³, 50 rounds, one process")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per process (default 300)")
    parser.add_argument("--procs", type=int, help="fresh processes (default 3)")
    parser.add_argument("--request", action="append", default=[], metavar="LABEL=FILE")
    parser.add_argument("--pack", action="append", default=[], metavar="LABEL=DIR",
                        help="a `cudagate optimize` pack: its winner on 256³, 384×256×320 and 2048³")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    rounds = args.rounds or (50 if args.quick else 300)
    procs = args.procs or (1 if args.quick else 3)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="cudagate-vs-library-") as tmp:
        work = Path(tmp)
        saved = gate_requests(work, ("examples/matmul/cudagate.yaml",))
        kernels = {"shipped, 256³": with_repeat(saved["matmul", "perf_256x256x256"], work, "m256")}
        if not args.quick:
            kernels["shipped, 384×256×320"] = with_repeat(saved["matmul", "perf_384x256x320"], work, "m384")
        kernels["shipped, 2048³"] = scaled(saved["matmul", "perf_256x256x256"], 8, work)
        for item in args.request:
            label, _, path = item.partition("=")
            kernels[label] = Path(path).resolve()
        for item in args.pack:
            label, _, path = item.partition("=")
            kernels.update(pack_requests(label, Path(path).resolve(), work))
        for proc in range(procs):
            spec, out = work / f"spec-{proc}.json", work / f"out-{proc}.json"
            spec.write_text(json.dumps({"kernels": [{"label": label, "request": str(path)} for label, path in kernels.items()],
                                        "rounds": rounds, "seed": proc, "out": str(out)}))
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(spec)],
                                  capture_output=True, text=True, timeout=500)
            if done.returncode != 0:
                print(f"process {proc} failed:\n{(done.stdout + done.stderr)[-3000:]}", file=sys.stderr)
                continue
            for label, row in json.loads(out.read_text()).items():
                results.setdefault(label, []).append(row)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python benchmarks/vs_library.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"<!-- {command} — {now} -->\n")
    print("| kernel · shape | ours µs | cuBLAS SGEMM µs | ours / cuBLAS, 99 % interval, per process | max rel. error |")
    print("|---|---|---|---|---|")
    for label, rows in results.items():
        ratios = "; ".join(f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" for r in rows)
        print(f"| {label} | {np.median([r['ours_us'] for r in rows]):.2f} | {np.median([r['cublas_us'] for r in rows]):.2f} "
              f"| {ratios} | {max(r['max_rel_error'] for r in rows):.1e} |")
    print(f"\n{rounds} interleaved rounds per process, random order, cold L2, both as CUDA graphs, warm-up ≥ 50 ms; "
          f"{procs} fresh process(es); µs: median over processes of each process's median")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "date": now, "results": results}, indent=1))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
