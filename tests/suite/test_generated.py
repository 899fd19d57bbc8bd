"""Shape classes and generated cases: `class:` and `generated: true` in a suite, `cudagate cases generate`
writing digests and a sample, the gate rebuilding and verifying the arrays (fake worker), the signature
over them, and `--cuda-gate-class` / `-k` selection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fake_worker import FakeWorker, install, scale_kernels
from helpers import EXAMPLES, KERNEL_CU, SUITE_YAML, replace_once, write_suite
from pytest_cudagate.boundary import schema
from pytest_cudagate.cli import main
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.errors import FileError
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.optimize.candidate import Candidate
from pytest_cudagate.optimize.evaluator import HarnessEvaluator
from pytest_cudagate.suite.cases import check_case_data, draw_inputs, case_seed
from pytest_cudagate.suite import generated, generated_cache
from pytest_cudagate.suite.generated import SAMPLE_SIZE, array_sha256, sample_indices
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust.manifest import suite_manifest
from pytest_cudagate.worker.fingerprint import Fingerprint
from trust_project import clean_env, project  # noqa: F401 (fixtures)

pytest_plugins = ["pytester"]

# `scale` with classes and a generated case of 64 × 200 = 12800 elements (more than the sample holds).
CLASSED_YAML = replace_once(
    SUITE_YAML, "  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}\n",
    "  - {name: perf, kind: performance, class: small, scalars: {rows: 64, cols: 256}}\n"
    "  - {name: big, kind: performance, class: large, generated: true, scalars: {rows: 64, cols: 200}}\n")


def classed_suite(folder: Path) -> Path:
    return write_suite(folder, yaml_text=CLASSED_YAML)


def outcomes(result) -> dict:
    return {k: v for k, v in result.parseoutcomes().items() if k in ("passed", "failed", "skipped", "deselected")}


def reports_by_case(run) -> dict:
    return {r.nodeid.rsplit("::", 1)[-1]: r for r in run.getreports("pytest_runtest_logreport") if r.when == "call"}


# -- the suite file -------------------------------------------------------------------------------


def test_class_and_generated_load_with_their_defaults(tmp_path):
    suite = load_suite(classed_suite(tmp_path / "s"))
    assert [(c.name, c.shape_class, c.generated) for c in suite.cases] == [
        ("small", "default", False), ("perf", "small", False), ("big", "large", True)]


def test_a_bad_class_names_the_file_the_field_and_the_fix(tmp_path):
    text = replace_once(CLASSED_YAML, "class: large", "class: 'very large'")
    with pytest.raises(FileError) as info:
        load_suite(write_suite(tmp_path / "s", yaml_text=text, data=False))
    message = str(info.value)
    assert "cudagate.yaml" in message and "line 19: cases[2].class: 'very large' is not a class name" in message
    assert "write one word of letters, digits" in message


def test_a_suite_signed_before_classes_keeps_its_manifest():
    manifest = suite_manifest(load_suite(EXAMPLES / "softmax" / "cudagate.yaml"))
    signed = json.loads((EXAMPLES / "softmax" / "cudagate.sig.json").read_text())["manifest"]
    assert manifest == signed
    assert all("class" not in c and "generated" not in c for c in manifest["cases"].values())


# -- cudagate cases generate ----------------------------------------------------------------------


def test_cases_generate_writes_digests_and_a_sample_never_the_arrays(tmp_path, capsys):
    path = classed_suite(tmp_path / "s")
    assert main(["cases", "generate", str(path), "--case", "big"]) == 0
    assert "(generated.json and the output sample; the arrays are drawn at run time)" in capsys.readouterr().out
    folder = path.parent / "cases" / "big"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "generated.json", "sample/y.npy"]
    record = json.loads((folder / "generated.json").read_text())
    assert schema.problems(record, "generated-case") == []
    suite = load_suite(path)
    case = suite.case("big")
    x = draw_inputs(suite, case, case_seed(suite, case))["x"]
    assert record["seed"] == case_seed(suite, case) and record["inputs"]["x"]["sha256"] == array_sha256(x)
    assert record["inputs"]["x"]["shape"] == [64, 200] and record["sample"]["y"]["count"] == SAMPLE_SIZE
    indices = sample_indices(record["seed"], "y", x.size)
    assert len(set(indices.tolist())) == SAMPLE_SIZE
    np.testing.assert_array_equal(np.load(folder / "sample" / "y.npy"), (2 * x.astype(np.float64)).astype(np.float32).reshape(-1)[indices])
    assert check_case_data(suite, case) == []
    files = suite_manifest(suite)["cases"]["big"]["files"]
    assert sorted(files) == ["cases/big/generated.json", "cases/big/sample/y.npy"]


def test_a_damaged_generated_json_is_a_case_data_problem(tmp_path, capsys):
    path = classed_suite(tmp_path / "s")
    record = path.parent / "cases" / "big" / "generated.json"
    data = json.loads(record.read_text())
    data["inputs"]["x"]["shape"] = [200, 64]
    record.write_text(json.dumps(data))
    assert main(["check", str(path), "--allow-unsigned"]) == 2
    out = capsys.readouterr().out
    assert ("cases/big/generated.json: inputs.x: float32 [200, 64], but the signature says float32 [64, 200] in case "
            "'big'; re-run `cudagate cases generate") in out
    record.write_bytes(b"[" * 100_000)
    assert main(["check", str(path), "--allow-unsigned"]) == 2
    assert "over the 65536-byte limit" in capsys.readouterr().out


# -- the signature --------------------------------------------------------------------------------


def test_a_tampered_generated_json_is_refused_by_the_signature_check(project):
    project.edit(lambda raw: raw["cases"].append(
        {"name": "large_512x512", "kind": "performance", "class": "large", "generated": True,
         "scalars": {"rows": 512, "cols": 512}}))
    assert main(["cases", "generate", str(project.suite_file), "--case", "large_512x512"]) == 0
    project.sign()
    assert project.verify().ok
    record = project.suite_dir / "cases" / "large_512x512" / "generated.json"
    data = json.loads(record.read_text())
    data["inputs"]["x"]["sha256"] = "0" * 64  # e.g. to match inputs a kernel was fitted to
    record.write_text(json.dumps(data))
    result = project.verify()
    assert not result.ok
    assert any("cases/large_512x512/generated.json: sha256 changed" in p for p in result.problems), result.problems


# -- the gate (fake worker) -----------------------------------------------------------------------


def test_the_gate_rebuilds_a_generated_case_and_judges_it(pytester, monkeypatch):
    path = classed_suite(pytester.path / "s")
    install(monkeypatch, pytester.path, scale_kernels())
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent),
                              "--cuda-gate-report", str(pytester.path / "report"), "-p", "no:cacheprovider")
    calls = reports_by_case(run)
    assert sorted(calls) == ["big", "compile", "perf", "small"] and all(r.passed for r in calls.values())
    items = {i["case"]: i for i in json.loads((pytester.path / "report" / "report.json").read_text())["items"]}
    assert {name: item["class"] for name, item in items.items()} == {"small": "default", "perf": "small", "big": "large"}
    assert items["big"]["correctness"]["passed"]
    # its arrays last only the run, so no saved request points at them; the gate draws them again
    assert items["big"]["requests"] == [] and items["big"]["reproduce"] == [f"pytest --cuda-gate '{items['big']['nodeid']}'"]
    assert items["perf"]["requests"] and all((pytester.path / "report" / r).is_file() for r in items["perf"]["requests"])
    # the arrays went to the run's folder, never beside the suite
    assert sorted(p.name for p in (path.parent / "cases" / "big").iterdir()) == ["generated.json", "sample"]
    assert "large" in (pytester.path / "report" / "report.html").read_text()


def test_a_drawn_input_that_does_not_match_its_digest_fails_the_case(pytester, monkeypatch):
    path = classed_suite(pytester.path / "s")
    record = path.parent / "cases" / "big" / "generated.json"
    data = json.loads(record.read_text())
    data["inputs"]["x"]["sha256"] = "f" * 64
    record.write_text(json.dumps(data))
    install(monkeypatch, pytester.path, scale_kernels())
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent), "-p", "no:cacheprovider")
    calls = reports_by_case(run)
    assert calls["big"].failed and calls["perf"].passed
    assert ("generated case big: input 'x' drawn from seed" in calls["big"].longreprtext
            and "signs ffffffffffffffff…: numpy's generator changed or the case was edited; re-run `cudagate cases "
                "generate" in calls["big"].longreprtext and "--case big` and re-sign" in calls["big"].longreprtext)


def test_a_reference_that_disagrees_with_the_signed_sample_fails_the_case(pytester, monkeypatch):
    path = classed_suite(pytester.path / "s")
    suite = load_suite(path)
    changed = int(sample_indices(case_seed(suite, suite.case("big")), "y", 64 * 200)[100])  # a sampled element
    reference = path.parent / "reference.py"
    reference.write_text(replace_once(reference.read_text(), "* 2)",
                                      f"* 2 + (np.arange(rows * cols).reshape(rows, cols) == {changed}))"))
    install(monkeypatch, pytester.path, scale_kernels())
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent), "-p", "no:cacheprovider")
    report = reports_by_case(run)["big"]
    assert report.failed
    assert ("generated case big: the reference's output 'y' disagrees with the signed sample at 1 of 4096 sampled "
            f"indices; worst at index {list(divmod(changed, 200))}") in report.longreprtext
    assert "the reference changed behaviour or is nondeterministic" in report.longreprtext


# -- selection ------------------------------------------------------------------------------------


def collected(pytester, *args) -> list[str]:
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "--collect-only", "-q", *args)
    return [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]


@pytest.mark.parametrize("args, ids", [
    ((), ["scale2::compile", "scale2::small", "scale2::perf", "scale2::big"]),
    (("--cuda-gate-class", "large"), ["scale2::compile", "scale2::small", "scale2::big"]),
    (("--cuda-gate-class", "small"), ["scale2::compile", "scale2::small", "scale2::perf"]),
    (("--cuda-gate-class", "small", "--cuda-gate-class", "large"),
     ["scale2::compile", "scale2::small", "scale2::perf", "scale2::big"]),
    (("-k", "large"), ["scale2::big"]),
])
def test_cuda_gate_class_keeps_compile_items_and_correctness_cases(pytester, args, ids):
    write_suite(pytester.path, yaml_text=CLASSED_YAML, data=False)
    assert collected(pytester, *args) == ids


def test_an_unknown_class_is_a_usage_error(pytester):
    write_suite(pytester.path, yaml_text=CLASSED_YAML, data=False)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-class", "larg")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cuda-gate-class larg: no collected performance case has that class "
                                 "(classes: large, small)*"])


def test_a_class_held_by_correctness_cases_alone_is_a_usage_error(pytester):
    # `default` is the correctness case's class: selecting it would run no timed case at all
    write_suite(pytester.path, yaml_text=CLASSED_YAML, data=False)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-class", "default")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cuda-gate-class default: no collected performance case has that class*"])


def test_the_report_records_the_class_selection_and_what_it_left_out(pytester, monkeypatch):
    path = classed_suite(pytester.path / "s")
    install(monkeypatch, pytester.path, scale_kernels())
    report = pytester.path / "report"
    pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent), "--cuda-gate-class", "small",
                        "--cuda-gate-report", str(report), "-p", "no:cacheprovider")
    document = json.loads((report / "report.json").read_text())
    assert schema.problems(document, "report") == []
    options = document["runs"][0]["options"]
    assert options["classes"] == ["small"]
    assert [nodeid.rsplit("::", 1)[-1] for nodeid in options["deselected_by_class"]] == ["big"]
    assert "big" not in {item["case"] for item in document["items"]}


def test_the_terminal_table_shows_the_class(pytester):
    write_suite(pytester.path, yaml_text=CLASSED_YAML)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned")
    result.stdout.fnmatch_lines(["*suite*kernel*case*kind*class*result*"])
    result.stdout.fnmatch_lines(["*scale*scale2*big*performance*large*skipped*"])


def test_the_optimizer_rebuilds_a_generated_case_once_for_every_candidate(tmp_path):
    suite = load_suite(classed_suite(tmp_path / "s"))
    program = suite.kernel("scale2")
    client = FakeWorker(scale_kernels())
    evaluator = HarnessEvaluator(suite, program, Ledger.for_suite(suite), client, Fingerprint.from_hello(client.start()),
                                 gate_options=GateOptions(budget_s=0.2, fresh_seed=7), work_dir=tmp_path / "work")
    assert suite.arrays_dir(suite.case("big")) == tmp_path / "work" / "generated" / "big"
    evaluation = evaluator.evaluate(Candidate.initial(program))
    assert evaluation.passed and evaluation.case("big").latency_ms is not None


def test_the_optimizer_pack_replays_the_winner_on_stored_cases_only(tmp_path):
    """A generated case's arrays live only as long as the optimize run: its pack has no replay request that
    would point at them (the gate draws them again), and every request it does have resolves."""
    from optimize_fakes import write_proposals
    from test_loop import assert_pack_valid, optimize

    props = write_proposals(tmp_path / "props", [{"marker": "latency=0.010", "label": "fast"}])
    code, pack, summary, _, _ = optimize(tmp_path, classed_suite(tmp_path / "s"), "--proposer", f"replay:{props}")
    assert code == 0 and summary["best"]["label"] == "fast"
    assert summary["best_case_files"] == {"best-case-1.json": "small", "best-case-2.json": "perf"}
    assert not (pack / "best-case-3.json").exists()
    assert_pack_valid(pack)


# -- the per-user cache of generated cases' inputs ------------------------------------------------

# The reference logs the SHA-256 of every input it is given: the gate runs it on the generated
# case's inputs in every run, cached or drawn (only the inputs are cached).
LOGGING_REFERENCE = """\
import hashlib
import os

import numpy as np


def scale_rows(x, rows, cols):
    with open(os.environ["REFERENCE_LOG"], "a") as log:
        log.write(hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest() + "\\n")
    return (x.astype(np.float64).reshape(rows, cols) * 2).astype(np.float32)
"""


@pytest.fixture
def cached_suite(pytester, monkeypatch):
    """The classed suite with a logging reference, its own generated-case cache and the fake worker;
    returns (suite path, run the gate -> report.json items, was the big case drawn in the last run,
    did the reference run on its inputs in the last run)."""
    path = classed_suite(pytester.path / "s")
    (path.parent / "reference.py").write_text(LOGGING_REFERENCE)
    log = pytester.path / "reference.log"
    monkeypatch.setenv("REFERENCE_LOG", str(log))
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "cache"))
    install(monkeypatch, pytester.path, scale_kernels())
    drawn_sha = json.loads((path.parent / "cases" / "big" / "generated.json").read_text())["inputs"]["x"]["sha256"]
    draws: list[str] = []
    real_draw = generated.draw_inputs
    monkeypatch.setattr(generated, "draw_inputs", lambda suite, case, seed: draws.append(case.name) or
                        real_draw(suite, case, seed))
    runs = []

    def gate() -> dict:
        log.write_text("")
        draws.clear()
        report = pytester.path / f"report-{len(runs)}"
        run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent),
                                  "--cuda-gate-report", str(report), "-p", "no:cacheprovider")
        runs.append(run)
        assert all(r.passed for r in reports_by_case(run).values())
        return {i["case"]: i for i in json.loads((report / "report.json").read_text())["items"]}

    def drawn() -> bool:
        return "big" in draws

    def referenced() -> bool:
        return drawn_sha in log.read_text().split()

    return path, gate, drawn, referenced


def cache_entries(pytester) -> list[Path]:
    return sorted(p for p in (pytester.path / "cache" / "generated").iterdir() if not p.name.startswith("."))


def test_a_warm_run_takes_the_generated_inputs_from_the_cache_and_still_runs_the_reference(cached_suite, pytester):
    path, gate, drawn, referenced = cached_suite
    first = gate()
    assert drawn() and referenced() and len(cache_entries(pytester)) == 1
    second = gate()
    assert not drawn() and referenced()  # inputs from the cache; the oracle computed again
    assert second["big"]["correctness"]["passed"] and first["big"]["notes"] == second["big"]["notes"]
    entry = cache_entries(pytester)[0]
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()) == ["entry.json", "x.npy"]
    assert schema.problems(json.loads((entry / "entry.json").read_text()), "generated-cache-entry") == []


def test_expected_outputs_planted_in_the_cache_are_never_used(cached_suite, pytester):
    # Someone able to write the cache as this user plants an oracle that a wrong kernel would match
    # (y = 2x + 1); the gate must judge the honest kernel against the reference's y = 2x and pass it.
    path, gate, drawn, referenced = cached_suite
    gate()
    entry = cache_entries(pytester)[0]
    x = np.load(entry / "x.npy")
    (entry / "expected").mkdir()
    np.save(entry / "expected" / "y.npy", (x.astype(np.float64) * 2 + 1).astype(np.float32))
    items = gate()
    assert not drawn() and referenced() and items["big"]["correctness"]["passed"]


def corrupt_input(entry: Path) -> None:
    data = bytearray((entry / "x.npy").read_bytes())
    data[-1] ^= 1  # one bit of the last element
    (entry / "x.npy").write_bytes(bytes(data))


def corrupt_record(entry: Path) -> None:
    (entry / "entry.json").write_text("{not json")


def remove_input(entry: Path) -> None:
    (entry / "x.npy").unlink()


@pytest.mark.parametrize("corrupt, noted", [
    (corrupt_input, "input 'x' does not match its signed sha256"),
    (corrupt_record, None),  # unreadable: not an entry at all, so a plain miss
    (remove_input, "No such file or directory"),
], ids=["input", "record", "missing-file"])
def test_a_corrupt_cache_entry_is_drawn_again_never_trusted(cached_suite, pytester, corrupt, noted):
    path, gate, drawn, referenced = cached_suite
    gate()
    entry = cache_entries(pytester)[0]
    good = {p.relative_to(entry): p.read_bytes() for p in entry.rglob("*.npy")}
    corrupt(entry)
    items = gate()
    assert drawn() and referenced() and items["big"]["correctness"]["passed"]
    notes = [n for n in items["big"]["notes"] if "cached inputs" in n]
    if noted:
        assert len(notes) == 1 and noted in notes[0] and "were discarded; they were drawn again" in notes[0]
    else:
        assert notes == []
    assert cache_entries(pytester) == [entry]  # entered again, sound
    assert {p.relative_to(entry): p.read_bytes() for p in entry.rglob("*.npy")} == good
    gate()
    assert not drawn()


def test_a_changed_generated_json_misses_the_cache_and_a_changed_reference_still_runs(cached_suite, pytester):
    path, gate, drawn, referenced = cached_suite
    gate()
    record = path.parent / "cases" / "big" / "generated.json"
    record.write_text(record.read_text().replace('"seed"', '"note": "re-signed", "seed"'))
    gate()
    assert drawn() and len(cache_entries(pytester)) == 2
    reference = path.parent / "reference.py"
    reference.write_text(reference.read_text() + "# reviewed\n")
    gate()
    assert not drawn() and referenced() and len(cache_entries(pytester)) == 2  # the inputs do not depend on it


def test_the_cache_stays_within_its_bound(cached_suite, pytester, monkeypatch):
    monkeypatch.setattr(generated_cache, "MAX_BYTES", 1)  # room for the entry just written only
    path, gate, drawn, referenced = cached_suite
    gate()
    (first,) = cache_entries(pytester)
    record = path.parent / "cases" / "big" / "generated.json"
    record.write_text(record.read_text().replace('"seed"', '"note": "re-signed", "seed"'))
    gate()
    assert drawn() and len(cache_entries(pytester)) == 1 and cache_entries(pytester) != [first]


def test_a_cuda_reference_runs_on_every_run_with_cached_inputs(pytester, monkeypatch):
    # The sample of `y = 2x` is the same from the Python reference and from a CUDA one doing the same.
    path = classed_suite(pytester.path / "s")
    (path.parent / "ref.cu").write_text(KERNEL_CU.replace("scale2", "scale_ref"))
    path.write_text(replace_once(path.read_text(), "  python: reference.py:scale_rows\n",
                                 "  source: ref.cu\n  entry: scale_ref\n  launch: {grid: [rows], block: [128]}\n"))
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(pytester.path / "cache"))
    workers = install(monkeypatch, pytester.path, {**scale_kernels(), **scale_kernels(entry="scale_ref")})

    def rebuilds() -> int:
        """Runs of the reference with every check (a generated case's rebuild; fresh sets run it plainly)."""
        run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent), "-p", "no:cacheprovider")
        assert all(r.passed for r in reports_by_case(run).values())
        requests = [r for w in workers for r in w.requests if r["kernel"]["entry"] == "scale_ref"]
        workers.clear()
        assert any(r.get("checks", {}).get("guards") is False for r in requests)  # the fresh sets' reference
        return sum(1 for r in requests if r.get("checks", {}).get("guards") is not False)

    assert rebuilds() == 1
    assert rebuilds() == 1
