"""Fresh inputs prepared ahead (defences/fresh_ahead.py): while one case runs, the next case's sets
are prepared in the background, and an item finds exactly the sets, notes and failures it would
have drawn itself; a session that ends with a job in flight ends."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
from pathlib import Path

import pytest

from fake_worker import FakeKernel, FakeWorker, install, scale_kernels, scale_xy
from helpers import SUITE_YAML, replace_once, write_suite
from test_generated import cache_entries, cached_suite, classed_suite, corrupt_input, reports_by_case  # noqa: F401
from test_hardening_gate import Fingerprint, kernels_for
from pytest_cudagate.gate import lookahead, prepare as prepare_module
from pytest_cudagate import items as items_module
from pytest_cudagate import xdist_hooks
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.defences import fresh_ahead, fresh_inputs
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.loader import load_suite

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _any_host_draws_ahead(monkeypatch):
    """These tests run on 2-core CI machines, where the gate would not draw ahead at all."""
    monkeypatch.setattr(lookahead, "PREFETCH_CORES", 1)

MORE_CASES = ("  - {name: wide, kind: correctness, scalars: {rows: 5, cols: 700}}\n"
              "  - {name: big, kind: performance, generated: true, scalars: {rows: 64, cols: 200}}\n"
              "checks: {sanitizer: off}\n")
# Refuses the perf case's adversarial values: a skipped set and its note, on that case alone.
PICKY_REFERENCE = """\
import numpy as np


def scale_rows(x, rows, cols):
    if rows == 64 and cols == 256 and np.abs(x).max() > 100:
        raise ValueError("out of domain")
    return (x.astype(np.float64).reshape(rows, cols) * 2).astype(np.float32)
"""
PYTHON_YAML = SUITE_YAML + MORE_CASES
DRAWN_YAML = replace_once(PYTHON_YAML, "tolerance:", "inputs:\n  x: {distribution: normal, mean: 0.5, std: 2}\ntolerance:")
CUDA_YAML = replace_once(DRAWN_YAML, "  python: reference.py:scale_rows\n",
                         "  source: scale.cu\n  entry: scale2\n  launch: {grid: [rows], block: [128]}\n")


def suite_at(folder: Path, yaml_text: str) -> Path:
    cuda = "entry: scale2\n  launch" in yaml_text
    path = write_suite(folder, yaml_text=yaml_text, data=False)
    (folder / "reference.py").write_text(PICKY_REFERENCE)
    suite = load_suite(path)
    generate(suite, client=FakeWorker(kernels_for(suite)) if cuda else None)
    return path


def fresh_sent(client: FakeWorker) -> dict[str, list[tuple]]:
    """Per case, every fresh set the kernel was given: label, description, atol scale, file bytes."""
    sent = {}
    for request in client.requests:
        for entry in request.get("cases", []) + ([request["case"]] if "case" in request else []):
            if "fresh" in entry:
                sent[entry["name"]] = [(f["label"], f["description"], f["atol_scale"],
                                        {n: Path(p).read_bytes() for n, p in sorted(f["inputs"].items())},
                                        {n: Path(p).read_bytes() for n, p in sorted(f["expected"].items())})
                                       for f in entry["fresh"]]
    return sent


class Spy:
    """Wraps the gate's ``prepare``: which thread prepared each case, and when each was done."""

    def __init__(self, monkeypatch):
        self.threads: dict[str, str] = {}
        self.done: dict[str, threading.Event] = {}
        real = prepare_module.prepare

        def prepare(suite, case, **kwargs):
            try:
                return real(suite, case, **kwargs)
            finally:
                self.threads[case.name] = threading.current_thread().name
                self.done.setdefault(case.name, threading.Event()).set()

        monkeypatch.setattr(prepare_module, "prepare", prepare)

    def wait(self, case: str) -> None:
        assert self.done.setdefault(case, threading.Event()).wait(30)


def judged(path: Path, out: Path, spy: Spy | None = None, ahead: frozenset = frozenset(),
           window: int = 2) -> tuple[dict, dict]:
    """One gate run over every case of the suite (seed 1234); with ``spy``, each case is handed to
    the gate ahead, with the ``window - 1`` next, and those in ``ahead`` are prepared in full before
    their turn."""
    suite = load_suite(path)  # its own: a generated case is materialised afresh
    client = FakeWorker(kernels_for(suite))
    gate = Gate(client, Fingerprint(), GateOptions(fresh_seed=1234), out)
    program = dataclasses.replace(suite.kernels[0], name="honest", entry="honest")
    notes = {}
    try:
        for index, case in enumerate(suite.cases):
            if spy is not None:
                if case.name in ahead:
                    spy.wait(case.name)
                gate.ahead.prefetch([(suite, c) for c in suite.cases[index:index + window]])
            outcome = gate.replay(suite, program, case, Ledger.for_suite(suite))
            assert not outcome.failed, outcome.message
            notes[case.name] = outcome.notes
    finally:
        gate.ahead.close()
    return fresh_sent(client), notes


@pytest.mark.parametrize("threads", [1, 3], ids=["one-thread", "three-threads"])
@pytest.mark.parametrize("yaml_text", [PYTHON_YAML, DRAWN_YAML, CUDA_YAML], ids=["python", "distribution", "cuda"])
def test_sets_prepared_ahead_are_the_sets_drawn_in_turn(tmp_path, monkeypatch, yaml_text, threads):
    path = suite_at(tmp_path / "suite", yaml_text)
    in_turn = judged(path, tmp_path / "in-turn")
    monkeypatch.setattr(lookahead, "workers", lambda cores: threads)
    # every case after the first is prepared while the one before runs; the generated one's arrays
    # are materialised there too where its reference is Python (a CUDA one needs the worker link)
    ahead = frozenset({"perf", "wide", "big"})
    spy = Spy(monkeypatch)
    materialised, real = {}, prepare_module.materialise

    def materialise(suite, case, **kwargs):
        if not fresh_inputs.arrays_in_place(suite, case):  # else it returns at once
            materialised[case.name] = threading.current_thread().name
        return real(suite, case, **kwargs)

    monkeypatch.setattr(prepare_module, "materialise", materialise)
    assert judged(path, tmp_path / "ahead", spy, ahead, window=1 + threads) == in_turn
    assert materialised == {"big": "MainThread" if yaml_text == CUDA_YAML else "cudagate-fresh-ahead"}
    # a set a Python reference dropped ahead (the picky perf case) is drawn again in the item's own turn
    again = set() if yaml_text == CUDA_YAML else {"perf"}
    assert {case for case in ahead if spy.threads[case] == "cudagate-fresh-ahead"} == ahead - again
    assert all(spy.threads[case] == "MainThread" for case in again)
    sent, notes = in_turn
    assert sorted(sent) == ["big", "perf", "small", "wide"] and all(len(sets) >= 1 for sets in sent.values())
    skipped = [case for case, said in notes.items() if any("adversarial fresh inputs skipped" in n for n in said)]
    assert skipped == ([] if yaml_text == CUDA_YAML else ["perf"])


def materialised_in(monkeypatch) -> list[str]:
    """The threads that materialise a generated case's arrays (a call that finds them in place aside)."""
    threads, real = [], prepare_module.materialise

    def materialise(suite, case, **kwargs):
        if not fresh_inputs.arrays_in_place(suite, case):
            threads.append(threading.current_thread().name)
        return real(suite, case, **kwargs)

    monkeypatch.setattr(prepare_module, "materialise", materialise)
    return threads


def test_a_generated_case_that_fails_ahead_fails_in_its_own_turn_as_it_would_have(pytester, monkeypatch):
    path = classed_suite(pytester.path / "s")
    record = path.parent / "cases" / "big" / "generated.json"
    record.write_text(record.read_text().replace(json.loads(record.read_text())["inputs"]["x"]["sha256"], "f" * 64))
    install(monkeypatch, pytester.path, scale_kernels())
    threads = materialised_in(monkeypatch)
    calls = reports_by_case(pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent),
                                                "-p", "no:cacheprovider"))
    assert threads == ["cudagate-fresh-ahead", "MainThread"]  # tried ahead, then again in the item's turn
    assert calls["big"].failed and calls["perf"].passed and calls["small"].passed
    assert "bad case data: generated case big: input 'x' drawn from seed" in calls["big"].longreprtext


def test_a_cache_note_made_ahead_reaches_the_generated_cases_item_once(cached_suite, pytester, monkeypatch):
    path, gate, drawn, referenced = cached_suite
    gate()
    corrupt_input(cache_entries(pytester)[0])
    threads = materialised_in(monkeypatch)
    items = gate()
    assert threads == ["cudagate-fresh-ahead"] and drawn() and items["big"]["correctness"]["passed"]
    notes = [n for item in items.values() for n in item["notes"] if "cached inputs" in n]
    assert len(notes) == 1 and notes[0] in items["big"]["notes"] and "were discarded; they were drawn again" in notes[0]


def slow_small(launch) -> None:
    """The honest kernel, slow on the first case: the next case's sets are surely prepared meanwhile."""
    x, y, _ = scale_xy(launch)
    if launch.args["rows"] == 3:
        time.sleep(0.3)
    y[:] = 2 * x


def wrong_small(launch) -> None:
    x, y, _ = scale_xy(launch)
    y[:] = (3 if launch.args["rows"] == 3 else 2) * x


def run_gate(pytester, monkeypatch, path: Path, fail_draw: type[BaseException], *args: str, body=slow_small):
    """The gate on ``path`` (seed 7) with the kernel ``body``; drawing the perf case's sets raises
    ``fail_draw``. The calls' reports and report.json's items by case, and the threads the perf
    case was drawn in."""
    params = [p.protocol() for p in load_suite(path).signature]
    install(monkeypatch, pytester.path, {"scale2": FakeKernel(body, params)})
    threads = []
    real = fresh_inputs.draft

    def draft(suite, case, label, rng, signed):
        if case.name == "perf":
            threads.append(threading.current_thread().name)
            raise fail_draw("the disk is full")
        return real(suite, case, label, rng, signed)

    monkeypatch.setattr(fresh_inputs, "draft", draft)
    report = pytester.path / "report"
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", "--cuda-gate-fresh-seed", "7",
                              "--cuda-gate-report", str(report), str(path.parent), "-p", "no:cacheprovider", *args)
    calls = {r.nodeid.rsplit("::", 1)[-1]: r for r in run.getreports("pytest_runtest_logreport") if r.when == "call"}
    items = {i["case"]: i for i in json.loads((report / "report.json").read_text())["items"]}
    return run, calls, items, threads


def scale_path(pytester) -> Path:
    return write_suite(pytester.path / "s", yaml_text=SUITE_YAML + "checks: {sanitizer: off}\n")


def test_the_first_case_is_drawn_ahead_while_the_kernels_compile(pytester, monkeypatch):
    """Run phase `ahead` (the compiles, the sanitizer) overlaps the drawing of the first case's sets."""
    path = scale_path(pytester)
    install(monkeypatch, pytester.path, {"scale2": FakeKernel(slow_small, [p.protocol() for p in load_suite(path).signature])})
    first = load_suite(path).cases[0].name
    drawn, seen = threading.Event(), []
    real_draft, real_compile = fresh_inputs.draft, items_module.compile_ahead

    def draft(suite, case, label, rng, signed):
        if case.name == first and threading.current_thread().name == "cudagate-fresh-ahead":
            drawn.set()
        return real_draft(suite, case, label, rng, signed)

    def compile_ahead(*args, **kwargs):
        seen.append(drawn.wait(10))  # the compiles start once the first case is being drawn beside them
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(fresh_inputs, "draft", draft)
    monkeypatch.setattr(items_module, "compile_ahead", compile_ahead)
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(path.parent), "-p", "no:cacheprovider")
    assert run.ret == 0 and seen == [True]


def test_a_failure_ahead_is_drawn_again_in_turn_and_a_note_on_its_own_item(pytester, monkeypatch):
    run, calls, items, threads = run_gate(pytester, monkeypatch, scale_path(pytester), OSError)
    assert threads == ["cudagate-fresh-ahead", "MainThread"] and calls["small"].passed and calls["perf"].passed
    said = "fresh inputs could not be drawn for case perf: the disk is full"
    assert said in items["perf"]["notes"] and not any(said in note for note in items["small"]["notes"])


def test_an_error_ahead_fails_its_own_item_and_the_session_goes_on(pytester, monkeypatch):
    run, calls, items, threads = run_gate(pytester, monkeypatch, scale_path(pytester), RuntimeError)
    # drawn ahead, then (the gate begins perf while small is judged, and that failed) again in perf's own turn
    assert threads == ["cudagate-fresh-ahead", "MainThread"] and calls["compile"].passed and calls["small"].passed
    assert calls["perf"].failed and "RuntimeError: the disk is full" in calls["perf"].longreprtext
    assert run.ret == 1


def test_a_session_that_stops_with_a_job_running_ends(pytester, monkeypatch):
    monkeypatch.setattr(fresh_ahead, "CLOSE_WAIT_S", 0.5)
    entered, release = threading.Event(), threading.Event()
    real = prepare_module.prepare

    def stuck(suite, case, **kwargs):
        if case.name == "perf":
            entered.set()
            release.wait(30)  # still running when the session ends
            raise OSError("released")
        return real(suite, case, **kwargs)

    def wrong_once_perf_is_drawn(launch) -> None:
        entered.wait(10)  # the job ahead is running before the first case can fail
        wrong_small(launch)

    monkeypatch.setattr(prepare_module, "prepare", stuck)
    started = time.perf_counter()
    try:  # the first case fails, and -x ends the session there
        run, calls, _, _ = run_gate(pytester, monkeypatch, scale_path(pytester), OSError, "-x",
                                    body=wrong_once_perf_is_drawn)
    finally:
        release.set()
    assert entered.is_set() and calls["small"].failed and "perf" not in calls and run.ret == 1
    assert time.perf_counter() - started < 20


def slow(launch) -> None:
    """The honest kernel, slow enough on every case (a few launches of small, a hundred of perf)
    that the next case is surely prepared meanwhile."""
    x, y, _ = scale_xy(launch)
    time.sleep(0.05 if launch.args["rows"] == 3 else 0.003)
    y[:] = 2 * x


class Finished:
    """A plugin for the run under test: the items finished so far."""

    def __init__(self):
        self.nodeids: list[str] = []

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        self.nodeids.append(nodeid.split("/", 1)[0] + "::" + nodeid.rsplit("::", 1)[-1])


def test_a_suites_first_case_is_prepared_while_the_suite_before_runs(pytester, monkeypatch):
    paths = [write_suite(pytester.path / name, yaml_text=SUITE_YAML.replace("suite: scale", f"suite: {name}")
                         + "checks: {sanitizer: off}\n") for name in ("alpha", "beta")]
    install(monkeypatch, pytester.path, {"scale2": FakeKernel(slow, [p.protocol() for p in
                                                                     load_suite(paths[0]).signature])})
    finished, started = Finished(), {}
    real = prepare_module.prepare

    def prepare(suite, case, **kwargs):
        started[suite.name, case.name] = threading.current_thread().name, list(finished.nodeids)
        return real(suite, case, **kwargs)

    monkeypatch.setattr(prepare_module, "prepare", prepare)
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(pytester.path), "-p", "no:cacheprovider",
                              plugins=[finished])
    assert run.ret == 0 and set(started) == {(s, c) for s in ("alpha", "beta") for c in ("small", "perf")}
    # each case while the one before it runs: beta's first while alpha's last does (past beta's compile item)
    for (suite, case), before in [(("alpha", "perf"), "alpha::small"), (("beta", "small"), "alpha::perf"),
                                  (("beta", "perf"), "beta::small")]:
        thread, done = started[suite, case]
        assert thread == "cudagate-fresh-ahead" and before not in done, (suite, case, done)


def test_a_many_core_host_prepares_the_next_cases_at_once(pytester, monkeypatch):
    """With three prepare threads, the three cases after the first are drawn while the first runs,
    and two of them at the same time (they wait for each other: one thread would break the barrier)."""
    monkeypatch.setattr(lookahead, "workers", lambda cores: 3)
    path = suite_at(pytester.path / "suite", PYTHON_YAML)
    install(monkeypatch, pytester.path, {"scale2": FakeKernel(slow, [p.protocol() for p in load_suite(path).signature])})
    finished, started, together = Finished(), {}, threading.Barrier(2, timeout=10)
    real = prepare_module.prepare

    def prepare(suite, case, **kwargs):
        started.setdefault(case.name, (threading.current_thread().name, list(finished.nodeids)))  # the first
        if case.name in ("wide", "big") and threading.current_thread().name == "cudagate-fresh-ahead":
            together.wait()
        return real(suite, case, **kwargs)

    monkeypatch.setattr(prepare_module, "prepare", prepare)
    run = pytester.inline_run("--cuda-gate", "--cuda-gate-allow-unsigned", str(pytester.path), "-p", "no:cacheprovider",
                              plugins=[finished])
    assert run.ret == 0 and not together.broken
    for case in ("perf", "wide", "big"):
        thread, done = started[case]
        assert thread == "cudagate-fresh-ahead" and "suite::small" not in done, (case, done)


@pytest.mark.parametrize("cores, threads", [(1, 1), (4, 1), (8, 2), (16, 4), (128, 4)])
def test_prepare_threads_grow_with_the_cores_past_the_main_and_worker_threads(cores, threads):
    assert fresh_ahead.workers(cores) == threads


def test_several_threads_run_jobs_at_once_hold_one_more_than_threads_and_never_two_per_key():
    ahead = fresh_ahead.Ahead(2)
    assert ahead.held == 3
    release, runs = threading.Event(), []
    work = recorded(release, runs)
    try:
        ahead.want([(k, work(k, blocking=True)) for k in ("a", "b")] + [("c", work("c")), ("d", work("d"))])
        deadline = time.monotonic() + 10
        while len(runs) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(runs) == 2 and not release.is_set()  # a and b run at once, each in its own thread
        assert ahead.take("d") is None  # past the three held
        ahead.want([("c", work("c"))])  # a and b are dropped while they run...
        ahead.want([("b", work("b again")), ("c", work("c"))])  # ...b asked for again: the running one
        queued = ahead.claim("c")  # left to a thread, which runs it once one is free
        release.set()
        assert ahead.take("b").result() == "b" and queued.result() == "c"
        assert sorted(name for name, _ in runs) == ["a", "b", "c"]
        assert {thread for _, thread in runs} == {"cudagate-fresh-ahead"}
    finally:
        release.set()
        assert ahead.close()  # waits for every running job


@pytest.mark.parametrize("processes, prepared", [(4, ["perf"]), (1, ["big", "perf", "wide"])],
                         ids=["a quarter of 16 cores", "16 cores"])
def test_cases_are_prepared_no_further_ahead_than_the_processes_share_of_threads(tmp_path, monkeypatch, processes,
                                                                                  prepared):
    """The window counts places, not jobs: a case drawn in its own turn still takes its place, so one
    thread (4 cores each for 4 xdist workers) prepares the next case only, not the one after."""
    monkeypatch.setattr(lookahead, "cores", lambda: 16)
    suite = load_suite(suite_at(tmp_path / "suite", PYTHON_YAML))
    gate = Gate(FakeWorker(kernels_for(suite)), Fingerprint(), GateOptions(fresh_seed=1234, processes=processes),
                tmp_path / "out")
    program = dataclasses.replace(suite.kernels[0], name="honest", entry="honest")
    spy = Spy(monkeypatch)
    try:
        assert not gate.replay(suite, program, suite.cases[0], Ledger.for_suite(suite)).failed  # drawn in turn
        gate.ahead.prefetch([(suite, case) for case in suite.cases])
        for case in prepared:
            spy.wait(case)
    finally:
        assert gate.ahead.close()
    assert sorted(case for case, thread in spy.threads.items() if thread == "cudagate-fresh-ahead") == prepared


def test_an_xdist_worker_knows_how_many_gate_processes_share_the_host():
    assert xdist_hooks.worker_count(types.SimpleNamespace(workerinput={"workercount": 3})) == 3
    assert xdist_hooks.worker_count(types.SimpleNamespace()) == 1


def recorded(gate: threading.Event, runs: list):
    """Jobs by name that note which thread ran them; a ``blocking`` one waits for ``gate``."""
    def work(name: str, blocking: bool = False):
        def run():
            runs.append((name, threading.current_thread().name))
            if blocking:
                gate.wait(30)
            return name
        return run
    return work


def test_a_job_is_run_once_per_key_and_where_it_is_taken_if_not_started():
    ahead = fresh_ahead.Ahead()
    gate, runs = threading.Event(), []
    work = recorded(gate, runs)

    try:
        ahead.want([("a", work("a", blocking=True)), ("b", work("b"))])
        while not runs:
            time.sleep(0.01)
        assert ahead.take("b").result() == "b"  # the thread is busy with a: b runs here, at once
        ahead.want([("c", work("c"))])  # a is dropped while it runs...
        ahead.want([("a", work("a again"))])  # ...and asked for again: the running one, not a second
        gate.set()
        assert ahead.take("a").result() == "a" and ahead.take("c") is None
        assert runs == [("a", "cudagate-fresh-ahead"), ("b", threading.current_thread().name)]
    finally:
        ahead.close()
    ahead.want([("d", work("d"))])  # closed: nothing more starts
    assert ahead.take("d") is None


def test_a_claimed_job_is_kept_and_run_by_the_thread_and_fails_only_if_the_session_closes_first():
    ahead = fresh_ahead.Ahead()
    gate, runs = threading.Event(), []
    work = recorded(gate, runs)

    ahead.want([("a", work("a", blocking=True)), ("b", work("b"))])
    while not runs:
        time.sleep(0.01)
    claimed = ahead.claim("b")  # queued behind a
    ahead.want([("c", work("c"))])  # the next item's prefetch: b is no longer wanted, but it is claimed
    ahead.want([("b", work("b again")), ("c", work("c"))])  # asked for again: the claimed job, not a second
    gate.set()
    assert claimed.result() == "b" and ahead.take("b") is claimed
    assert ahead.take("c").result() == "c"
    assert [name for name, _ in runs] == ["a", "b", "c"] and {t for _, t in runs} == {"cudagate-fresh-ahead"}
    ahead.close()

    closing = fresh_ahead.Ahead()
    release = threading.Event()
    closing.want([("x", lambda: release.wait(30)), ("y", lambda: "y")])
    waiting = closing.claim("y")
    threading.Timer(0.2, release.set).start()
    assert closing.close()
    with pytest.raises(fresh_ahead.Dropped):  # never ran: its waiter is not left waiting
        waiting.result()


def test_a_failure_is_raised_where_the_job_is_taken():
    ahead = fresh_ahead.Ahead()

    def fails():
        raise KeyError("x")

    ahead.want([("k", fails)])
    with pytest.raises(KeyError):
        ahead.take("k").result()
    ahead.close()


def test_close_says_when_a_job_still_runs_so_its_folder_is_kept(monkeypatch):
    monkeypatch.setattr(fresh_ahead, "CLOSE_WAIT_S", 0.2)
    entered, release = threading.Event(), threading.Event()

    def stuck():
        entered.set()
        release.wait(30)

    ahead = fresh_ahead.Ahead()
    ahead.want([("k", stuck)])
    assert entered.wait(10)
    try:
        assert ahead.close() is False  # GateSession.close then leaves the run folder (a later run sweeps it)
    finally:
        release.set()
    done = fresh_ahead.Ahead()
    done.want([("k", lambda: None)])
    assert done.take("k").result() is None and done.close() is True


def test_a_host_short_of_cores_draws_every_case_in_its_own_turn(tmp_path, monkeypatch):
    monkeypatch.setattr(lookahead, "PREFETCH_CORES", 10_000)
    path = suite_at(tmp_path / "suite", DRAWN_YAML)
    spy = Spy(monkeypatch)
    judged(path, tmp_path / "out", spy)
    assert set(spy.threads.values()) == {"MainThread"}
