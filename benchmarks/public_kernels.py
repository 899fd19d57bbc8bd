"""Kernels nobody here wrote, gated on a GPU: per public project under tests/public/, each version's
verdict, its median latency on each performance case, and the order its authors publish, with whether
the measured order matches it.

    python benchmarks/public_kernels.py [--quick] [--suite NAME ...] [--json OUT.json]
    python benchmarks/public_kernels.py --merge A.json [B.json ...]   # the tables of earlier runs

Every kernel of every suite is replayed through the gate (one worker, as `pytest --cuda-gate` does) on
every case. A kernel has no approved version here, so each performance case is timed alone for one block
of the suite's `timing.repeat` launches (cold L2); the median is of those launches. ``--quick`` times 10
launches after 2 warm-ups and leaves compute-sanitizer out: the same verdicts but for what only a
sanitizer sees, in a few minutes. ``--suite`` (repeatable) gates the named suites only, so that a long run
can be split; ``--merge`` joins the files. ``--json`` files: schemas/public-kernels.schema.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "tests" / "public"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_header import with_header  # noqa: E402
from pytest_cudagate.boundary import schema  # noqa: E402

SCHEMA = "public-kernels"
QUICK_TIMING = {"warmup": 2, "repeat": 10}

# What each project's authors publish about the speed of its versions: the versions, slowest first, the
# performance case they are compared on, and where the order is published.
PUBLISHED = {
    "cuda_samples": {
        "order": [("cuda_samples_reduce_blocks", "reduce0"), ("cuda_samples_reduce_blocks", "reduce1"),
                  ("cuda_samples_reduce_blocks", "reduce2"), ("cuda_samples_reduce_pairs", "reduce3"),
                  ("cuda_samples_reduce_pairs", "reduce4"), ("cuda_samples_reduce_pairs", "reduce5"),
                  ("cuda_samples_reduce_grid_stride", "reduce6")],
        "case": "perf_4194303",
        "source": "https://developer.download.nvidia.com/assets/cuda/files/reduction.pdf",
        "note": "M. Harris, Optimizing Parallel Reduction in CUDA: kernels 1-7 (reduce0-reduce6), 2^22 ints on a "
                "G80, 8.054 ms down to 0.268 ms. reduce7, cg_reduce and multi_warp_cg_reduce have no figure.",
    },
    "sgemm_cuda": {
        "order": [("sgemm_cuda", k) for k in (
            "k01_naive", "k02_gmem_coalescing", "k03_smem_caching", "k04_1d_blocktiling", "k05_2d_blocktiling",
            "k07_bank_conflicts_linearize", "k08_bank_conflicts_offset", "k11_double_buffering", "k06_vectorize",
            "k09_autotuning", "k10_warptiling")],
        "case": "perf_2048",
        "source": "https://github.com/siboehm/SGEMM_CUDA#overview",
        "note": "README.md, GFLOPs at 4096x4096 on an A6000 (kernel 12 has no figure); the case here is 2048.",
    },
    "llm_c": {
        "order": [("llm_c_layernorm_forward", f"v{n}") for n in range(1, 7)],
        "case": "perf_8x1024x768",
        "source": "https://github.com/karpathy/llm.c/blob/master/dev/cuda/README.md",
        "note": "dev/cuda/README.md: versions are \"usually\" in decreasing running time; no timings published. "
                "Shown for layernorm_forward; softmax_forward's versions 3 (32 threads) and 7 (large C) are "
                "exceptions the file states, so its order is not claimed.",
    },
}


class UsageError(Exception):
    """A wrong argument: one line, exit 2."""


def suites(names: list[str] | None) -> list[Path]:
    """The public suite folders, or those of the names given (each must exist)."""
    from pytest_cudagate.suite.loader import load_suite

    found = {load_suite(path / "cudagate.yaml").name: path for path in
             sorted(p.parent for p in PUBLIC.rglob("cudagate.yaml"))}
    for name in names or []:
        if name not in found:
            raise UsageError(f"--suite {name!r} is not a public suite; the suites: {', '.join(sorted(found))}")
    return [found[name] for name in names] if names else list(found.values())


def quick_copy(folder: Path, dest: Path) -> Path:
    """A copy of the suite that times QUICK_TIMING launches and runs no sanitizer (honoured by the gate's
    replay, which is handed the suite as loaded; the signature does not cover the copy)."""
    shutil.copytree(folder, dest)
    path = dest / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["timing"] = {**raw.get("timing", {}), **QUICK_TIMING}
    raw["checks"] = {**raw.get("checks", {}), "sanitizer": "off"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


def measure(folders: list[Path], quick: bool, work: Path) -> list[dict]:
    """One row per kernel and case."""
    from pytest_cudagate.trust.approvals import Ledger
    from pytest_cudagate.gate import Gate, GateOptions
    from pytest_cudagate.session import open_worker
    from pytest_cudagate.suite.loader import load_suite

    rows = []
    with open_worker(timeout_s=120) as worker:
        for folder in folders:
            copy = work / folder.relative_to(PUBLIC)
            if quick:
                quick_copy(folder, copy)
            else:
                shutil.copytree(folder, copy)
            suite = load_suite(copy / "cudagate.yaml")
            gate = Gate(worker.client, worker.fingerprint, GateOptions(), work / "out")
            ledger = Ledger.for_suite(suite)
            for program in suite.kernels:
                for case in suite.cases:
                    outcome = gate.replay(suite, program, case, ledger)
                    current = outcome.latency.current if outcome.latency is not None else None
                    rows.append({
                        "project": folder.relative_to(PUBLIC).parts[0], "suite": suite.name,
                        "kernel": program.name, "case": case.name, "kind": case.kind,
                        "verdict": "failed" if outcome.failed else "passed",
                        "message": (outcome.message or "").strip().splitlines()[0][:300] if outcome.failed else "",
                        "median_ms": current.median if current is not None else None,
                        "launches": current.n if current is not None else 0})
                    print(f"{suite.name}::{program.name}::{case.name}: {rows[-1]['verdict']}"
                          + (f", median {current.median:.4f} ms" if current is not None else ""), file=sys.stderr)
    return rows


def order_check(rows: list[dict], project: str) -> tuple[list[tuple[str, str]], str]:
    """The published versions, slowest first as measured on the project's case, and whether that is the
    published order ("yes", "no, ..." naming each pair measured out of order, or why it cannot be said)."""
    published = PUBLISHED[project]
    median = {(r["suite"], r["kernel"]): r["median_ms"] for r in rows
              if r["project"] == project and r["case"] == published["case"] and r["median_ms"] is not None}
    missing = [k for _, k in published["order"] if (_, k) not in median]
    if missing:
        return [], f"not measured: {', '.join(missing)}"
    measured = sorted(published["order"], key=lambda key: -median[key])
    swapped = [f"{a[1]} is faster than {b[1]}" for i, a in enumerate(published["order"])
               for b in published["order"][i + 1:] if median[a] < median[b]]
    return measured, "yes" if not swapped else f"no, against the published order {'; '.join(swapped)}"


def tables(document: dict) -> str:
    meta, rows = document["meta"], document["rows"]
    out = [f"{meta['command']} · {meta['date']} · {meta['gpu']}" + (" · quick" if meta.get("quick") else "")]
    for project in dict.fromkeys(r["project"] for r in rows):
        mine = [r for r in rows if r["project"] == project]
        published = PUBLISHED.get(project)
        rank = {key: i + 1 for i, key in enumerate(published["order"])} if published else {}
        measured, matches = order_check(rows, project) if published else ([], "no published order")
        measured_rank = {key: i + 1 for i, key in enumerate(measured)}
        out += ["", f"**{project}**", "",
                "| suite | version | verdict | median ms per performance case | published rank (slowest 1) | "
                "measured rank |", "|---|---|---|---|---|---|"]
        for suite, kernel in dict.fromkeys((r["suite"], r["kernel"]) for r in mine):
            own = [r for r in mine if (r["suite"], r["kernel"]) == (suite, kernel)]
            failed = [r for r in own if r["verdict"] == "failed"]
            verdict = "passed" if not failed else "; ".join(f"failed {r['case']}: {r['message']}" for r in failed)
            times = ", ".join(f"{r['case']} {r['median_ms']:.4f}" for r in own if r["median_ms"] is not None) or "—"
            key = (suite, kernel)
            out.append(f"| {suite} | {kernel} | {verdict.replace('|', '/')} | {times} | "
                       f"{rank.get(key, '—')} | {measured_rank.get(key, '—')} |")
        if published:
            out += ["", f"Measured order matches the published order ({published['case']}): {matches}. "
                        f"Published: {published['source']} ({published['note']})"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"time {QUICK_TIMING['repeat']} launches per performance case, no compute-sanitizer")
    parser.add_argument("--suite", action="append", metavar="NAME", help="gate this public suite only (repeatable)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON", help="print the tables of earlier runs")
    args = parser.parse_args(argv)
    try:
        if args.merge:
            if args.quick or args.suite or args.json:
                raise UsageError("--merge prints the tables of kept files: it takes no --quick, --suite or --json")
            print(tables(merged(args.merge)))
            return 0
        folders = suites(args.suite)
        if args.json and args.json.exists() and not args.json.is_file():
            raise UsageError(f"--json {args.json}: not a file; name a file to write")
        now = datetime.datetime.now(datetime.timezone.utc)
        meta = {"command": "python benchmarks/public_kernels.py " + " ".join(argv),
                "date": now.strftime("%Y-%m-%d %H:%M UTC"), "gpu": "", "quick": args.quick,
                "session": f"{platform.node()}-{now.strftime('%Y%m%dT%H%M%S')}"}
        with tempfile.TemporaryDirectory(prefix="cudagate-public-") as tmp:
            rows = measure(folders, args.quick, Path(tmp))
    except (UsageError, RuntimeError) as exc:
        print(f"public_kernels: {exc}", file=sys.stderr)
        return 2
    document = with_header({"meta": meta, "rows": rows}, __file__, argv)
    meta["gpu"] = document["evidence"]["card"]
    print(tables(document))
    if args.json:
        args.json.write_text(json.dumps(document, indent=1))
    return 0


def merged(paths: list[Path]) -> dict:
    """The rows of several kept files under the first one's meta (the files of one split run)."""
    documents = []
    for path in paths:
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path}: cannot read it as JSON ({exc})") from None
        found = schema.problems(document, SCHEMA)
        if found:
            raise UsageError(f"{path}: {found[0]}")
        documents.append(document)
    return {"meta": documents[0]["meta"], "rows": [row for d in documents for row in d["rows"]]}


if __name__ == "__main__":
    sys.exit(main())
