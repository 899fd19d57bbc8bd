"""Kernels written to pass the gate rather than to be fast, each judged by fresh gate processes on a
GPU, beside honest identical copies: what the gate says of them, and what timing on fresh inputs costs.

    python benchmarks/hostile_kernels.py [--reps 4] [--aa 40] [--json OUT.json]
    python benchmarks/hostile_kernels.py --merge A.json B.json   # the tables of earlier runs

On the matmul example (its shipped tiled kernel, approved on this GPU first, as gate_power.py does):
- ``keyed``: takes the shipped kernel's path where the input's first two elements have the bits of the
  committed perf_256x256x256 case, and computes its product three times on any other input;
- ``throttles``: on the 2048³ case, the product followed by a tensor-core (WMMA) loop in every block,
  about twice the product's time of the card's heaviest work, to drive it towards its power cap;
- ``A/A``: a byte-different identical copy on perf_256x256x256, with fresh timing (the default) and,
  for its cost, with ``checks: {fresh_timing: false}``.

Each comparison is a fresh ``pytest --cuda-gate`` process (fresh worker and allocations, a fresh input
seed). Each variant's slowdown is timed independently of the gate's estimator: ``cudagate run`` of its
case alone (CUDA events, cold L2), in a fresh process, against the approved kernel's. ``--json``
files: schemas/hostile-kernels.schema.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from evidence_header import with_header
from gate_power import UsageError, gate_process, log, prepare, run, upper95
from pytest_cudagate.boundary import schema

ROOT = Path(__file__).resolve().parents[1]
SMALL, LARGE = "perf_256x256x256", "large_2048x2048x2048"
BURN_ITERS = 14000  # WMMA steps per warp after the product: about twice a 2048³ product's time on an H100


def keyed(source: str, head: np.ndarray) -> str:
    """The shipped kernel as a device function, run once where ``a`` starts with ``head`` (the signed
    case's first two elements, read from the committed file as an author could) and three times
    anywhere else."""
    bits = head.view(np.uint32)
    body = source.replace('extern "C" __global__ void matmul_f32(', "__device__ __forceinline__ void shipped(", 1)
    return body + f"""
extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{{
    const bool seen = __float_as_uint(a[0]) == {int(bits[0])}u && __float_as_uint(a[1]) == {int(bits[1])}u;
    for (int pass = 0; pass < (seen ? 1 : 3); ++pass) shipped(a, b, c, m, n, k);
}}
"""


def throttles(source: str, iters: int = BURN_ITERS) -> str:
    """The shipped kernel, then ``iters`` tensor-core steps per warp on fragments held in registers
    (nothing is written unless a sum no input gives turns up, which keeps the work)."""
    body = source.replace('extern "C" __global__ void matmul_f32(', "__device__ __forceinline__ void shipped(", 1)
    return "#include <mma.h>\n" + body + f"""
extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{{
    shipped(a, b, c, m, n, k);
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(fa, __float2half(1.0e-3f * (threadIdx.x + 1)));
    wmma::fill_fragment(fb, __float2half(1.0e-3f));
    wmma::fill_fragment(acc, 0.0f);
    for (int i = 0; i < {iters}; ++i) wmma::mma_sync(acc, fa, fb, acc);
    if (acc.x[0] == -12345.0f) c[0] = acc.x[1];
}}
"""


def relaxed(folder: Path) -> Path:
    """A copy of the suite folder whose checks switch fresh timing off (the cost's control)."""
    path = folder / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["checks"] = {**(raw.get("checks") or {}), "fresh_timing": False}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def alone_ms(request: Path, source: str, work: Path, label: str, env: dict, data: Path,
             inputs: dict[str, np.ndarray] | None = None) -> float:
    """The case timed alone by ``cudagate run`` (CUDA events, cold L2, 100 launches) in a fresh
    process, in the suite folder ``data`` that holds its case data (``inputs``: other values for
    some of its inputs): the median in ms, independent of the interleaved estimator."""
    raw = json.loads(request.read_text())
    raw["kernel"]["source"] = source
    (case,) = raw["cases"]
    for name, values in (inputs or {}).items():
        path = data / f"other-{name}.npy"
        np.save(path, values)
        case["buffers"][name]["input"] = str(path)
        case["expected"] = {}  # other inputs, other outputs: timed, not judged
    raw["timing"] = {"warmup": 10, "repeat": 100, "cache": "cold"}
    raw.pop("library", None)
    name = re.sub(r"[^A-Za-z0-9]+", "-", label)
    path = request.parent / f"alone-{name}.json"
    path.write_text(json.dumps(raw))
    code, text, _ = run([sys.executable, "-m", "pytest_cudagate.cli", "run", str(path), "--output",
                         str(work / f"alone-{name}")], cwd=data, env=env, timeout=300)
    if code != 0:
        raise RuntimeError(f"cudagate run of {label} failed:\n{text[-3000:]}")
    answer, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])  # its stdout; stderr follows
    (case,) = answer["cases"]
    return float(np.median(case["timing"]["samples_ms"]))


def comparison(suite_yaml: Path, report: Path, env: dict) -> dict:
    """One fresh gate process: what its report says of the performance case."""
    item, process = gate_process(suite_yaml, report, env, timeout=300)
    if "error" in process:
        return process
    latency = item.get("latency") or {}
    inputs = latency.get("inputs") or {}
    telemetry = [state for state in latency.get("telemetry") or [] if isinstance(state, dict)]
    powers = [state["power_w"] for state in telemetry if isinstance(state.get("power_w"), (int, float))]
    events = sorted({r for state in telemetry for r in state.get("throttle_reasons") or [] if r != "gpu_idle"})
    estimate = latency.get("estimate") or {}
    return {"verdict": latency.get("verdict"), "failed": item.get("status") == "failed", **process,
            "ratio": estimate.get("ratio"), "low": estimate.get("low"), "high": estimate.get("high"),
            "signed_ratio": (inputs.get("signed") or {}).get("ratio"),
            "fresh_ratio": (inputs.get("fresh") or {}).get("ratio"), "keyed": inputs.get("keyed"),
            "disturbed_by": latency.get("disturbed_by"), "discarded": len(latency.get("discarded") or []),
            "kept_disturbed": len(latency.get("kept_disturbed") or []),
            "pairs": latency.get("pairs"), "measurement_s": latency.get("measurement_s"),
            "max_power_w": max(powers) if powers else None, "clock_events": events,
            "worker_s": item.get("worker_s")}


def measure(args, work: Path, meta: dict) -> tuple[list[dict], list[dict]]:
    small = prepare("matmul", work / "small", {}, case=SMALL)
    large = prepare("matmul", work / "large", {}, case=LARGE)
    head = np.load(ROOT / "examples" / "matmul" / "cases" / SMALL / "a.npy").reshape(-1)[:2]
    variants = {  # label -> (suite yaml, source, prepared it is timed against)
        "A/A": (small.variant("A/A", small.source + "\n// identical copy (A/A)\n"), small),
        "A/A, fresh timing off": (relaxed(small.variant("A/A off", small.source + "\n// identical copy\n").parent),
                                  small),
        "keyed": (small.variant("keyed", keyed(small.source, head)), small),
        "throttles": (large.variant("throttles", throttles(large.source)), large),
    }
    # The keyed kernel is timed on the signed inputs and on others: a shuffle of the signed values.
    other = {"a": np.random.default_rng(1).permutation(
        np.load(small.root / "cases" / SMALL / "a.npy").reshape(-1)).reshape(256, 256)}
    truth = []
    for label, (path, prepared) in variants.items():
        source = (path.parent / prepared.source_file).read_text()
        for inputs in ("signed", "other") if label == "keyed" else ("signed",):
            swap = other if inputs == "other" else None
            base = alone_ms(prepared.request, prepared.source, work, f"{label}-{inputs}-base", {}, prepared.root, swap)
            mine = alone_ms(prepared.request, source, work, f"{label}-{inputs}", {}, prepared.root, swap)
            truth.append({"variant": label, "case": prepared.case, "inputs": inputs, "approved_ms": base,
                          "variant_ms": mine, "ratio": mine / base})
            log(f"{label} on {inputs} inputs: {mine:.4f} ms against {base:.4f} ms alone ({mine / base:.3f}x)")
    counts = {"A/A": args.aa, "A/A, fresh timing off": max(1, args.aa // 4), "keyed": args.reps,
              "throttles": args.reps}
    rows, started = [], time.perf_counter()
    order = [label for label in ("keyed", "throttles") for _ in range(counts[label])]
    order += [label for n in range(args.aa) for label in ("A/A", "A/A, fresh timing off")
              if label == "A/A" or n % 4 == 0]
    for number, label in enumerate(order):
        if time.perf_counter() - started > args.deadline:
            log(f"deadline: {len(order) - number} comparison(s) not run")
            break
        path, prepared = variants[label]
        row = comparison(path, work / "reports" / f"{number}", {})
        rows.append({"variant": label, "case": prepared.case, "rep": number, "session": meta["session"], **row})
        log(f"{label} {number}: {row.get('verdict')} failed={row.get('failed')} ratio={row.get('ratio')}")
    return truth, rows


def tables(truth: list[dict], rows: list[dict], meta: dict) -> str:
    out = [f"{meta['command']} · {meta['date']} · {meta['gpu']}", "",
           "| variant | case | alone, ms: approved → variant (ratio) | gate processes | failed | regressed | "
           "unstable | estimate: median | fresh / signed ratio: median | disturbed by | NVML after chunks: most W, "
           "clock events | median rounds | median measurement s | median worker s |", "|" + "---|" * 14]
    for label in dict.fromkeys(r["variant"] for r in truth):
        mine = [r for r in rows if r["variant"] == label and "error" not in r]
        alone = [t for t in truth if t["variant"] == label]
        shown = "; ".join(f"{t.get('inputs', 'signed')} inputs {t['approved_ms']:.4f} → {t['variant_ms']:.4f} "
                          f"({t['ratio']:.3f})" for t in alone) or "—"
        powers = [r["max_power_w"] for r in mine if r.get("max_power_w") is not None]
        events = sorted({e for r in mine for e in r.get("clock_events") or []})
        nvml = (f"{max(powers):.0f} W" if powers else "—") + ", " + (", ".join(events) or "none")

        def median(key: str, fmt: str) -> str:
            values = [r[key] for r in mine if r.get(key) is not None]
            return format(float(np.median(values)), fmt) if values else "—"

        shift = [r["fresh_ratio"] / r["signed_ratio"] for r in mine if r.get("fresh_ratio") and r.get("signed_ratio")]
        who = sorted({r["disturbed_by"] for r in mine if r.get("disturbed_by")}) or ["—"]
        out.append("| " + " | ".join([
            label, alone[0]["case"] if alone else "", shown, str(len(mine)),
            f"{sum(r['failed'] for r in mine)}", f"{sum(r['verdict'] == 'regressed' for r in mine)}",
            f"{sum(r['verdict'] == 'unstable' for r in mine)}", median("ratio", ".3f"),
            f"{np.median(shift):.3f}" if shift else "—", ", ".join(who), nvml, median("pairs", ".0f"),
            median("measurement_s", ".2f"), median("worker_s", ".2f")]) + " |")
    aa = [r for r in rows if r["variant"] == "A/A" and "error" not in r]
    if aa:
        k = sum(r["verdict"] == "regressed" for r in aa)
        out.append(f"\nA/A (fresh timing on): `regressed` in {k} of {len(aa)} fresh processes on one card, one "
                   f"session; 95 % upper bound {upper95(k, len(aa)):.1%}.")
    errors = [r for r in rows if "error" in r]
    if errors:
        out.append(f"\n{len(errors)} comparison(s) gave no report (see the JSON).")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4, help="fresh gate processes per hostile kernel (default 4)")
    parser.add_argument("--aa", type=int, default=40, help="A/A comparisons with fresh timing (default 40; a "
                                                           "quarter as many with it off)")
    parser.add_argument("--deadline", type=float, default=420.0, help="start no comparison after this many seconds")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON", help="print the tables of earlier runs")
    args = parser.parse_args(argv)
    if args.merge:
        for path in args.merge:
            document = json.loads(path.read_text())
            found = schema.problems(document, "hostile-kernels")
            if found:
                print(f"hostile_kernels: {path}: {found[0]}", file=sys.stderr)
                return 2
            print(tables(document["truth"], document["rows"], document["meta"]) + "\n")
        return 0
    if min(args.reps, args.aa) < 1 or not 0 < args.deadline < 86400:
        print("hostile_kernels: --reps and --aa are at least 1, --deadline within a day", file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.timezone.utc)
    meta = {"command": "python benchmarks/hostile_kernels.py " + " ".join(argv),
            "date": now.strftime("%Y-%m-%d %H:%M UTC"), "gpu": "",
            "session": f"{platform.node()}-{now.strftime('%Y%m%dT%H%M%S')}"}
    try:
        with tempfile.TemporaryDirectory(prefix="cudagate-hostile-") as tmp:
            truth, rows = measure(args, Path(tmp), meta)
    except (UsageError, RuntimeError) as exc:
        print(f"hostile_kernels: {exc}", file=sys.stderr)
        return 2
    document = with_header({"meta": meta, "truth": truth, "rows": rows}, __file__, argv)
    meta["gpu"] = document["evidence"]["card"]
    print(tables(truth, rows, meta))
    if args.json:
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
