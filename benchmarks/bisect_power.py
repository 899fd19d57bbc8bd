"""Does `cudagate bisect` find the one commit of sixteen that made a kernel about 3 % slower, and at what cost?

    python benchmarks/bisect_power.py [--runs 20] [--suite matmul] [--case NAME] [--slow-at 11] [--target 3]
                                      [--threshold PCT] [--budget S] [--truth-procs 3] [--cycles N] [--json OUT]

A temporary git repository is built from one example (``--suite``, its ``--case`` and first correctness
case only): the suite signed with the demo key (examples/keys/demo-maintainer.key, trusted through
.cudagate/trusted_keys/demo-maintainer.pub), GOOD the kernel as shipped, then 16 commits that each
change the kernel's source and re-approve it (a comment naming the revision; from ``--slow-at`` on, a
clock64() spin at the start of every block) and 4 that leave it alone (notes). The spin is sized by
nvbench (``gate_power.calibrate``: a reference spin measured against the base in one nvbench process,
scaled to ``--target``), and the variant's slowdown is then measured by nvbench again in
``--truth-procs`` fresh processes, independently of the gate. Then ``cudagate bisect GOOD HEAD`` runs
``--runs`` times, each a fresh process as a user runs it: how often it names the slow commit, the
comparisons it took (at most ceil(log2 16) + 1 = 5 for 16 candidates), the worker's (GPU) seconds and
the process's wall seconds. Starts no run that would end past ``--deadline``.

Needs a GPU, cupy and cuda-bench (nvbench) for the sizing (``--cycles N`` skips it: the spin is then
not measured). Without a GPU the repository is built and one bisect runs up to the worker; the script
then says so in one line and exits 3. ``--json`` files: schemas/bisect-power.schema.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from evidence_header import with_header
from gate_power import Prepared, calibrate, describe, log, nvbench, slowed, visible_gpus
from pytest_cudagate.boundary import schema
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.cli import main as cudagate
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import SIGNING_KEY_ENV, TRUSTED_IDS_ENV
from pytest_cudagate.worker.requests import run_request

ROOT = Path(__file__).resolve().parents[1]
KEY = ROOT / "examples" / "keys" / "demo-maintainer.key"
TRUSTED = ROOT / ".cudagate" / "trusted_keys" / "demo-maintainer.pub"
KERNEL_COMMITS = 16
NOTE_EVERY = 4  # a commit that leaves the kernel alone after every 4th kernel commit
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
SIZING_PROCS = 3  # nvbench processes whose sizings' median is the spin
NO_GPU_SPIN = 1000  # cycles of the slow commit's spin where nothing can size it (the repository is still built)


class UsageError(Exception):
    """Bad input or an environment the run cannot use: one line, exit code 2."""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def quietly(*args: str) -> None:
    """One `cudagate` command in this process, its chatter kept out of the table."""
    with contextlib.redirect_stdout(io.StringIO()) as said:
        code = cudagate(list(args))
    if code != 0:
        raise RuntimeError(f"cudagate {' '.join(args)} exited {code}:\n{said.getvalue()[-2000:]}")


# -- the repository ----------------------------------------------------------------------------------

class Repository:
    """The example suite in a git repository: GOOD, then the kernel commits and the notes."""

    def __init__(self, work: Path, suite: str, case: str | None):
        self.root = work / "repo"
        self.folder = self.root / "examples" / suite
        shutil.copytree(ROOT / "examples" / suite, self.folder, ignore=shutil.ignore_patterns(
            "approved", "proposals", "cudagate.approvals.json", "cudagate.sig.json", "__pycache__"))
        raw = yaml.safe_load((self.folder / "cudagate.yaml").read_text())
        timed = [c for c in raw["cases"] if c["kind"] == "performance" and not c.get("generated")]
        chosen = next((c for c in timed if c["name"] == case), None) if case else timed[0]
        if chosen is None:
            raise UsageError(f"--case {case!r}: examples/{suite} has no such stored performance case; its cases: "
                             f"{', '.join(c['name'] for c in timed)}")
        kept = [next(c for c in raw["cases"] if c["kind"] == "correctness"), chosen]
        for folder in (self.folder / "cases").iterdir():
            if folder.name not in {c["name"] for c in kept}:
                shutil.rmtree(folder)
        raw["kernels"], raw["cases"] = raw["kernels"][:1], kept
        (self.folder / "cudagate.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False))
        self.case = chosen["name"]
        kernel = raw["kernels"][0]
        self.entry = kernel.get("entry", kernel["name"])
        self.source_file = self.folder / kernel["source"]
        self.base_source = self.source_file.read_text()
        (self.root / "pyproject.toml").write_text("[tool.cudagate]\n")
        (self.root / ".cudagate" / "trusted_keys").mkdir(parents=True)
        shutil.copy(TRUSTED, self.root / ".cudagate" / "trusted_keys" / TRUSTED.name)
        git(self.root, "init", "-q", "-b", "main")
        self.suite_file = self.folder / "cudagate.yaml"
        self.key = work / KEY.name  # a private copy: the committed one is readable by all, which signing warns of
        shutil.copy(KEY, self.key)
        self.key.chmod(0o600)

    def approve(self) -> None:
        """Approve the kernel as it stands (no GPU: the ledger pins it) and sign the suite and ledger."""
        suite = load_suite(self.suite_file)
        ledger = Ledger.for_suite(suite)
        program = suite.kernels[0]
        ledger.approvals[program.name] = approval_for(ledger, program, approved_by="bench",
                                                      approved_at="2026-12-02T00:00:00+00:00", git={},
                                                      tool_version="bisect_power")
        ledger.save()
        quietly("sign", str(self.suite_file), "--key", str(self.key))

    def commit(self, message: str) -> str:
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "--allow-empty", "-m", message)
        return git(self.root, "rev-parse", "HEAD")

    def build(self, slow_at: int, cycles: int) -> tuple[str, str]:
        """GOOD, the 16 kernel commits and the notes; returns GOOD's sha and the slow commit's."""
        self.approve()
        good = self.commit("GOOD: the kernel as shipped, approved")
        culprit = ""
        for number in range(1, KERNEL_COMMITS + 1):
            source = self.base_source if number < slow_at else slowed(self.base_source, self.entry, cycles)
            self.source_file.write_text(f"{source}\n// revision {number}\n")
            self.approve()
            sha = self.commit(f"kernel revision {number}" + (" (the slow one)" if number == slow_at else ""))
            culprit = sha if number == slow_at else culprit
            if number % NOTE_EVERY == 0:
                (self.root / "NOTES").write_text(f"after revision {number}\n")
                self.commit(f"notes after revision {number}")
        return good, culprit


# -- sizing the slowdown ---------------------------------------------------------------------------------

def sized(repo: Repository, work: Path, target: float, truth_procs: int) -> tuple[int, list[float]]:
    """Spin cycles for ``target``: the median of :data:`SIZING_PROCS` sizings (gate_power.calibrate, one fresh
    nvbench process each: a process's cycles-to-time slope moves by a point or so), and the variant's
    slowdown as nvbench then measures it in ``truth_procs`` further fresh processes."""
    suite = load_suite(repo.suite_file)
    program, case = suite.kernels[0], suite.case(repo.case)
    request = work / "request.json"
    request.write_text(json.dumps(run_request(suite, program, [case], output_dir=work / "out",
                                              timing=suite.timing.to_json())))
    prepared = Prepared(repo.folder.name, repo.folder, repo.source_file.name, repo.entry, repo.case, request,
                        shipped_median_us(repo.folder.name, repo.case))
    cycles = int(np.median([calibrate([prepared], (target,), work, {})[prepared.name, target]
                            for _ in range(SIZING_PROCS)]))
    variant = slowed(repo.base_source, repo.entry, cycles)
    probes = [{"label": "base", "request": str(request), "source": repo.base_source},
              {"label": "slow", "request": str(request), "source": variant}]
    return cycles, [m["slow"] / m["base"] - 1 for m in (nvbench(probes, work, {}) for _ in range(truth_procs))]


def shipped_median_us(suite: str, case: str) -> float:
    """The case's median in the example's shipped baselines (it sizes the reference spin only); 15 µs if none."""
    raw = json.loads((ROOT / "examples" / suite / "cudagate.approvals.json").read_text())
    medians = [b["cases"][case]["summary"]["median"] for a in raw["approvals"].values()
               for b in a["baselines"].values() if case in b["cases"]]
    return float(np.median(medians)) * 1000 if medians else 15.0


# -- the runs ------------------------------------------------------------------------------------------------

def bisect_args(repo: Repository, good: str, out: Path, args) -> list[str]:
    extra = [*(["--threshold", str(args.threshold)] if args.threshold else []),
             *(["--budget", str(args.budget)] if args.budget else [])]
    return [sys.executable, "-m", "pytest_cudagate.cli", "bisect", good, "HEAD", str(repo.suite_file),
            "--case", repo.case, "--json", str(out), *extra]


def one_run(repo: Repository, good: str, culprit: str, number: int, work: Path, args) -> dict:
    out = work / f"bisect-{number}.json"
    started = time.perf_counter()
    done = subprocess.run(bisect_args(repo, good, out, args), cwd=repo.root, capture_output=True, text=True,
                          timeout=300)
    wall = time.perf_counter() - started
    if not out.is_file():
        return {"run": number, "error": (done.stdout + done.stderr)[-1500:], "wall_s": wall}
    document = json.loads(out.read_text())
    first = (document["first_bad"] or {}).get("commit")
    total = next((c["estimate"] for c in document["comparisons"]
                  if c["commit"] == first and c["reference"] == good), None) or {}
    return {"run": number, "verdict": document["verdict"], "found": first == culprit, "first_bad": first,
            "comparisons": len(document["comparisons"]), "worker_s": document["worker_s"], "wall_s": wall,
            "ratio": total.get("ratio"), "low": total.get("low"), "high": total.get("high")}


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "—"
    return f"{fmt.format(float(np.median(values)))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def table(meta: dict, runs: list[dict]) -> str:
    judged = [r for r in runs if "error" not in r]
    truth = meta["truth"]
    sizing = (f"sized for {meta['target'] * 100:g} %: nvbench measures it at "
              f"{spread([t * 100 for t in truth], '{:+.2f}')} % ({len(truth)} fresh processes)" if truth
              else "given with --cycles, not measured")
    bound = math.ceil(math.log2(meta["candidates"])) + 1
    ratios = [(r["ratio"] - 1) * 100 for r in judged if r.get("found") and r.get("ratio")]
    head = ("runs", "found the slow commit", f"comparisons per run: median [min, max] (bound {bound})",
            "worker (GPU) s per run: median [min, max]", "process wall s per run: median [min, max]",
            "gate's estimate of the slow commit vs GOOD, %")
    lines = [f"Measured by `{meta['command']}` — {meta['date']} — {meta['gpu']} — commit {meta['commit']}", "",
             f"examples/{meta['suite']} · {meta['case']}: GOOD + {meta['commits']} commits, {meta['candidates']} of them "
             f"re-approve the kernel; revision {meta['slow_at']} adds a {meta['cycles']}-cycle clock64() spin per block, "
             f"{sizing}; threshold {meta['threshold']}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
             "| " + " | ".join([str(len(judged)), f"{sum(bool(r.get('found')) for r in judged)} / {len(judged)}",
                                spread([r["comparisons"] for r in judged], "{:.0f}"),
                                spread([r["worker_s"] for r in judged]), spread([r["wall_s"] for r in judged]),
                                spread(ratios, "{:+.2f}")]) + " |"]
    wrong = [r for r in judged if not r.get("found")]
    if wrong:
        lines.append("\nMissed: " + "; ".join(f"run {r['run']}: {r['verdict']} {(r['first_bad'] or '')[:12]}"
                                              for r in wrong))
    errors = [r for r in runs if "error" in r]
    if errors:
        lines.append(f"\n{len(errors)} run(s) wrote no result (see the JSON for their output).")
    return "\n".join(lines)


def without_gpu(repo: Repository, good: str, work: Path, args) -> int:
    """No GPU: the repository is built and signed; check one bisect up to the worker, then say so."""
    done = subprocess.run(bisect_args(repo, good, work / "nogpu.json", args), cwd=repo.root, capture_output=True,
                          text=True, timeout=300)
    header = next((line for line in done.stdout.splitlines() if line.startswith("bisect ")), "")
    ok = done.returncode == 3 and f"{KERNEL_COMMITS} change the kernel's approved version" in header
    print(header or done.stdout[-2000:])
    print(done.stderr.strip()[-2000:])
    print(f"bisect_power: no CUDA device here: the repository and `cudagate bisect` up to the worker were checked "
          f"({'ok' if ok else 'FAILED: ' + done.stderr.strip()[-300:]}); the figure needs a GPU")
    return 3 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="bisect processes (default 20)")
    parser.add_argument("--suite", default="matmul", choices=("matmul", "softmax", "fir"), help="the example")
    parser.add_argument("--case", help="its stored performance case (default: the first)")
    parser.add_argument("--slow-at", type=int, default=11, help=f"the slow revision, 1..{KERNEL_COMMITS} (default 11)")
    parser.add_argument("--target", type=float, default=3.0, help="the slowdown to size the spin for, %% (default 3)")
    parser.add_argument("--threshold", type=float, help="bisect's --threshold, %% (default: the suite's)")
    parser.add_argument("--budget", type=float, help="bisect's --budget, s per comparison (default: its own)")
    parser.add_argument("--truth-procs", type=int, default=3, help="fresh nvbench processes on the variant (default 3)")
    parser.add_argument("--cycles", type=int, help="use this spin instead of sizing one (no nvbench needed)")
    parser.add_argument("--deadline", type=float, default=420.0, help="start no run that would end after this many s")
    parser.add_argument("--json", type=Path, help="write the runs here (schemas/bisect-power.schema.json)")
    args = parser.parse_args(argv)
    for name in (TRUSTED_IDS_ENV, SIGNING_KEY_ENV):  # the demo key signs and is trusted, whatever this shell says
        os.environ.pop(name, None)
    try:
        if not 1 <= args.slow_at <= KERNEL_COMMITS or args.runs < 1 or not 0 < args.target < 50:
            raise UsageError(f"--slow-at 1..{KERNEL_COMMITS}, --runs at least 1, --target between 0 and 50 (%)")
        gpus = visible_gpus()
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cudagate-bisect-power-") as tmp:
            work = Path(tmp)
            repo = Repository(work, args.suite, args.case)
            if not gpus:
                good, _ = repo.build(args.slow_at, args.cycles or NO_GPU_SPIN)
                return without_gpu(repo, good, work, args)
            if args.cycles is not None:
                cycles, truth = args.cycles, []
            else:
                try:
                    import cupy  # noqa: F401 - nvbench_probe launches through CuPy
                    from cuda import bench  # noqa: F401
                except ImportError as exc:
                    raise UsageError(f"sizing the spin needs cupy and cuda-bench (nvbench): {exc}; install them or "
                                     "pass --cycles N") from None
                cycles, truth = sized(repo, work, args.target / 100, args.truth_procs)
            good, culprit = repo.build(args.slow_at, cycles)
            log(f"repository built at {time.perf_counter() - started:.0f} s: spin {cycles} cycles at revision "
                f"{args.slow_at}, nvbench {[f'{t * 100:+.2f}%' for t in truth]}")
            runs, slowest = [], 0.0
            for number in range(args.runs):
                if time.perf_counter() - started + slowest > args.deadline:
                    log(f"deadline: stopped after {number} of {args.runs} runs")
                    break
                runs.append(one_run(repo, good, culprit, number, work, args))
                slowest = max(slowest, runs[-1]["wall_s"])
                log(f"run {number + 1}: {runs[-1].get('verdict', 'error')}, {runs[-1].get('comparisons', '?')} "
                    f"comparisons, {runs[-1]['wall_s']:.1f} s")
    except UsageError as exc:
        print(f"bisect_power: {exc}", file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.timezone.utc)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip()
    commit = f"{commit}-dirty" if commit and dirty else commit  # measured on uncommitted changes: say so
    meta = {"command": "python benchmarks/bisect_power.py " + " ".join(argv), "date": now.strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit or None, "gpu": describe(gpus), "host": platform.node(), "suite": args.suite,
            "case": repo.case, "commits": KERNEL_COMMITS + KERNEL_COMMITS // NOTE_EVERY, "candidates": KERNEL_COMMITS,
            "slow_at": args.slow_at, "target": args.target / 100, "cycles": cycles, "truth": truth,
            "threshold": f"{args.threshold:g} %" if args.threshold else "the suite's"}
    document = with_header({"meta": meta, "runs": runs}, __file__, argv, meta["gpu"])
    if args.json:
        schema.validate(document, "bisect-power", args.json)
        args.json.write_text(json.dumps(document, indent=1))
    print(table(meta, runs))
    return 0 if runs and all(r.get("found") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
