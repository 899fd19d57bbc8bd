"""One GPU per pytest-xdist worker: gwN is pinned to card N modulo the card count."""

from __future__ import annotations

import sys
import types

import pytest

from pytest_cudagate.session import xdist_device_env


@pytest.fixture()
def gpus(monkeypatch):
    def install(count: int):
        fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: count)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


@pytest.mark.parametrize("worker, count, expected", [("gw0", 4, "0"), ("gw3", 4, "3"), ("gw5", 4, "1"), ("gw1", 1, "0")])
def test_workers_spread_over_the_cards(monkeypatch, gpus, worker, count, expected):
    gpus(count)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert xdist_device_env() == {"CUDA_VISIBLE_DEVICES": expected}


def test_no_pinning_outside_xdist_or_when_the_user_chose(monkeypatch, gpus):
    gpus(4)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert xdist_device_env() == {}
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert xdist_device_env() == {}


@pytest.mark.parametrize("worker, chosen, expected", [
    ("gw0", "2,5", "2"), ("gw1", "2,5", "5"), ("gw2", "2,5", "2"),
    ("gw1", "GPU-aaaa, GPU-bbbb", "GPU-bbbb"),
])
def test_workers_spread_over_the_cards_the_user_chose(monkeypatch, gpus, worker, chosen, expected):
    gpus(8)  # NVML sees every card; the user's list decides
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", chosen)
    assert xdist_device_env() == {"CUDA_VISIBLE_DEVICES": expected}


def test_no_nvml_means_no_pinning(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=lambda: 1 / 0))
    assert xdist_device_env() == {}
