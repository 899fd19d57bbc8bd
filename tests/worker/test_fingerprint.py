"""Telemetry (harness/cudagate_harness/telemetry.py) against a fake pynvml, and the Fingerprint key."""

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

from pytest_cudagate.worker.fingerprint import KEY_FIELDS, Fingerprint, differences

TELEMETRY = Path(__file__).resolve().parents[2] / "harness" / "cudagate_harness" / "telemetry.py"


class NVMLError(Exception):
    pass


class _Struct:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _device(index, *, pci, uuid):
    return {
        "name": "NVIDIA H200",
        "uuid": uuid,
        "pci": pci,
        "cc": (9, 0),
        "memory": 150_754_820_096,
        "power_limit_mw": 700_000,
        "enforced_mw": 690_000,
        "ecc": [1, 1],
        "mig": [0, 0],
        "persistence": 1,
        "max_clocks": {1: 1980, 2: 3201},
        "app_clocks": {1: 1755, 2: 3201},
        "vbios": b"96.00.A5.00.01",  # bytes, as older pynvml returns
        "clocks": {1: 1980, 2: 3201},
        "temperature": 41,
        "power_mw": 120_500,
        "reasons": 0,
        "util": 0,
        "procs": [],
    }


def make_fake_nvml(*, throttle_generation="event", fail=(), init_error=None):
    """A pynvml stand-in holding three devices; functions named in ``fail`` raise NVMLError."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.devices = [
        _device(0, pci="00000000:18:00.0", uuid="GPU-aaaa1111-0000-0000-0000-000000000000"),
        _device(1, pci="00000000:2A:00.0", uuid="GPU-bbbb2222-0000-0000-0000-000000000000"),
        _device(2, pci="00000000:3C:00.0", uuid="GPU-cccc3333-0000-0000-0000-000000000000"),
    ]
    nv.calls = {}
    prefix = "nvmlClocksEventReason" if throttle_generation == "event" else "nvmlClocksThrottleReason"
    bits = {
        "GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
        "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
        "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100,
    }
    for suffix, bit in bits.items():
        setattr(nv, prefix + suffix, bit)

    def api(name):
        def register(fn):
            def wrapper(*args):
                nv.calls[name] = nv.calls.get(name, 0) + 1
                if name in fail:
                    raise NVMLError(f"{name}: Not Supported")
                return fn(*args)

            setattr(nv, name, wrapper)
            return wrapper

        return register

    @api("nvmlInit")
    def _():
        if init_error:
            raise NVMLError(init_error)

    @api("nvmlDeviceGetCount")
    def _():
        return len(nv.devices)

    @api("nvmlDeviceGetHandleByIndex")
    def _(i):
        if not 0 <= i < len(nv.devices):
            raise NVMLError("Invalid Argument")
        return i

    @api("nvmlDeviceGetHandleByPciBusId")
    def _(bus):
        for i, d in enumerate(nv.devices):
            if d["pci"].lower() == bus.lower():
                return i
        raise NVMLError("Not Found")

    @api("nvmlDeviceGetHandleByUUID")
    def _(uuid):
        for i, d in enumerate(nv.devices):
            if d["uuid"] == uuid:
                return i
        raise NVMLError("Not Found")

    simple = {
        "nvmlDeviceGetName": lambda h: nv.devices[h]["name"],
        "nvmlDeviceGetUUID": lambda h: nv.devices[h]["uuid"],
        "nvmlDeviceGetPciInfo": lambda h: _Struct(busId=nv.devices[h]["pci"].encode()),
        "nvmlDeviceGetCudaComputeCapability": lambda h: nv.devices[h]["cc"],
        "nvmlDeviceGetMemoryInfo": lambda h: _Struct(total=nv.devices[h]["memory"]),
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,
        "nvmlDeviceGetPowerManagementLimit": lambda h: nv.devices[h]["power_limit_mw"],
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: nv.devices[h]["enforced_mw"],
        "nvmlDeviceGetEccMode": lambda h: nv.devices[h]["ecc"],
        "nvmlDeviceGetMigMode": lambda h: nv.devices[h]["mig"],
        "nvmlDeviceGetPersistenceMode": lambda h: nv.devices[h]["persistence"],
        "nvmlDeviceGetMaxClockInfo": lambda h, c: nv.devices[h]["max_clocks"][c],
        "nvmlDeviceGetApplicationsClock": lambda h, c: nv.devices[h]["app_clocks"][c],
        "nvmlDeviceGetVbiosVersion": lambda h: nv.devices[h]["vbios"],
        "nvmlDeviceGetClockInfo": lambda h, c: nv.devices[h]["clocks"][c],
        "nvmlDeviceGetTemperature": lambda h, s: nv.devices[h]["temperature"],
        "nvmlDeviceGetPowerUsage": lambda h: nv.devices[h]["power_mw"],
        "nvmlDeviceGetUtilizationRates": lambda h: _Struct(gpu=nv.devices[h]["util"], memory=0),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            _Struct(pid=pid, usedGpuMemory=mem) for pid, mem in nv.devices[h]["procs"]
        ],
    }
    reasons_fn = (
        "nvmlDeviceGetCurrentClocksEventReasons"
        if throttle_generation == "event"
        else "nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    simple[reasons_fn] = lambda h: nv.devices[h]["reasons"]
    for name, fn in simple.items():
        api(name)(fn)
    return nv


@pytest.fixture
def load(monkeypatch):
    """Install a fake pynvml (or none) and load a fresh telemetry module, so NVML init
    and handle caches never leak between tests."""

    def _load(fake):
        if fake is None:
            monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
        else:
            monkeypatch.setitem(sys.modules, "pynvml", fake)
        spec = importlib.util.spec_from_file_location("_telemetry_under_test", TELEMETRY)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return _load


# ---------------------------------------------------------------- device_identity


def test_identity_reads_every_field(load):
    t = load(make_fake_nvml())
    ident = t.device_identity(0)
    assert ident == {
        "name": "NVIDIA H200",
        "uuid": "GPU-aaaa1111-0000-0000-0000-000000000000",
        "pci_bus_id": "00000000:18:00.0",
        "compute_capability": "9.0",
        "memory_total_bytes": 150_754_820_096,
        "driver_version": "580.159.04",
        "cuda_driver_version": "13.0",
        "power_limit_w": 700.0,
        "enforced_power_limit_w": 690.0,
        "ecc": True,
        "mig": False,
        "persistence_mode": True,
        "max_sm_clock_mhz": 1980,
        "max_mem_clock_mhz": 3201,
        "applications_sm_clock_mhz": 1755,
        "applications_mem_clock_mhz": 3201,
        "vbios_version": "96.00.A5.00.01",
    }


def test_identity_unsupported_field_is_none_and_others_survive(load):
    t = load(make_fake_nvml(fail={"nvmlDeviceGetEccMode", "nvmlDeviceGetApplicationsClock"}))
    ident = t.device_identity(1)
    assert ident["ecc"] is None
    assert ident["applications_sm_clock_mhz"] is None
    assert ident["uuid"].startswith("GPU-bbbb")
    assert ident["power_limit_w"] == 700.0


def test_identity_falls_back_to_unversioned_cuda_driver_version(load):
    nv = make_fake_nvml(fail={"nvmlSystemGetCudaDriverVersion_v2"})
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12080
    assert load(nv).device_identity(0)["cuda_driver_version"] == "12.8"


def test_nvml_missing(load):
    t = load(None)
    for result in (t.device_identity(0), t.device_state(0)):
        assert result.keys() == {"nvml"}
        assert result["nvml"].startswith("unavailable: ")


def test_nvml_init_failure_is_reported_and_not_retried(load):
    nv = make_fake_nvml(init_error="Driver Not Loaded")
    t = load(nv)
    assert "Driver Not Loaded" in t.device_identity(0)["nvml"]
    assert "Driver Not Loaded" in t.device_state(0)["nvml"]
    assert nv.calls["nvmlInit"] == 1


def test_unknown_device_is_unavailable_not_an_exception(load):
    t = load(make_fake_nvml())
    assert "unavailable" in t.device_identity(7)["nvml"]
    assert "00000000:99:00.0" in t.device_state(0, pci_bus_id="00000000:99:00.0")["nvml"]


# ---------------------------------------------------------------- handle resolution


def test_pci_bus_id_is_preferred_over_ordinal(load, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    t = load(make_fake_nvml())
    assert t.device_identity(0, pci_bus_id="00000000:3c:00.0")["uuid"].startswith("GPU-cccc")


def test_cuda_visible_devices_indices(load, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    t = load(make_fake_nvml())
    assert t.device_identity(0)["uuid"].startswith("GPU-cccc")
    assert t.device_identity(1)["uuid"].startswith("GPU-aaaa")
    assert "unavailable" in t.device_identity(2)["nvml"]


def test_cuda_visible_devices_uuid_and_prefix(load, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb2222-0000-0000-0000-000000000000,GPU-cccc")
    t = load(make_fake_nvml())
    assert t.device_identity(0)["pci_bus_id"] == "00000000:2A:00.0"
    assert t.device_identity(1)["pci_bus_id"] == "00000000:3C:00.0"


def test_cuda_visible_devices_stops_at_invalid_entry(load, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,2")
    t = load(make_fake_nvml())
    assert t.device_identity(0)["uuid"].startswith("GPU-bbbb")
    assert "unavailable" in t.device_identity(1)["nvml"]


def test_init_once_and_handle_cached(load):
    nv = make_fake_nvml()
    t = load(nv)
    for _ in range(5):
        t.device_state(1)
    t.device_identity(1)
    assert nv.calls["nvmlInit"] == 1
    assert nv.calls["nvmlDeviceGetHandleByIndex"] == 1


# ---------------------------------------------------------------- device_state


def test_state_reads_snapshot(load):
    nv = make_fake_nvml()
    nv.devices[0].update(reasons=0x1, util=97)
    state = load(nv).device_state(0)
    assert state == {
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 3201,
        "temperature_c": 41,
        "power_w": 120.5,
        "throttle_reasons": ["gpu_idle"],
        "utilization_gpu_pct": 97,
        "other_processes": [],
    }


@pytest.mark.parametrize("generation", ["event", "throttle"])
def test_throttle_reasons_decoding_both_generations(load, generation):
    nv = make_fake_nvml(throttle_generation=generation)
    nv.devices[0]["reasons"] = 0x4 | 0x8 | 0x20 | 0x40 | 0x80 | 0x2 | 0x8000
    reasons = load(nv).device_state(0)["throttle_reasons"]
    assert reasons == [
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake",
        "unknown_0x8000",
    ]


def test_event_reasons_fall_back_to_throttle_api_on_old_driver(load):
    nv = make_fake_nvml(throttle_generation="throttle")
    # New pynvml on an old driver: the new name exists but the symbol does not.
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: (_ for _ in ()).throw(
        NVMLError("Function Not Found")
    )
    nv.devices[0]["reasons"] = 0x4
    assert load(nv).device_state(0)["throttle_reasons"] == ["sw_power_cap"]


def test_other_processes_exclude_own_pid(load):
    nv = make_fake_nvml()
    nv.devices[0]["procs"] = [(os.getpid(), 512 << 20), (424242, 1 << 30), (31337, None)]
    others = load(nv).device_state(0)["other_processes"]
    assert others == [
        {"pid": 424242, "used_memory_bytes": 1 << 30},
        {"pid": 31337, "used_memory_bytes": None},
    ]


def test_state_unsupported_reading_is_none(load):
    t = load(make_fake_nvml(fail={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses"}))
    state = t.device_state(0)
    assert state["power_w"] is None
    assert state["other_processes"] is None
    assert state["sm_clock_mhz"] == 1980


# ---------------------------------------------------------------- disturbances


def _state(**kw):
    base = {
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 3201,
        "temperature_c": 50,
        "power_w": 400.0,
        "throttle_reasons": [],
        "utilization_gpu_pct": 100,
        "other_processes": [],
    }
    base.update(kw)
    return base


def test_disturbances_clean(load):
    t = load(None)
    assert t.disturbances(_state(), _state()) == []
    benign = _state(throttle_reasons=["gpu_idle", "applications_clocks_setting"])
    assert t.disturbances(benign, benign) == []
    # Within 5 %: clean.
    assert t.disturbances(_state(sm_clock_mhz=1980), _state(sm_clock_mhz=1900)) == []


def test_disturbances_harmful_throttle_in_either_snapshot(load):
    t = load(None)
    reasons = t.disturbances(_state(throttle_reasons=["sw_power_cap"]), _state())
    assert len(reasons) == 1 and "sw_power_cap" in reasons[0] and "before" in reasons[0]
    reasons = t.disturbances(_state(), _state(throttle_reasons=["gpu_idle", "hw_thermal_slowdown"]))
    assert len(reasons) == 1 and "hw_thermal_slowdown" in reasons[0] and "after" in reasons[0]


def test_disturbances_other_process_reported_once(load):
    t = load(None)
    proc = {"pid": 4242, "used_memory_bytes": 2 << 30}
    reasons = t.disturbances(_state(other_processes=[proc]), _state(other_processes=[proc]))
    assert len(reasons) == 1 and "4242" in reasons[0] and "2048 MiB" in reasons[0]


def test_disturbances_sm_clock_change(load):
    t = load(None)
    reasons = t.disturbances(_state(sm_clock_mhz=1980), _state(sm_clock_mhz=1755))
    assert len(reasons) == 1 and "1980 -> 1755" in reasons[0]
    assert t.disturbances(_state(sm_clock_mhz=1755), _state(sm_clock_mhz=1980)) != []


def test_disturbances_temperature_limit(load):
    t = load(None)
    hot = _state(temperature_c=88)
    assert len(t.disturbances(_state(), hot)) == 1
    assert t.disturbances(_state(), hot, temperature_limit_c=90) == []


def test_disturbances_missing_telemetry_adds_no_reason(load):
    t = load(None)
    unavailable = {"nvml": "unavailable: no driver"}
    assert t.disturbances(unavailable, unavailable) == []
    partial = _state(sm_clock_mhz=None, temperature_c=None, throttle_reasons=None, other_processes=None)
    assert t.disturbances(partial, _state()) == []


# ---------------------------------------------------------------- Fingerprint

H200 = dict(
    gpu_name="NVIDIA H200",
    compute_capability="9.0",
    memory_total_bytes=150_754_820_096,
    driver_version="580.159.04",
    cuda_driver_version="13.0",
    nvrtc_version="13.0",
    cuda_bindings_version="13.0.1",
    power_limit_w=700.0,
    ecc=True,
    mig=False,
    uuid="GPU-aaaa1111-0000-0000-0000-000000000000",
    sm_count=132,
    l2_bytes=50 * 2**20,
    timing_hold=True,
)


def test_key_is_stable_and_short():
    fp = Fingerprint(**H200)
    # Pinned: a change here silently orphans every stored baseline. Unheld (the field absent, or
    # False) is the key from before the field; held launches have a key of their own.
    assert fp.key() == Fingerprint(**H200).key() == "fa49d57efd6d06cb"
    assert Fingerprint(**{**H200, "timing_hold": None}).key() == Fingerprint(**{**H200, "timing_hold": False}).key() \
        == "54a671c5540c4076"
    assert differences(Fingerprint(**{**H200, "timing_hold": None}), Fingerprint(**{**H200, "timing_hold": False})) == []
    assert len(fp.key()) == 16 and int(fp.key(), 16) >= 0


def test_key_ignores_uuid_bindings_and_l2():
    fp = Fingerprint(**H200)
    other_card = Fingerprint(**{**H200, "uuid": "GPU-ffff", "cuda_bindings_version": "12.9.0", "l2_bytes": 1})
    assert fp.key() == other_card.key()
    assert differences(fp, other_card) == []


@pytest.mark.parametrize(
    "field, value",
    [
        ("gpu_name", "NVIDIA H100 80GB HBM3"),
        ("compute_capability", "10.0"),
        ("memory_total_bytes", 85_520_809_984),
        ("driver_version", "575.57.08"),
        ("cuda_driver_version", "12.9"),
        ("nvrtc_version", "12.8"),
        ("power_limit_w", 600.0),
        ("ecc", False),
        ("mig", True),
        ("sm_count", 114),
        ("timing_hold", False),
        ("timing_hold", None),  # a baseline recorded before launches were held
    ],
)
def test_every_key_field_changes_key_and_is_reported(field, value):
    assert field in KEY_FIELDS
    a, b = Fingerprint(**H200), Fingerprint(**{**H200, field: value})
    assert a.key() != b.key()
    assert differences(a, b) == [(field, H200[field], value)]


def test_power_limit_normalised_to_whole_watts():
    a = Fingerprint(**{**H200, "power_limit_w": 700})
    b = Fingerprint(**{**H200, "power_limit_w": 699.9999})
    assert a.key() == b.key() and differences(a, b) == []


def test_round_trip_and_unknown_keys_ignored():
    fp = Fingerprint(**H200)
    assert Fingerprint.from_dict(fp.to_dict()) == fp
    assert Fingerprint.from_dict({**fp.to_dict(), "added_later": 1}) == fp
    minimal = {k: H200[k] for k in list(H200)[:7]}
    assert Fingerprint.from_dict(minimal).ecc is None


def test_describe():
    assert Fingerprint(**H200).describe() == (
        "NVIDIA H200 (sm_90, 132 SMs) driver 580.159.04 CUDA 13.0 NVRTC 13.0 "
        "power 700 W ECC on MIG off launches held"
    )
    bare = Fingerprint(**{**H200, "power_limit_w": None, "ecc": None, "sm_count": None, "timing_hold": None})
    assert bare.describe() == (
        "NVIDIA H200 (sm_90) driver 580.159.04 CUDA 13.0 NVRTC 13.0 power n/a ECC n/a MIG off launches unheld"
    )
