"""HarnessClient against a stub worker process (tests/stub_worker.py): answers, a crash, a hang and
the restarts after them, all on the CPU through the client's injectable worker command."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

from pytest_cudagate.errors import WorkerUnavailable
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.worker.client import HarnessClient, Worker

STUB = str(Path(__file__).resolve().parents[1] / "stub_worker.py")


def client(mode: str = "answer", timeout_s: float = 10.0) -> HarnessClient:
    return HarnessClient(timeout_s=timeout_s, command=[sys.executable, STUB, mode])


def run(worker: Worker, *names: str):
    return worker.run({"op": "run", "cases": [{"name": n} for n in names]})


def test_a_worker_answers_every_case():
    with client() as worker:
        hello = worker.start()
        result = run(worker, "a", "b")
    assert hello["device"]["name"] == "Stub GPU" and worker.device["uuid"] == "GPU-stub"
    assert result.compile["ok"] and [body["status"] for body in result.cases.values()] == ["ok", "ok"]
    assert result.restarts == 0


def test_a_crash_costs_its_own_case_and_a_fresh_worker_answers_the_rest():
    with client() as worker:
        worker.start()
        first = worker.hello["pid"]
        result = run(worker, "a", "crash", "b")
    crash = result.cases["crash"]["error"]
    assert crash["kind"] == "crash" and "exit code 7" in crash["message"] and "crashing as asked" in crash["message"]
    assert result.cases["a"]["pid"] == first and result.cases["b"]["status"] == "ok"
    assert result.cases["b"]["pid"] != first and result.restarts == 1


def test_a_hang_is_killed_at_the_watchdog_and_the_rest_still_runs():
    with client(timeout_s=1.0) as worker:
        worker.start()
        result = run(worker, "hang", "b")
    hang = result.cases["hang"]["error"]
    assert hang["kind"] == "timeout" and "no answer within 1 s" in hang["message"]
    assert result.cases["b"]["status"] == "ok" and result.restarts == 1
    # what the gate prints for it: the kind's title once, then the message
    assert judge_case("k", "hang", result.cases["hang"], {}, {}).problems == [
        "timeout: no answer within 1 s (the kernel hung or ran too long); the worker was killed"]


def test_a_request_sent_from_another_thread_leaves_the_link_to_the_next():
    """The gate sends a case's run from a thread of its own while it judges the case before (the
    worker link is used by one thread at a time): a hang killed there restarts the worker, and the
    next request, from the main thread, gets the fresh one."""
    answered = {}
    with client(timeout_s=1.0) as worker:
        worker.start()
        first = worker.hello["pid"]
        sender = threading.Thread(target=lambda: answered.update(ahead=run(worker, "a", "hang")), name="ahead")
        sender.start()
        sender.join()
        after = run(worker, "b")
    ahead = answered["ahead"]
    assert ahead.cases["a"]["pid"] == first and ahead.cases["hang"]["error"]["kind"] == "timeout"
    assert after.cases["b"]["status"] == "ok" and after.cases["b"]["pid"] != first


def test_a_compare_conversation_follows_the_decisions_and_survives_a_dead_worker():
    with client() as worker:
        worker.start()
        rounds = iter([1, 1, 0])
        result = worker.compare({"op": "compare", "case": {"name": "perf"}}, lambda chunk: next(rounds))
        assert len(result.chunks) == 3 and result.body["status"] == "ok"
        assert run(worker, "crash").cases["crash"]["error"]["kind"] == "crash"
        again = worker.compare({"op": "compare", "case": {"name": "perf"}}, lambda chunk: 0)  # a fresh worker
    assert again.body["status"] == "ok" and again.body["pid"] != result.body["pid"] and worker.restarts == 1


@pytest.mark.parametrize("mode, says", [("nogpu", "no CUDA device (stub)"), ("silent", "did not start")])
def test_a_worker_that_cannot_start_is_unavailable(mode, says):
    with client(mode) as worker, pytest.raises(WorkerUnavailable, match=re.escape(says)):
        worker.start()


def test_start_takes_over_the_process_spawn_started_and_restarts_stay_fresh():
    with client() as worker:
        worker.spawn()
        spawned = worker.proc.pid
        hello = worker.start()
        result = run(worker, "crash", "b")
    assert hello["pid"] == spawned and worker.restarts == 1
    assert result.cases["b"]["status"] == "ok" and result.cases["b"]["pid"] != spawned


def test_closing_a_spawned_worker_before_its_hello_ends_the_process():
    worker = client()
    worker.spawn()
    process = worker.proc
    worker.close()
    assert process.poll() is not None
