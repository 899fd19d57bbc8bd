"""Does the release gate hold? Unchanged kernels, creep over five approvals, a toolchain-only change.

Runs what a user runs (`pytest --cuda-gate ...` and `cudagate approve`, each in a fresh process)
inside a temporary git repository it builds from examples/: the suites are copied, signed with a
throw-away key the repository trusts, approved where needed, committed and tagged v1.0.0.

    python benchmarks/release_drift.py [--quick] [--runs 20] [--plain-runs 10] [--approve-runs 5]
                                       [--only unchanged,creep,toolchain] [--json FILE]

Needs a GPU (an H200 for the figures in docs/release-gate.md); about 15 minutes at the defaults
(unchanged 7-8, creep 4, toolchain 2.5: split with --only), under two minutes with --quick.
Prints markdown tables. Without a GPU it builds the repository and checks everything up to the
worker (the release reference, each kernel's release item), then stops.

(a) unchanged: `--runs` release runs and `--plain-runs` plain gate runs over examples/matmul,
    softmax and fir: failed runs and warning verdicts. The kernels are byte-identical to v1.0.0's,
    so the release comparison has nothing to time (its verdict is `pass`, "identical to the version
    approved at v1.0.0"); what is measured is the stored-runs judgement of unchanged kernels
    (judge_run_spread against the approval runs' levels, each run's 10th percentile), which fails a release when `regressed`.
(b) creep: a copy of fir (cases correct_1001x13, perf_131072x2048) made ~1.2% slower five times
    (a clock64() spin at the start of every block, calibrated on this GPU), each step gated once
    and approved; the slowdown of every step is estimated in-process by a long interleaved
    comparison (the gate's estimator over 2 s, a sizing rather than an independent measurement;
    nvbench-measured effect sizes are benchmarks/gate_power.py's job). Then `--runs` release runs against v1.0.0: how many
    say `regressed` (latency.release, timed interleaved against v1.0.0's pinned source).
(c) toolchain: another copy whose source stays byte-identical while its NVRTC options change to
    the first candidate that costs >= 5% on this GPU (measured the same way), approved, then
    `--runs` release runs against v1.0.0: the release's options are built and timed against today's.
(d) GPU seconds per case: the harness worker's seconds per item (report.json `worker_s`) per mode,
    and `cudagate approve` wall seconds per case and run.

Interfaces used (as built):
  A1 `pytest --cuda-gate PATHS --cuda-gate-release[=REF]`: an optional value, default the newest
     tag matching `[tool.cudagate] release_tags` (`v*`) reachable from HEAD other than HEAD's own.
     The bare flag is passed last (or `=REF`) so that it cannot take a path.
  A2 `cudagate approve SUITE --runs N --key FILE` records N independent runs (fresh workers), one
     level (10th percentile) per run and case (`run_p10_ms`), the build, and signs the ledger.
  A3 report.json (`--cuda-gate-report DIR`): each performance item's `latency.release` is an
     object with `verdict` (pass/improved/regressed/inconclusive/incomparable/unstable), `reason`
     (the ref's label when timed), `headline` and `note` (toolchain drift); `latency.verdict` stays
     the PR gate's verdict (current vs approved, or against the stored runs when identical).
  A4 report.json item `worker_s` is the harness worker's time on the item (the GPU-side cost).
  A5 pytest's exit status is 0 when no item failed (warnings allowed).
  A6 `cudagate keygen --name N --out DIR` and `cudagate sign SUITE --key FILE`; a public key under
     `.cudagate/trusted_keys/` of the repository is trusted.
  A7 The examples' ledgers are used as shipped when they hold approval runs (approved on another
     machine by the maintainers); a suite without them (fir, creep, toolchain, or a ledger recorded
     before --runs existed) is approved here before v1.0.0, and the table says which.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

from evidence_header import with_header
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.latency import AdaptiveSampler
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.client import HarnessClient, WorkerUnavailable
from pytest_cudagate.worker.requests import case_spec, kernel_spec

ROOT = Path(__file__).resolve().parents[1]
SUITES = ("matmul", "softmax", "fir")
DRIFT_CASES = ("correct_1001x13", "perf_131072x2048")  # ~130 us, one wave of blocks: a spin adds its own time
DRIFT_CASE = DRIFT_CASES[1]
CREEP_STEP = 0.012
TOOLCHAIN_COST = 0.05
# Options that cost run time with the same source (NVRTC 13.0 accepts each; on CPU, fir's kernel
# goes from 400 SASS instructions to 192 with ptxas -O1, i.e. its inner loop is no longer unrolled).
OPTION_CANDIDATES = (["--ptxas-options=-O1"], ["--ptxas-options=-O0"], ["-G"])
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@example.com"}


class Repo:
    """The temporary repository, and the commands a user runs in it."""

    def __init__(self, root: Path, key: Path, reports: Path):
        self.root, self.key, self.reports = root, key, reports
        self.env = {k: v for k, v in os.environ.items() if k not in ("CUDAGATE_TRUSTED_KEY_IDS", "CUDAGATE_SIGNING_KEY")}
        self.env.update(GIT_ENV)
        self.serial = 0

    def sh(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=self.root, env=self.env, capture_output=True, text=True)
        if check and done.returncode != 0:
            sys.exit(f"failed: {' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def commit(self, message: str, tag: str | None = None) -> None:
        self.sh("git", "add", "-A")
        self.sh("git", "commit", "-q", "--allow-empty", "-m", message)
        if tag:
            self.sh("git", "tag", "-a", tag, "-m", tag)

    def cudagate(self, *args: str) -> float:
        start = time.perf_counter()
        self.sh(str(Path(sys.executable).parent / "cudagate"), *args)
        return time.perf_counter() - start

    def gate(self, suites: list[str], *extra: str) -> tuple[int, list[dict], float]:
        """One `pytest --cuda-gate` run in a fresh process: exit status, report items, wall seconds."""
        self.serial += 1
        out = self.reports / f"run{self.serial:03d}"
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--cuda-gate",
                "--cuda-gate-require-gpu", f"--cuda-gate-report={out}", *suites, *extra]  # A1: the release flag last
        start = time.perf_counter()
        done = self.sh(*args, check=False)
        seconds = time.perf_counter() - start
        report = out / "report.json"
        if not report.is_file():
            sys.exit(f"no report from: {' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.returncode, json.loads(report.read_text())["items"], seconds


def has_runs(ledger: Path) -> bool:
    """Whether every performance baseline of the ledger holds >= 2 approval runs (run_p10_ms)."""
    if not ledger.is_file():
        return False
    raw = json.loads(ledger.read_text())
    cases = [c for a in raw["approvals"].values() for b in a["baselines"].values() for c in b["cases"].values()]
    return bool(cases) and all(len(c.get("run_p10_ms") or []) >= 2 for c in cases)


def approving_cards(suites: list[str]) -> dict[str, list[str]]:
    """The cards (UUIDs) whose runs the shipped ledgers' baselines hold, per suite."""
    cards = {}
    for name in suites:
        raw = json.loads((ROOT / "examples" / name / "cudagate.approvals.json").read_text())
        cards[name] = sorted({(b.get("fingerprint") or {}).get("uuid") or "unknown"
                              for a in raw["approvals"].values() for b in a["baselines"].values()})
    return cards


def build_repo(tmp: Path, approve_runs: int, gpu: bool = True) -> tuple[Repo, list[str]]:
    """The repository, tagged v1.0.0, and the suites approved here (not with the shipped ledger)."""
    root, keys = tmp / "repo", tmp / "keys"
    root.mkdir()
    repo = Repo(root, keys / "bench.key", tmp / "reports")
    repo.sh("git", "init", "-q", "-b", "main")
    (root / "pyproject.toml").write_text("[tool.cudagate]\n")
    for name in SUITES:
        shutil.copytree(ROOT / "examples" / name, root / "examples" / name)
    for name in ("creep", "toolchain"):
        drift_copy(root / "examples" / "fir", root / "examples" / name)
    repo.cudagate("keygen", "--name", "bench", "--out", str(keys))
    (root / ".cudagate" / "trusted_keys").mkdir(parents=True)
    shutil.copy(keys / "bench.pub", root / ".cudagate" / "trusted_keys" / "bench.pub")
    approved_here = []
    for name in (*SUITES, "creep", "toolchain"):
        suite = root / "examples" / name
        # A7: a shipped ledger without approval runs (recorded before --runs existed) is re-approved here.
        if gpu and not has_runs(suite / "cudagate.approvals.json"):
            repo.cudagate("approve", str(suite), "--runs", str(approve_runs), "--key", str(repo.key))  # A2
            approved_here.append(name)
        repo.cudagate("sign", str(suite), "--key", str(repo.key))  # A6
    repo.commit("examples, signed and approved", tag="v1.0.0")
    repo.commit("work after the release")  # HEAD is not the tag: the default ref is v1.0.0
    return repo, approved_here


def without_gpu(repo: Repo) -> int:
    """No GPU here: check everything up to the worker (A1, A6, the release items) and stop."""
    out = repo.reports / "nogpu"
    done = repo.sh(sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--cuda-gate",
                   f"--cuda-gate-report={out}", *[f"examples/{s}" for s in SUITES], "--cuda-gate-release", check=False)
    release_items = [line for line in done.stdout.splitlines() if "::release " in line]
    print("\n".join(release_items) or done.stdout[-3000:])
    reference = next((line for line in done.stdout.splitlines() if line.startswith("release reference")), "")
    print(reference)
    ok = (done.returncode == 0 and reference.startswith("release reference v1.0.0")
          and len(release_items) == len(SUITES) and all("PASSED" in line for line in release_items)
          and (out / "report.json").is_file())
    print("no CUDA device: the repository, the signatures, the release reference and each kernel's release item "
          f"were checked ({'ok' if ok else 'FAILED'}); the figures need a GPU")
    return 0 if ok else 1


def drift_copy(fir: Path, target: Path) -> None:
    """A fir suite with only the cases the drift experiments need, and no approvals."""
    target.mkdir(parents=True)
    shutil.copy(fir / "fir.cu", target / "fir.cu")
    shutil.copy(fir / "reference.py", target / "reference.py")
    data = yaml.safe_load((fir / "cudagate.yaml").read_text())
    data["suite"] = target.name
    data["cases"] = [c for c in data["cases"] if c["name"] in DRIFT_CASES]
    (target / "cudagate.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False))
    for case in DRIFT_CASES:
        shutil.copytree(fir / "cases" / case, target / "cases" / case)


# --------------------------------------------------------------------------- effect sizes (in-process)


def spun(source: str, entry: str, cycles: int) -> str:
    """``source`` with a clock64() spin of ``cycles`` at the start of ``entry``."""
    match = re.search(r"__global__\s+void\s+" + re.escape(entry) + r"\s*\([^)]*\)\s*\{", source)
    spin = f"\n    {{ const long long t0 = clock64(); while (clock64() - t0 < {cycles}) {{ }} }}\n"
    return source[: match.end()] + spin + source[match.end():]


def true_ratio(client, suite_path: Path, approved: dict, current: dict, out: str, budget: float) -> float:
    """current/approved on DRIFT_CASE from one long interleaved comparison: the gate's own estimator (the
    Hodges-Lehmann ratio) over a 2 s budget, so a sizing of the effect, not an independent measurement of it."""
    suite = load_suite(suite_path)
    program = suite.kernels[0]
    case = suite.case(DRIFT_CASE)
    launch = program.launch_for(case.name).resolve(case.scalars)
    request = {
        "protocol": 1, "op": "compare", "kernels": {"approved": approved, "current": current},
        "launches": {"approved": launch, "current": launch}, "signature": [p.protocol() for p in suite.signature],
        "case": case_spec(suite, program, case), "timing": {**suite.timing.to_json(), "chunk": 100, "seed": 7},
        "output_dir": out,
    }
    sampler = AdaptiveSampler(0.001, budget)  # a tiny threshold: run the whole budget
    result = client.compare(request, sampler.decide)
    assert result.body and result.body["status"] == "ok", result.body
    return stats.paired_ratio(sampler.current, sampler.approved).ratio


# --------------------------------------------------------------------------- counting


def latency_items(items: list[dict]) -> list[dict]:
    return [i for i in items if i.get("latency")]


def release_verdict(item: dict) -> str:
    return (item["latency"].get("release") or {}).get("verdict", "missing")  # A3


def tally(runs: list[tuple[int, list[dict], float]], verdict_of) -> dict:
    verdicts = Counter(verdict_of(i) for _, items, _ in runs for i in latency_items(items))
    warnings = sum(1 for _, items, _ in runs for i in latency_items(items) if i["status"] == "warning")
    return {"runs": len(runs), "failed_runs": sum(1 for code, _, _ in runs if code != 0),
            "verdicts": dict(verdicts), "warnings": warnings, "cases": sum(verdicts.values())}


def gpu_seconds(runs: list[tuple[int, list[dict], float]]) -> float | None:
    seconds = [i["worker_s"] for _, items, _ in runs for i in latency_items(items) if i.get("worker_s") is not None]
    return sum(seconds) / len(seconds) if seconds else None


# --------------------------------------------------------------------------- experiments


def unchanged(repo: Repo, runs: int, plain_runs: int) -> dict:
    suites = [f"examples/{s}" for s in SUITES]
    release = [repo.gate(suites, "--cuda-gate-release") for _ in range(runs)]
    plain = [repo.gate(suites) for _ in range(plain_runs)]
    return {"release": tally(release, release_verdict), "plain": tally(plain, lambda i: i["latency"]["verdict"]),
            "gpu_s": {"release": gpu_seconds(release), "plain": gpu_seconds(plain)},
            "wall_s": {"release": sum(r[2] for r in release) / max(1, runs),
                       "plain": sum(r[2] for r in plain) / max(1, plain_runs)}}


def creep(repo: Repo, runs: int, approve_runs: int, budget: float) -> dict:
    suite_path = repo.root / "examples" / "creep" / "cudagate.yaml"
    source_path = suite_path.parent / "fir.cu"
    base_source = source_path.read_text()
    program = load_suite(suite_path).kernels[0]
    out = tempfile.mkdtemp(prefix="cudagate-drift-")
    measured = []
    with HarnessClient(timeout_s=300) as client:
        client.start()
        base = kernel_spec(program, base_source)
        trial = 20_000
        per_cycle = (true_ratio(client, suite_path, base, kernel_spec(program, spun(base_source, program.entry, trial)),
                                out, budget) - 1) / trial
        previous = base
        for k in range(1, 6):
            cycles = int(round(((1 + CREEP_STEP) ** k - 1) / per_cycle))
            source = spun(base_source, program.entry, cycles)
            current = kernel_spec(program, source)
            measured.append((k, cycles, source, true_ratio(client, suite_path, previous, current, out, budget),
                             true_ratio(client, suite_path, base, current, out, budget)))
            previous = current
    # The gate runs only after this process's worker is gone: a second process on the GPU is a
    # disturbance the gate reports (`unstable`), as it would on a shared runner.
    steps, approve_s = [], []
    for k, cycles, source, step, total in measured:
        source_path.write_text(source)
        code, items, _ = repo.gate(["examples/creep"])
        pr = [i["latency"]["verdict"] for i in latency_items(items)]
        approve_s.append(repo.cudagate("approve", str(suite_path.parent), "--runs", str(approve_runs),
                                       "--key", str(repo.key)))
        repo.commit(f"creep step {k}")
        steps.append({"step": k, "cycles": cycles, "step_ratio": step, "total_ratio": total,
                      "pr_gate": pr, "pr_exit": code})
    release = [repo.gate(["examples/creep"], "--cuda-gate-release") for _ in range(runs)]
    return {"steps": steps, "release": tally(release, release_verdict), "gpu_s": {"release": gpu_seconds(release)},
            "approve_s_per_case_run": sum(approve_s) / len(approve_s) / (len(DRIFT_CASES) * approve_runs)}


def toolchain(repo: Repo, runs: int, approve_runs: int, budget: float) -> dict:
    suite_path = repo.root / "examples" / "toolchain" / "cudagate.yaml"
    program = load_suite(suite_path).kernels[0]
    out = tempfile.mkdtemp(prefix="cudagate-drift-")
    tried = []
    with HarnessClient(timeout_s=300) as client:
        client.start()
        base = kernel_spec(program)
        for options in OPTION_CANDIDATES:
            ratio = true_ratio(client, suite_path, base, {**base, "options": [*base["options"], *options]}, out, budget)
            tried.append({"options": options, "ratio": ratio})
            if ratio - 1 >= TOOLCHAIN_COST:
                break
    chosen = tried[-1]
    data = yaml.safe_load(suite_path.read_text())
    data["kernels"][0]["options"] = [*data["kernels"][0].get("options", []), *chosen["options"]]
    suite_path.write_text(yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False))
    repo.cudagate("approve", str(suite_path.parent), "--runs", str(approve_runs), "--key", str(repo.key))
    repo.commit(f"toolchain: {' '.join(chosen['options'])}")
    release = [repo.gate(["examples/toolchain"], "--cuda-gate-release") for _ in range(runs)]
    return {"tried": tried, "chosen": chosen, "release": tally(release, release_verdict),
            "gpu_s": {"release": gpu_seconds(release)}}


# --------------------------------------------------------------------------- table


def share(t: dict, verdict: str) -> str:
    return f"{t['verdicts'].get(verdict, 0)} / {t['cases']}"


def table(results: dict) -> str:
    rows = ["| experiment | runs | failed runs | warning verdicts | regressed | other verdicts | GPU s per case |",
            "|---|---|---|---|---|---|---|"]

    def row(name, t, gpu):
        others = ", ".join(f"{v} {n}" for v, n in sorted(t["verdicts"].items()) if v != "regressed")
        rows.append(f"| {name} | {t['runs']} | {t['failed_runs']} | {t['warnings']} / {t['cases']} | "
                    f"{share(t, 'regressed')} | {others} | {'-' if gpu is None else f'{gpu:.2f}'} |")

    if "unchanged" in results:
        u = results["unchanged"]
        shipped = [s for s in SUITES if s not in results.get("approved_here", [])]
        cards = results.get("cards") or {}
        same = any(cards.get("measuring") in v for v in (cards.get("approving") or {}).values())
        where = (f"shipped approvals of {', '.join(shipped)}, measured on {'this' if same else 'another'} card"
                 if shipped else "all approved on this machine")
        row(f"unchanged ({where}), release gate vs v1.0.0", u["release"], u["gpu_s"]["release"])
        row("unchanged, plain gate", u["plain"], u["gpu_s"]["plain"])
    if "creep" in results:
        c = results["creep"]
        total = c["steps"][-1]["total_ratio"]
        row(f"creep, 5 approvals (total ~{(total - 1) * 100:+.1f}%) vs v1.0.0", c["release"], c["gpu_s"]["release"])
    if "toolchain" in results:
        t = results["toolchain"]
        row(f"toolchain only: {' '.join(t['chosen']['options'])} ({(t['chosen']['ratio'] - 1) * 100:+.1f}%) vs v1.0.0",
            t["release"], t["gpu_s"]["release"])
    lines = rows
    if "creep" in results:
        lines += ["", "| creep step | spin cycles | step slowdown (in-process estimate) | total (in-process estimate) | PR gate verdict (2%) | PR gate exit |",
                  "|---|---|---|---|---|---|"]
        for s in results["creep"]["steps"]:
            lines.append(f"| {s['step']} | {s['cycles']} | {(s['step_ratio'] - 1) * 100:+.2f}% | "
                         f"{(s['total_ratio'] - 1) * 100:+.2f}% | {', '.join(s['pr_gate'])} | {s['pr_exit']} |")
        lines.append(f"\n`cudagate approve`: {results['creep']['approve_s_per_case_run']:.2f} wall s per case and run")
    if "toolchain" in results:
        tried = "; ".join(f"{' '.join(t['options'])}: {(t['ratio'] - 1) * 100:+.1f}%" for t in results["toolchain"]["tried"])
        lines.append(f"\ntoolchain candidates measured on {DRIFT_CASE}: {tried}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 runs each, 2 approval runs, short comparisons")
    parser.add_argument("--runs", type=int, default=20, help="release runs per experiment (default 20)")
    parser.add_argument("--plain-runs", type=int, default=10, help="plain gate runs on unchanged kernels (default 10)")
    parser.add_argument("--approve-runs", type=int, default=5, help="`cudagate approve --runs` (default 5)")
    parser.add_argument("--only", default="unchanged,creep,toolchain", help="comma-separated experiments to run")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.plain_runs, args.approve_runs = 2, 1, 2
    budget = 0.5 if args.quick else 2.0  # seconds of each in-process effect-size comparison
    wanted = set(args.only.split(","))
    unknown = wanted - {"unchanged", "creep", "toolchain"}
    if unknown:
        parser.error(f"--only: unknown experiment(s) {', '.join(sorted(unknown))}")
    start = time.perf_counter()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="cudagate-release-drift-") as tmp:
        try:
            with HarnessClient(timeout_s=60) as probe:
                card = probe.start()["device"].get("uuid") or "unknown"
            gpu = True
        except WorkerUnavailable:
            gpu = False
        repo, approved_here = build_repo(Path(tmp), args.approve_runs, gpu)
        if not gpu:
            return without_gpu(repo)
        results["approved_here"] = approved_here
        # "Another machine than the one that approved" is checked, not assumed: the ledgers name their cards.
        shipped = {k: v for k, v in approving_cards(SUITES).items() if k not in approved_here}
        results["cards"] = {"measuring": card, "approving": shipped}
        print(f"repository ready in {time.perf_counter() - start:.0f} s; approved on this machine: "
              f"{', '.join(approved_here) or 'none'}\nmeasuring on card {card}; the shipped approvals' runs were "
              f"measured on {', '.join(sorted({c for v in shipped.values() for c in v})) or 'no shipped ledger'} "
              f"({'the same card' if any(card in v for v in shipped.values()) else 'other cards'})", flush=True)
        experiments = {"unchanged": lambda: unchanged(repo, args.runs, args.plain_runs),
                        "creep": lambda: creep(repo, args.runs, args.approve_runs, budget),
                        "toolchain": lambda: toolchain(repo, args.runs, args.approve_runs, budget)}
        for name, experiment in experiments.items():
            if name in wanted:
                results[name] = experiment()
                # Said after each experiment, so a run stopped at its time limit keeps what it measured.
                print(f"\n{name} done at {time.perf_counter() - start:.0f} s\n\n{table(results)}", flush=True)
                if args.json:
                    args.json.write_text(json.dumps(with_header(results, __file__), indent=1))
    print(f"\nthreshold: each suite's (2%); {time.perf_counter() - start:.0f} s wall in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
