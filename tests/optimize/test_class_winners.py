"""Per-class winners: the autotune proposer searches each shape class separately and composes one
source with per-class variants when that is faster; the evaluator times each class with its variant,
the gate judges what would ship, the pack says per case what was chosen and why, and ``--propose``
writes the suite's ``classes:`` (fake harness, no GPU)."""

from __future__ import annotations

import json
import math

import pytest

from fake_worker import FakeWorker
from optimize_fakes import (OPT_SUITE_YAML, ScriptedServer, answer, build_defines, committed_project, fake_source,
                            write_proposals)
from helpers import replace_once, write_suite
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.optimize.candidate import Candidate
from pytest_cudagate.optimize.evaluator import HarnessEvaluator
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Launch, Variant
from pytest_cudagate.worker.fingerprint import Fingerprint
from test_evaluator import kernel_from_source
from test_loop import assert_pack_valid, optimize

# perf is a small shape, perf2 a large one; the holdout case stays in the default class.
CLASS_YAML = replace_once(replace_once(
    OPT_SUITE_YAML,
    "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n",
    "  - {name: perf, kind: performance, class: small, scalars: {rows: 64, cols: 256}}\n"),
    "  - {name: perf2, kind: performance, scalars: {rows: 32, cols: 1000}}\n",
    "  - {name: perf2, kind: performance, class: large, scalars: {rows: 32, cols: 1000}}\n")
CLASS_OF = {"perf": "small", "perf2": "large", "hidden_77x300": "default", "small": "default"}


def landscape(table: dict[str, dict[int, float]]):
    """A fake timing model: µs per class and BLOCK value, for the build each case's class runs."""
    def latency(candidate, case: str) -> float:
        if not candidate.defines:
            return 0.020  # the initial kernel
        shape_class = CLASS_OF[case]
        timings = table.get(shape_class, table["large"])  # the holdout case times like a large one
        return timings[build_defines(candidate, shape_class)["BLOCK"]] / 1000
    return latency


# Small shapes want BLOCK=64, large ones BLOCK=512; over both, 512 is best (the shared default).
PER_CLASS = {"small": {128: 20.0, 64: 10.0, 256: 25.0, 512: 30.0},
             "large": {128: 40.0, 64: 80.0, 256: 30.0, 512: 20.0}}
# Every class ranks the points alike: one build serves both.
SHARED = {"small": {128: 20.0, 64: 15.0, 256: 12.0, 512: 18.0},
          "large": {128: 40.0, 64: 30.0, 256: 24.0, 512: 36.0}}


def run(tmp_path, table, *argv):
    suite = write_suite(tmp_path / "scale", yaml_text=CLASS_YAML)
    return optimize(tmp_path, suite, "--proposer", "autotune", "--batch", 4, *argv,
                    evaluator={"latency_fn": landscape(table)})


def test_the_search_picks_a_variant_for_the_class_that_gains_and_the_gate_judges_it(tmp_path):
    code, pack, summary, history, evaluator = run(tmp_path, PER_CLASS)
    assert code == 0
    best = summary["best"]
    assert best["defines"] == {"BLOCK": 512} and best["launch"]["block"] == ["512"]
    assert best["classes"] == {"small": {"options": ["-DBLOCK=64"],
                                         "launch": {"grid": ["rows"], "block": ["64"], "shared_bytes": "0"}}}
    assert math.isclose(best["geomean_ms"], math.sqrt(0.010 * 0.020))  # each class timed with its own build
    assert best["label"] == "per class: small BLOCK=64; large BLOCK=512"
    (gated,) = evaluator.validated
    assert gated.classes == {"small": Variant(("-DBLOCK=64",), Launch(("rows",), ("64",), "0"))}
    chosen = {c["case"]: c["chosen"] for c in best["cases"]}
    assert chosen["perf"]["build"] == "variant" and chosen["perf"]["options"] == ["-DBLOCK=64"]
    assert chosen["perf"]["launch"] == {"grid": [64, 1, 1], "block": [64, 1, 1], "shared_bytes": 0}
    assert chosen["perf"]["why"] == (
        "class small: BLOCK=64 (10.00 µs geomean over its 1 visible performance case(s), 3.00× faster there than "
        "the shared default BLOCK=512); best of 4 measured points in the class")
    assert chosen["perf2"]["build"] == "shared" and chosen["perf2"]["defines"] == {"BLOCK": 512}
    assert chosen["perf2"]["why"].startswith("shared default: BLOCK=512 (best geomean over every class")
    assert chosen["hidden_77x300"]["why"] == "shared default (class default has no variant)"
    assert chosen["hidden_77x300"]["launch"]["block"] == [512, 1, 1]
    text = (pack / "best.cu").read_text()
    assert "#ifndef BLOCK\n#define BLOCK 512\n#endif" in text  # the variant's -DBLOCK=64 overrides it
    assert summary["proposer"]["classes"] == {"small": ["perf"], "large": ["perf2"]}
    assert summary["rounds"] <= 7
    assert_pack_valid(pack)
    report = (pack / "report.html").read_text()
    assert "class small variant" in report and "best of 4 measured points in the class" in report


def test_one_build_when_no_class_gains_from_its_own(tmp_path):
    code, pack, summary, history, evaluator = run(tmp_path, SHARED)
    assert code == 0
    best = summary["best"]
    assert best["defines"] == {"BLOCK": 256} and "classes" not in best
    assert not any(a["candidate"] and a["candidate"].get("classes") for a in history["attempts"])
    assert {c["chosen"]["why"] for c in best["cases"]} == {"one build for every case (BLOCK=256)"}
    assert_pack_valid(pack)


def test_the_search_splits_each_round_between_the_classes(tmp_path):
    """Round 2 plans from each class's own elite: the small class's best (BLOCK=64) and the large
    class's (BLOCK=512) are both kept, though 64 is the worst point over both classes together."""
    code, pack, summary, history, evaluator = run(tmp_path, PER_CLASS, "--max-iterations", 2)
    assert code == 0
    measured = {a["candidate"]["defines"].get("BLOCK") for a in history["attempts"][1:] if a["candidate"]}
    assert {64, 512} <= measured


def test_propose_writes_the_classes_into_the_suite(tmp_path):
    git = pytest.importorskip("git")
    repo = committed_project(tmp_path / "project", git)
    suite = tmp_path / "project" / "kernels" / "scale" / "cudagate.yaml"
    suite.write_text(CLASS_YAML)
    repo.git.add(all=True)
    repo.index.commit("classes")
    code, pack, summary, history, _ = optimize(tmp_path, suite, "--proposer", "autotune", "--batch", 4, "--propose",
                                               evaluator={"latency_fn": landscape(PER_CLASS)})
    assert code == 0
    commit = repo.heads[f"cudagate/optimize-scale-scale2-{pack.name}"].commit
    yaml_text = (commit.tree / "kernels/scale/cudagate.yaml").data_stream.read().decode()
    assert ('    classes:\n      small: {options: ["-DBLOCK=64"], launch: {grid: ["rows"], block: ["64"]}}\n'
            in yaml_text)
    assert "# a comment the --propose rewrite must keep" in yaml_text
    assert "Class small runs a variant: options -DBLOCK=64, launch grid ['rows'] block ['64']." in commit.message
    assert "cudagate sign kernels/scale/cudagate.yaml" in commit.message  # a variant's launch is signed
    checkout = tmp_path / "checkout"
    repo.git.worktree("add", str(checkout), commit.hexsha)
    proposed = load_suite(checkout / "kernels" / "scale" / "cudagate.yaml").kernel("scale2")
    assert proposed.classes == {"small": Variant(("-DBLOCK=64",), Launch(("rows",), ("64",), "0"))}
    assert proposed.launch.block == ("512",)


def test_a_replay_of_a_per_class_pack_builds_and_launches_what_was_recorded(tmp_path):
    first = run(tmp_path, PER_CLASS)
    suite = write_suite(tmp_path / "scale", yaml_text=CLASS_YAML)
    again = optimize(tmp_path, suite, "--proposer", f"replay:{first[1]}")
    recorded = [(a["candidate"]["source_sha256"], a["candidate"]["launch"], a["candidate"].get("classes"))
                for a in first[3]["attempts"] if a["round"] >= 1]
    replayed = [(a["candidate"]["source_sha256"], a["candidate"]["launch"], a["candidate"].get("classes"))
                for a in again[3]["attempts"] if a["round"] >= 1]
    assert replayed == recorded and any(classes for _, _, classes in replayed)


def test_a_replayed_pack_keeps_the_rules_its_attempts_were_searched_under(tmp_path):
    """The suite's own template behind the autotune header may include what the suite's file includes;
    any other text is held to a proposer's rules, and an edited attempt is refused."""
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=CLASS_YAML))
    program = suite.kernel("scale2")
    tuned = Candidate(source=program.source.read_text(), launch=program.launch, defines={"BLOCK": 64}, origin="autotune")
    replayed = Candidate(source=tuned.text, launch=program.launch, origin="replay")
    assert replayed.is_own_source(program)
    assert not Candidate(source=tuned.text.replace("BLOCK 64", "BLOCK 64\n#include <x>"), launch=program.launch,
                         origin="replay").is_own_source(program)
    assert not Candidate(source="// mine\n" + program.source.read_text(), launch=program.launch,
                         origin="replay").is_own_source(program)
    pack = run(tmp_path / "first", PER_CLASS)[1]
    history = json.loads((pack / "history.json").read_text())
    history["attempts"][1]["candidate"]["source"] += "\n// edited\n"
    (pack / "history.json").write_text(json.dumps(history))
    with pytest.raises(CudagateError, match="attempt 1: its source does not match its recorded source_sha256"):
        optimize(tmp_path / "again", write_suite(tmp_path / "again" / "scale", yaml_text=CLASS_YAML),
                 "--proposer", f"replay:{pack}")


def test_a_class_named_twice_in_a_proposal_file_is_refused(tmp_path):
    suite = write_suite(tmp_path / "scale", yaml_text=CLASS_YAML)
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    doc = (props / "01.json").read_text()
    (props / "01.json").write_text(doc[:-1] + ', "classes": {"small": {"options": []}, "small": {"options": ["-DBLOCK=64"]}}}')
    with pytest.raises(CudagateError, match=r"01\.json:\n  - cannot read the proposal file: not valid JSON: key 'small' appears twice in one object"):
        optimize(tmp_path, suite, "--proposer", f"replay:{props}")


def test_a_proposal_file_may_carry_class_variants(tmp_path):
    suite = write_suite(tmp_path / "scale", yaml_text=CLASS_YAML)
    small = {"options": ["-DBLOCK=64"], "launch": {"grid": ["rows"], "block": ["64"]}}
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010", "label": "per class", "classes": {"small": small}},
                                                 {"marker": "latency=0.012", "label": "unknown class",
                                                  "classes": {"huge": {"options": ["-DBLOCK=64"]}}}])
    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", f"replay:{props}")
    attempts = {a["label"]: a for a in history["attempts"]}
    assert attempts["per class"]["status"] == "passed"
    assert attempts["per class"]["candidate"]["classes"] == {"small": {**small, "launch": {**small["launch"], "shared_bytes": "0"}}}
    assert evaluator.validated[0].classes == {"small": Variant(("-DBLOCK=64",), Launch(("rows",), ("64",), "0"))}
    unknown = attempts["unknown class"]
    assert unknown["status"] == "rejected" and "classes names 'huge', which is not a class of the cases" in unknown["rejection"]


@pytest.mark.parametrize("variant, message", [
    ({"options": ["-I/etc"]}, "classes[small].options: '-I/etc' is not a macro definition"),
    ({"options": [" -I/usr/include"]}, "classes[small].options: ' -I/usr/include' is not a macro definition"),
    ({"options": ["-use_fast_math"]}, "a variant sets macros only, as -DNAME or -DNAME=value"),
    ({"options": ["-DBLOCK=64 "]}, "classes[small].options: option '-DBLOCK=64 ' is not allowed: an option may not "
                                   "start or end with whitespace"),
    ({"options": ["-DBLOCK=64"] * 33}, "classes[small].options: 33 options; at most 32"),
    ({"options": "-DBLOCK=64"}, "classes[small].options: expected a list of strings"),
    ({"options": [], "launch": {"grid": "rows"}}, "classes[small].launch.grid: expected a list of 1 to 3"),
])
def test_a_bad_class_variant_in_a_proposal_names_the_file_and_the_field(tmp_path, variant, message):
    suite = write_suite(tmp_path / "scale", yaml_text=CLASS_YAML)
    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010", "classes": {"small": variant}}])
    with pytest.raises(CudagateError) as info:
        optimize(tmp_path, suite, "--proposer", f"replay:{props}")
    assert str(props / "01") in str(info.value) and message in str(info.value)


def test_the_openai_proposer_sees_the_classes_and_may_answer_with_variants(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    suite = write_suite(tmp_path / "scale", yaml_text=CLASS_YAML)
    small = {"class": "small", "options": ["-DBLOCK=64"], "grid": ["rows"], "block": ["64"], "shared_bytes": "0"}
    script = [answer(fake_source("latency=0.012"), title="twice", variants=[small, small]),
              answer(fake_source("latency=0.010"), title="per class", variants=[small])]
    with ScriptedServer(script) as server:
        code, pack, summary, history, evaluator = optimize(
            tmp_path, suite, "--proposer", "openai", "--base-url", server.url, "--max-iterations", 1,
            sleep=lambda s: None)
    assert code == 0
    system, first = (m["content"] for m in server.requests[0]["messages"][:2])
    assert "the cases fall into classes (default, small, large)" in system and "class_variants" in system
    assert "- perf: performance, class small, rows=64" in first and "hidden" in first
    assert "hidden_77x300" not in system + first
    assert "class 'small' has more than one entry" in server.requests[1]["messages"][-1]["content"]
    assert summary["best"]["label"] == "per class"
    assert evaluator.validated[0].classes == {"small": Variant(("-DBLOCK=64",), Launch(("rows",), ("64",), "0"))}
    assert_pack_valid(pack)


# The suite itself gives the holdout case a class of its own with a variant, and a launch override.
HIDDEN_CLASS_YAML = replace_once(replace_once(
    CLASS_YAML,
    "  - {name: hidden_77x300, kind: performance, holdout: true, scalars: {rows: 77, cols: 300}}\n",
    "  - {name: hidden_77x300, kind: performance, holdout: true, class: xl, scalars: {rows: 77, cols: 300}}\n"),
    "    tunables: {BLOCK: [128, 64, 256, 512]}\n",
    "    tunables: {BLOCK: [128, 64, 256, 512]}\n"
    "    launch_overrides: {hidden_77x300: {grid: [rows], block: [64]}}\n"
    "    classes: {xl: {options: [-DBLOCK=256], launch: {grid: [rows], block: [256]}}}\n")


def test_the_suites_own_entries_for_hidden_cases_pass_and_never_reach_the_model(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    suite = write_suite(tmp_path / "scale", yaml_text=HIDDEN_CLASS_YAML)
    with ScriptedServer([answer(fake_source("latency=0.010"), title="faster")]) as server:
        code, pack, summary, history, evaluator = optimize(
            tmp_path, suite, "--proposer", "openai", "--base-url", server.url, "--max-iterations", 1,
            sleep=lambda s: None)
    initial = history["attempts"][0]
    assert initial["status"] == "passed", initial["rejection"]  # the suite's own hidden entries are not the proposer's
    assert initial["candidate"]["classes"]["xl"]["options"] == ["-DBLOCK=256"]
    prompt = json.dumps(server.requests[0]["messages"])
    assert "hidden_77x300" not in prompt and "xl" not in prompt and "-DBLOCK=256" not in prompt
    assert code == 0 and summary["best"]["label"] == "faster"


def test_a_proposer_may_not_add_an_entry_for_a_hidden_class_or_case(tmp_path):
    suite = write_suite(tmp_path / "scale", yaml_text=HIDDEN_CLASS_YAML)
    props = write_proposals(tmp_path / "props", [
        {"marker": "latency=0.010", "label": "changes xl", "classes": {"xl": {"options": ["-DBLOCK=512"]}}},
        {"marker": "latency=0.010", "label": "changes the override",
         "launch_overrides": {"hidden_77x300": {"grid": ["rows"], "block": ["512"]}}}])
    attempts = {a["label"]: a for a in optimize(tmp_path, suite, "--proposer", f"replay:{props}")[3]["attempts"]}
    assert "classes names 'xl', which is not a class of the cases" in attempts["changes xl"]["rejection"]
    assert "launch_overrides names 'hidden_77x300'" in attempts["changes the override"]["rejection"]


def test_the_evaluator_times_each_class_with_its_variant(tmp_path):
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=CLASS_YAML))
    program = suite.kernel("scale2")
    ledger = Ledger.for_suite(suite)
    ledger.approvals[program.name] = approval_for(ledger, program, approved_by="test", approved_at="now", git={},
                                                  tool_version="0")
    client = FakeWorker(kernel_from_source)
    evaluator = HarnessEvaluator(suite, program, ledger, client, Fingerprint.from_hello(client.start()),
                                 gate_options=GateOptions(budget_s=0.5, fresh_seed=7), work_dir=tmp_path / "work")
    source = program.source.read_text()
    candidate = Candidate(source, Launch(("rows",), ("512",), "0"), defines={"BLOCK": 512}, origin="autotune",
                          classes={"small": Variant(("-DBLOCK=64",), Launch(("rows",), ("64",), "0"))})
    assert evaluator.evaluate(candidate).passed
    timed = {r["case"]["name"]: (r["kernels"]["current"]["options"], r["launches"]["current"]["block"][0])
             for r in client.requests if r["op"] == "compare"}
    assert timed == {"perf": (["-DBLOCK=64"], 64), "perf2": ([], 512)}
    client.requests.clear()
    assert evaluator.validate(candidate).passed  # the gate: every case, holdout included, as it would ship
    gated = {r["case"]["name"]: r["kernels"]["current"]["options"] for r in client.requests if r["op"] == "compare"}
    assert gated == {"perf": ["-DBLOCK=64"], "perf2": [], "hidden_77x300": []}
    broken = Candidate(source, candidate.launch, defines={"BLOCK": 512}, origin="autotune",
                       classes={"small": Variant(("-DBLOCK=64", "-Dx=1"), None)})
    result = evaluator.compile(broken)
    assert not result["ok"] and result["log"].startswith("scale2 (variant of class small: options ['-DBLOCK=64', '-Dx=1']):")
