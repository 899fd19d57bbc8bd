"""A long kernel timed alone stops once its run level is settled; a GPU still at speed skips the
warm-up's time floor. Both through the real harness worker on the fake device."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import binom

from cudagate_harness.stopping import Settle, quantile_interval
from fake_worker import FakeKernel, SCALE_PARAMS, install, make_worker, scale_xy
from helpers import SUITE_YAML, write_suite
from pytest_cudagate.boundary import schema
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.gate import baseline_timing
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.requests import run_request

REPEAT = 100  # a baseline of 3 blocks: 300 launches


# -- the interval ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [51, 64, 100, 300, 1000])
@pytest.mark.parametrize("q", [0.1, 0.5])
def test_the_interval_is_the_order_statistics_the_binomial_gives(n, q):
    samples = np.random.default_rng(n).lognormal(0, 0.1, n)
    tail = 0.005
    lower = max(l for l in range(1, n + 1) if binom.cdf(l - 1, n, q) <= tail)
    upper = min(u for u in range(1, n + 1) if binom.cdf(u - 1, n, q) >= 1 - tail)
    ordered = np.sort(samples)
    assert quantile_interval(samples, q, 0.99) == (ordered[lower - 1], ordered[upper - 1])


def test_too_few_samples_give_no_interval_of_a_low_quantile():
    assert Settle(0.1, 0.005).fewest == 51
    assert quantile_interval(np.ones(50), 0.1, 0.99) is None
    assert quantile_interval(np.ones(51), 0.1, 0.99) == (1.0, 1.0)


def test_the_interval_holds_the_quantile_at_least_as_often_as_it_says():
    rng = np.random.default_rng(7)
    truth = float(np.exp(0.2 * -1.2815515655446004))  # the 10th percentile of lognormal(0, 0.2)
    draws = 2000
    held = sum(low <= truth <= high for low, high in
               (quantile_interval(rng.lognormal(0, 0.2, 64), 0.1, 0.99) for _ in range(draws)))
    assert held / draws >= 0.985


# -- through the worker ---------------------------------------------------------------------------

def timed_alone(tmp_path, extra_ms) -> dict:
    """The answer to a kernel-timed-alone request (a baseline's timing) whose launches each take
    10 µs plus ``extra_ms(launch number)``."""
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + f"timing: {{warmup: 1, repeat: {REPEAT}}}\n"))
    count = {"n": 0}

    def body(launch):
        x, y, _ = scale_xy(launch)
        y[:] = 2 * x
        count["n"] += 1
        launch.device.clock += extra_ms(count["n"])

    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("perf")],
                                                output_dir=tmp_path / "out", timing=baseline_timing(suite))))
    assert schema.problems(request, "harness-request") == []
    lines: list[dict] = []
    make_worker({"scale2": FakeKernel(body, SCALE_PARAMS)}, emit=lines.append).handle({**request, "id": 1})
    assert [schema.problems(line, "harness-response") for line in lines] == [[]] * len(lines)
    (answer,) = [line for line in lines if line["type"] == "case"]
    assert answer["status"] == "ok", answer
    return answer["timing"]


def test_a_long_steady_kernel_stops_after_its_first_block(tmp_path):
    timing = timed_alone(tmp_path, lambda n: 2.0)  # 2 ms a launch: 300 would be 0.6 s of GPU
    assert timing["repeat"] == len(timing["samples_ms"]) == 64


def test_a_long_kernel_whose_launches_spread_runs_on(tmp_path):
    wobble = np.random.default_rng(3).lognormal(0, 0.05, 10_000)
    timing = timed_alone(tmp_path, lambda n: 2.0 * wobble[n])
    assert timing["repeat"] == len(timing["samples_ms"]) == 3 * REPEAT


def test_a_short_kernel_is_timed_for_every_launch_asked(tmp_path):
    timing = timed_alone(tmp_path, lambda n: 0.0)  # 10 µs: the rest costs less than a look is worth
    assert timing["repeat"] == len(timing["samples_ms"]) == 3 * REPEAT


def test_an_approval_of_a_long_kernel_records_the_launches_it_timed(tmp_path, monkeypatch):
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + f"timing: {{warmup: 1, repeat: {REPEAT}}}\n"))

    def slow(launch):
        x, y, _ = scale_xy(launch)
        y[:] = 2 * x
        launch.device.clock += 2.0

    install(monkeypatch, tmp_path, {"scale2": FakeKernel(slow, SCALE_PARAMS)})
    assert main(["approve", str(suite.path), "--approved-by", "reviewer"]) == 0
    (baseline,) = Ledger.for_suite(load_suite(suite.path)).approvals["scale2"].baselines.values()
    assert len(baseline.cases["perf"]["samples_ms"]) == 64


# -- the warm-up's time floor ---------------------------------------------------------------------

def warmups(tmp_path, after: list, before: list) -> list[float]:
    """The time floor each of three timed runs had, the worker's NVML reading the SM clock ``after``
    each run's timed launches and ``before`` the warm-up of each run after the first."""
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + "timing: {warmup: 1, repeat: 20}\n"))
    afters, befores = iter(after), iter(before)

    def state() -> dict:
        clock = next(afters, None)
        return {"sm_clock_mhz": clock} if clock is not None else {}

    def body(launch):
        x, y, _ = scale_xy(launch)
        y[:] = 2 * x

    worker = make_worker({"scale2": FakeKernel(body, SCALE_PARAMS)}, state=state, clock=lambda: next(befores, None))
    floors = []
    for i in range(3):
        lines: list[dict] = []
        worker.emit = lines.append
        request = run_request(suite, suite.kernels[0], [suite.case("perf")], output_dir=tmp_path / f"out{i}",
                              timing={**suite.timing.to_json(), "warmup_ms": 20.0})
        worker.handle(json.loads(json.dumps({**request, "id": i})))
        (answer,) = [line for line in lines if line["type"] == "case"]
        floors.append(answer["timing"]["warmup_ms"])
    return floors


def test_a_gpu_still_at_the_clock_of_its_last_timed_launches_skips_the_time_floor(tmp_path):
    # run 1: no timed launches before it; after each, 1980 MHz; run 2 starts at 1980, run 3 at 1900
    assert warmups(tmp_path, after=[1980, 1980, 1980], before=[1980, 1900]) == [20.0, 0.0, 0.0]


def test_the_clock_compared_with_is_one_after_a_floored_warm_up_so_it_cannot_slide(tmp_path):
    # run 2 skips its floor at 1900 and reads 1890 after; run 3 at 1850 is compared with run 1's 1980
    assert warmups(tmp_path, after=[1980, 1890, 1800], before=[1900, 1850]) == [20.0, 0.0, 20.0]


def test_a_gpu_whose_clock_fell_warms_up_for_the_whole_floor(tmp_path):
    assert warmups(tmp_path, after=[1980, 1980, 1980], before=[345, 1700]) == [20.0, 20.0, 20.0]


def test_without_a_clock_reading_the_floor_stays(tmp_path):
    assert warmups(tmp_path, after=[], before=[]) == [20.0, 20.0, 20.0]
    assert warmups(tmp_path / "2", after=[1980, 1980, 1980], before=[]) == [20.0, 20.0, 20.0]


# -- a library baseline beside a long kernel ------------------------------------------------------

def test_the_library_rounds_of_a_long_kernel_stop_once_their_ratio_is_settled(tmp_path, monkeypatch):
    import dataclasses

    from cudagate_harness.library import ADAPTERS
    from test_library import PARAMS, FakeSgemm, mm_kernel, write_mm

    class SlowSgemm(FakeSgemm):
        def enqueue(self, pointers, scalars) -> None:
            super().enqueue(pointers, scalars)
            self.device.clock += 0.5

    def slow_mm(launch):
        mm_kernel(launch)
        launch.device.clock += 2.0

    monkeypatch.setitem(ADAPTERS, "cublas_sgemm", dataclasses.replace(ADAPTERS["cublas_sgemm"], load=SlowSgemm))
    suite = load_suite(write_mm(tmp_path / "mm"))
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("wide")],
                                                output_dir=tmp_path / "out", timing=suite.timing.to_json(),
                                                library=True)))
    lines: list[dict] = []
    make_worker({"mm": FakeKernel(slow_mm, PARAMS)}, emit=lines.append).handle({**request, "id": 1})
    (answer,) = [line for line in lines if line["type"] == "case"]
    assert len(answer["library"]["current_ms"]) == len(answer["library"]["library_ms"]) == 64
    assert len(answer["timing"]["samples_ms"]) == suite.timing.repeat  # no settle rule on a timed block
