"""The next case's run is sent to the worker while the host judges the case before it (Gate.expect):
the same requests, the same verdicts, and the worker link used by one request at a time. On the
simulated GPU of fake_worker, with the real gate and judge."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

import pytest_cudagate.gate.lookahead as lookahead
import pytest_cudagate.gate.prepare as prepare_module
from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, honest
from helpers import SUITE_YAML, changed_after_approval, write_suite
from test_hang import Fingerprint
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.client import RunResult

pytest_plugins = ["pytester"]

CASES = SUITE_YAML + "  - {name: perf2, kind: performance, scalars: {rows: 32, cols: 512}}\n"
NO_SANITIZER = CASES + "checks: {sanitizer: off}\n"
AHEAD = "cudagate-send-ahead"
TIMEOUT = {"kind": "timeout", "code": "TIMEOUT", "message": "no answer within 1 s; the worker was killed"}


class Recording(FakeWorker):
    """Says which thread sent each run request, and that no two requests were ever in flight at once;
    answers the cases named in ``hangs`` as the watchdog does."""

    def __init__(self, *args, hangs: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, list[str]]] = []
        self.hangs = hangs
        self.hold: threading.Event | None = None  # set: a run sent ahead waits for it
        self.slow = 0.0  # seconds a run sent ahead takes on top
        self._busy = threading.Lock()

    def compare(self, request: dict, decide):
        assert self._busy.acquire(blocking=False), "two requests on the worker link at once"
        try:
            self.sent.append((threading.current_thread().name, ["compare " + request["case"]["name"]]))
            return super().compare(request, decide)
        finally:
            self._busy.release()

    def run(self, request: dict) -> RunResult:
        assert self._busy.acquire(blocking=False), "two requests on the worker link at once"
        try:
            if threading.current_thread().name == AHEAD:
                if self.hold is not None:
                    self.hold.wait(10)
                time.sleep(self.slow)
            names = [c["name"] for c in request["cases"]]
            self.sent.append((threading.current_thread().name, names))
            if set(names) & set(self.hangs):
                self.requests.append(request)
                return RunResult(compile={"ok": True, "log": ""},
                                 cases={n: {"case": n, "status": "error", "error": TIMEOUT} for n in names})
            return super().run(request)
        finally:
            self._busy.release()


def gate_over(tmp_path: Path, name: str, **worker) -> tuple[Gate, Recording]:
    client = Recording({"scale2": FakeKernel(honest, SCALE_PARAMS)}, **worker)
    client.start()
    return Gate(client, Fingerprint(), GateOptions(fresh_seed=1), tmp_path / name), client


def in_order(gate: Gate, suite, ledger, names: list[str], prefetch: bool = False):
    """The cases replayed as the pytest items replay them: each names the next to the gate first
    (and with ``prefetch``, hands it this case and the next to draw their fresh sets ahead)."""
    program, outcomes = suite.kernels[0], []
    for position, name in enumerate(names):
        if prefetch:
            gate.ahead.prefetch([(suite, suite.case(n)) for n in names[position:position + 2]])
        follows = names[position + 1] if position + 1 < len(names) else None
        gate.ahead.expect((suite, program, suite.case(follows), ledger) if follows else None)
        outcomes.append(gate.replay(suite, program, suite.case(name), ledger))
    return outcomes


def shown(outcome, folder: Path) -> dict:
    """What a report says of an outcome, but its times and the gate's output folder."""
    return {"failed": outcome.failed, "message": outcome.message, "warning": outcome.warning,
            "notes": outcome.notes, "passed": outcome.correctness.passed if outcome.correctness else None,
            "verdict": outcome.latency.verdict.value if outcome.latency else None,
            "requests": json.loads(json.dumps(outcome.requests).replace(str(folder), "OUT"))}


@pytest.fixture
def many_cores(monkeypatch):
    monkeypatch.setattr(lookahead, "cores", lambda: 16)


@pytest.fixture
def suite(tmp_path):
    return load_suite(write_suite(tmp_path / "scale", yaml_text=NO_SANITIZER))


def test_the_next_case_runs_while_this_one_is_judged_with_the_same_outcome(suite, tmp_path, many_cores):
    ahead, worker = gate_over(tmp_path, "ahead")
    plain, alone = gate_over(tmp_path, "plain")
    ledger = Ledger.for_suite(suite)
    names = ["small", "perf", "perf2"]
    pipelined = in_order(ahead, suite, ledger, names)
    one_by_one = [plain.replay(suite, suite.kernels[0], suite.case(n), ledger) for n in names]
    assert worker.sent == [("MainThread", ["small"]), (AHEAD, ["perf"]), (AHEAD, ["perf2"])]
    assert [t for t, _ in alone.sent] == ["MainThread"] * 3
    assert [shown(o, tmp_path / "ahead") for o in pipelined] == [shown(o, tmp_path / "plain") for o in one_by_one]
    assert not any(o.failed for o in pipelined)
    assert ahead.ahead.close()


def test_a_case_whose_sets_are_drawn_ahead_is_begun_in_the_sending_thread_with_the_same_outcome(
        suite, tmp_path, many_cores, monkeypatch):
    begun, real = [], lookahead.Lookahead.begin

    def begin(self, suite, current, case, **kwargs):
        begun.append((case.name, threading.current_thread().name))
        return real(self, suite, current, case, **kwargs)

    monkeypatch.setattr(lookahead.Lookahead, "begin", begin)
    ledger, names = Ledger.for_suite(suite), ["small", "perf", "perf2"]
    plain, _ = gate_over(tmp_path, "plain")
    one_by_one = [plain.replay(suite, suite.kernels[0], suite.case(n), ledger) for n in names]
    begun.clear()
    ahead, worker = gate_over(tmp_path, "ahead")
    pipelined = in_order(ahead, suite, ledger, names, prefetch=True)
    # the host judges one case while the next is begun (its drawn sets taken) and run
    assert begun == [("small", "MainThread"), ("perf", AHEAD), ("perf2", AHEAD)]
    assert worker.sent == [("MainThread", ["small"]), (AHEAD, ["perf"]), (AHEAD, ["perf2"])]
    assert [shown(o, tmp_path / "ahead") for o in pipelined] == [shown(o, tmp_path / "plain") for o in one_by_one]
    assert ahead.ahead.close()


def test_a_job_claimed_for_a_case_sent_ahead_outlives_the_next_items_prefetch(suite, tmp_path, many_cores, monkeypatch):
    """The sending thread is slow to start: meanwhile the next item hands the gate its own cases to
    draw ahead, which must not drop the job of the case being sent (nor draw its sets twice)."""
    real_begin, real_prepare, prepared = lookahead.Lookahead.begin, prepare_module.prepare, []

    def begin(self, suite, current, case, **kwargs):
        if threading.current_thread().name == AHEAD:
            time.sleep(0.3)
        return real_begin(self, suite, current, case, **kwargs)

    def prepare(suite, case, **kwargs):
        prepared.append(case.name)
        return real_prepare(suite, case, **kwargs)

    monkeypatch.setattr(lookahead.Lookahead, "begin", begin)
    monkeypatch.setattr(prepare_module, "prepare", prepare)
    ahead, worker = gate_over(tmp_path, "ahead")
    in_order(ahead, suite, Ledger.for_suite(suite), ["small", "perf", "perf2"], prefetch=True)
    assert worker.sent == [("MainThread", ["small"]), (AHEAD, ["perf"]), (AHEAD, ["perf2"])]
    assert sorted(prepared) == ["perf", "perf2", "small"]
    assert ahead.ahead.close()


def test_a_case_whose_sets_were_not_drawn_ahead_begins_in_its_own_turn(suite, tmp_path, many_cores, monkeypatch):
    """A prefetch job that failed: the thread that would send the case leaves it to its item, which
    draws the sets itself, as one by one."""
    real, begun, real_begin = prepare_module.prepare, [], lookahead.Lookahead.begin

    def prepare(suite, case, **kwargs):
        if threading.current_thread().name == "cudagate-fresh-ahead":
            raise OSError("disk full")
        return real(suite, case, **kwargs)

    def begin(self, suite, current, case, **kwargs):
        try:
            return real_begin(self, suite, current, case, **kwargs)
        except lookahead.NotDrawnAhead:
            begun.append((case.name, threading.current_thread().name))
            raise

    monkeypatch.setattr(prepare_module, "prepare", prepare)
    ledger, names = Ledger.for_suite(suite), ["small", "perf", "perf2"]
    plain, _ = gate_over(tmp_path, "plain")
    one_by_one = [plain.replay(suite, suite.kernels[0], suite.case(n), ledger) for n in names]
    monkeypatch.setattr(lookahead.Lookahead, "begin", begin)
    ahead, worker = gate_over(tmp_path, "ahead")
    pipelined = in_order(ahead, suite, ledger, names, prefetch=True)
    assert begun == [("perf", AHEAD), ("perf2", AHEAD)]  # tried in the sending thread, left to the item
    assert worker.sent == [("MainThread", ["small"]), ("MainThread", ["perf"]), ("MainThread", ["perf2"])]
    assert [shown(o, tmp_path / "ahead") for o in pipelined] == [shown(o, tmp_path / "plain") for o in one_by_one]
    assert ahead.ahead.close()


def test_a_run_sent_for_a_case_that_does_not_come_next_is_answered_and_dropped(suite, tmp_path, many_cores):
    gate, worker = gate_over(tmp_path, "out")
    ledger, program = Ledger.for_suite(suite), suite.kernels[0]
    gate.ahead.expect((suite, program, suite.case("perf"), ledger))
    gate.replay(suite, program, suite.case("small"), ledger)
    other = gate.replay(suite, program, suite.case("perf2"), ledger)
    assert worker.sent == [("MainThread", ["small"]), (AHEAD, ["perf"]), ("MainThread", ["perf2"])]
    assert not other.failed and len(other.requests) == 1


def test_an_interleaved_comparison_is_not_sent_ahead(tmp_path, many_cores):
    suite, ledger = changed_after_approval(load_suite(write_suite(tmp_path / "scale", yaml_text=NO_SANITIZER)))
    gate, worker = gate_over(tmp_path, "out")
    outcomes = in_order(gate, suite, ledger, ["small", "perf"])
    assert worker.sent == [("MainThread", ["small"]), ("MainThread", ["compare perf"])]  # in its own turn
    assert outcomes[1].latency.pairs > 0


def test_the_case_that_runs_the_sanitizer_has_the_gpu_alone(tmp_path, many_cores):
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=CASES))  # compute-sanitizer on its smallest case
    gate, worker = gate_over(tmp_path, "out")
    in_order(gate, suite, Ledger.for_suite(suite), ["small", "perf", "perf2"])
    assert worker.sent == [("MainThread", ["small"]), ("MainThread", ["perf"]), (AHEAD, ["perf2"])]


def test_a_hang_in_a_run_sent_ahead_is_its_own_cases(suite, tmp_path, many_cores):
    gate, worker = gate_over(tmp_path, "out", hangs=("perf",))
    small, perf, perf2 = in_order(gate, suite, Ledger.for_suite(suite), ["small", "perf", "perf2"])
    assert not small.failed
    assert perf.failed and "timeout" in perf.correctness.describe()
    assert perf2.failed and perf2.message.startswith("not run: scale2 did not finish case perf within the case timeout")
    assert [names for _, names in worker.sent] == [["small"], ["perf"]]


def test_the_gate_closes_once_a_run_still_on_its_way_is_answered(suite, tmp_path, many_cores):
    """A session that ends with a run sent for an item that will not come (Ctrl-C, say): closing
    waits for its answer, so the worker link is free for the shutdown and the folder is not in use."""
    gate, worker = gate_over(tmp_path, "out")
    worker.hold = threading.Event()
    ledger, program = Ledger.for_suite(suite), suite.kernels[0]
    gate.ahead.expect((suite, program, suite.case("perf"), ledger))
    gate.replay(suite, program, suite.case("small"), ledger)  # returns while perf's run waits on the worker
    threading.Timer(0.3, worker.hold.set).start()
    assert gate.ahead.close()
    assert worker.hold.is_set() and worker.sent == [("MainThread", ["small"]), (AHEAD, ["perf"])]
    assert not worker._busy.locked()


def test_only_the_next_case_of_the_same_kernel_is_sent(suite, tmp_path, many_cores):
    """Another suite's kernel of the same name writes its outputs to the folder this case's are judged in."""
    other = load_suite(write_suite(tmp_path / "other", yaml_text=NO_SANITIZER))
    gate, worker = gate_over(tmp_path, "out")
    ledger, program = Ledger.for_suite(suite), suite.kernels[0]
    gate.ahead.expect((other, other.kernels[0], other.case("perf"), Ledger.for_suite(other)))
    gate.replay(suite, program, suite.case("perf"), ledger)
    assert worker.sent == [("MainThread", ["perf"])]


def test_a_failure_beginning_the_next_case_is_that_cases_own(suite, tmp_path, many_cores, monkeypatch):
    real = prepare_module.prepare

    def prepare(suite, case, **kwargs):
        if case.name == "perf":
            raise MemoryError("fresh inputs of perf")
        return real(suite, case, **kwargs)

    monkeypatch.setattr(prepare_module, "prepare", prepare)
    gate, worker = gate_over(tmp_path, "out")
    ledger, program = Ledger.for_suite(suite), suite.kernels[0]
    gate.ahead.expect((suite, program, suite.case("perf"), ledger))
    small = gate.replay(suite, program, suite.case("small"), ledger)
    assert not small.failed, small.message
    with pytest.raises(MemoryError, match="fresh inputs of perf"):
        gate.replay(suite, program, suite.case("perf"), ledger)
    assert worker.sent == [("MainThread", ["small"])]


def test_a_head_start_ends_where_its_item_starts(suite, tmp_path, many_cores):
    """The wait for a slow answer is the item's own time, not part of its head start: each case's
    phases then add up to its span, and none claims the time twice."""
    gate, worker = gate_over(tmp_path, "out")
    worker.slow = 0.4
    ledger, program = Ledger.for_suite(suite), suite.kernels[0]
    gate.ahead.expect((suite, program, suite.case("perf"), ledger))
    first = time.perf_counter()
    gate.replay(suite, program, suite.case("small"), ledger, started=first)
    started = time.perf_counter()
    perf = gate.replay(suite, program, suite.case("perf"), ledger, started=started)
    wall = time.perf_counter() - started
    assert 0 < perf.head_start_s <= started - first < 0.4  # small's turn did not wait for perf's answer
    assert wall >= 0.35 and sum(perf.phases.values()) <= perf.head_start_s + wall, perf.phases


def test_a_hang_in_a_run_sent_for_an_item_that_did_not_come_still_spares_the_kernels_later_cases(
        suite, tmp_path, many_cores):
    gate, worker = gate_over(tmp_path, "out", hangs=("perf",))
    ledger, program = Ledger.for_suite(suite), suite.kernels[0]
    gate.ahead.expect((suite, program, suite.case("perf"), ledger))
    gate.replay(suite, program, suite.case("small"), ledger)
    later = gate.replay(suite, program, suite.case("perf2"), ledger)  # perf's item never came (deselected, say)
    assert later.failed and later.message.startswith("not run: scale2 did not finish case perf within the case timeout")
    assert [names for _, names in worker.sent] == [["small"], ["perf"]]


def test_a_host_of_few_cores_sends_nothing_ahead(suite, tmp_path, monkeypatch):
    monkeypatch.setattr(lookahead, "cores", lambda: 2)
    gate, worker = gate_over(tmp_path, "out")
    in_order(gate, suite, Ledger.for_suite(suite), ["small", "perf", "perf2"])
    assert [t for t, _ in worker.sent] == ["MainThread"] * 3


CONFTEST = """
import sys
import threading

sys.path.insert(0, {tests!r})
from fake_worker import FakeWorker, scale_kernels  # noqa: E402

import pytest_cudagate.gate.lookahead as lookahead  # noqa: E402
from fake_worker import use_client  # noqa: E402

lookahead.cores = lambda: {cores}
threads = []


class Recording(FakeWorker):
    def run(self, request):
        threads.append(threading.current_thread().name)
        return super().run(request)


def pytest_sessionfinish(session):
    with open("threads.json", "w") as handle:
        handle.write(__import__("json").dumps(threads))


use_client(lambda **options: Recording(scale_kernels(), **options))
"""


def test_stepwise_sends_nothing_ahead(pytester):
    """--stepwise stops at the first failure: the case after it may never run."""
    write_suite(pytester.path / "scale", yaml_text=NO_SANITIZER)
    (pytester.path / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).parents[1]), cores=16))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "--stepwise", timeout=300)
    assert result.ret == 0, result.stdout.str()
    threads = json.loads((pytester.path / "threads.json").read_text())
    assert len(threads) == 3 and AHEAD not in threads, threads


def test_a_pytest_run_sends_ahead_and_reports_what_a_run_one_by_one_reports(pytester):
    write_suite(pytester.path / "scale", yaml_text=NO_SANITIZER)
    reports = {}
    for cores in (16, 1):
        (pytester.path / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).parents[1]), cores=cores))
        result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                               "--cuda-gate-fresh-seed", "7", "--cuda-gate-report", "out",
                                               timeout=300)
        assert result.ret == 0, result.stdout.str()
        threads = json.loads((pytester.path / "threads.json").read_text())
        assert (AHEAD in threads) == (cores == 16), threads
        document = json.loads((pytester.path / "out" / "report.json").read_text())
        for item in document["items"]:  # all but the times (the simulated GPU's clock is the host's)
            item.pop("phases"), item.pop("worker_s"), item.pop("head_start_s"), item["correctness"].pop("median_ms")
            item["requests"] = json.loads(re.sub(r"cudagate-run-\d+-\w+", "RUN", json.dumps(item.get("requests"))))
        reports[cores] = document["items"]
    assert reports[16] == reports[1]
