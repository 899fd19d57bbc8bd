"""NVML telemetry taken inside the GPU worker process.

``device_identity`` says which card and configuration a run used, ``device_state`` is a
cheap snapshot taken before and after a measurement, and ``disturbances`` turns two
snapshots into the reasons the measurement in between is not clean.

Only the standard library and the optional ``pynvml`` (nvidia-ml-py) are used. Telemetry
must never abort a benchmark, so nothing here raises for an unsupported query: a field
NVML cannot read is ``None``, and without NVML at all the readers return
``{"nvml": "unavailable: <reason>"}``.
"""

from __future__ import annotations

import os

# Clock-event ("throttle" before NVML 12.2) reason bits: readable name and NVML constant
# suffix. The bit values come from pynvml under either generation of names, not from here.
_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
    ("board_limit", "BoardLimit"),
    ("reliability", "Reliability"),
)
# Reasons that say why clocks are where they are without the run having been slowed:
# an idle GPU between launches, or clocks pinned on purpose by an administrator.
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting"})
OTHER_PROCESS = "another compute process on the GPU"
TEMPERATURE_LIMIT_C = 85.0

_nv = None  # the pynvml module, once nvmlInit succeeded
_init_error: str | None = None  # why NVML is unusable in this process, once known
_handles: dict[tuple[int, str | None], object] = {}


def _nvml():
    """Import and initialise NVML once per process; return (module, None) or (None, reason)."""
    global _nv, _init_error
    if _nv is None and _init_error is None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, or NVMLError (no driver, no libnvidia-ml)
            _init_error = f"{type(e).__name__}: {e}"
        else:
            _nv = pynvml
    return _nv, _init_error


def _text(value):
    # Older pynvml releases return bytes for strings.
    return value.decode() if isinstance(value, bytes) else value


def _field(fn, *args):
    """One independent reading: any failure (unsupported, no permission, missing API) is None."""
    try:
        return fn(*args)
    except Exception:
        return None


def _call_first(nv, names, *args):
    """Call the first of ``names`` that both pynvml and the driver provide.

    NVML renamed entry points over time (Throttle -> Event, unversioned -> _v2/V): a new
    pynvml may call a symbol an old driver lacks, an old pynvml lacks the new name.
    """
    error: Exception = AttributeError(f"pynvml provides none of {names}")
    for name in names:
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            return fn(*args)
        except Exception as e:  # NVMLError, or pynvml's NVMLLibraryMismatchError
            error = e
    raise error


def _visible_entries(value: str) -> list[str]:
    # CUDA stops enumerating at the first entry it cannot parse (e.g. "-1").
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def _resolve(nv, ordinal: int, pci_bus_id: str | None):
    """NVML handle of CUDA device ``ordinal``.

    NVML ignores CUDA_VISIBLE_DEVICES and enumerates all GPUs in PCI order, so the CUDA
    ordinal is not an NVML index. The PCI bus id (cuDeviceGetPCIBusId) is exact; without
    it the CUDA_VISIBLE_DEVICES entry is interpreted, and numeric entries or an unset
    variable are only right when CUDA also enumerates in PCI order
    (CUDA_DEVICE_ORDER=PCI_BUS_ID, or identical GPUs).
    """
    if pci_bus_id:
        return _call_first(
            nv, ("nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId"), pci_bus_id
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nv.nvmlDeviceGetHandleByIndex(ordinal)
    entries = _visible_entries(visible)
    if not 0 <= ordinal < len(entries):
        raise LookupError(f"CUDA ordinal {ordinal} not in CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[ordinal]
    if entry.isdigit():
        return nv.nvmlDeviceGetHandleByIndex(int(entry))
    try:
        return nv.nvmlDeviceGetHandleByUUID(entry)
    except Exception:
        pass  # CUDA also accepts a unique UUID prefix, which NVML does not: scan.
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        if _text(nv.nvmlDeviceGetUUID(handle)).startswith(entry):
            return handle
    raise LookupError(f"no NVML device matches CUDA_VISIBLE_DEVICES entry {entry!r}")


def _open(ordinal: int, pci_bus_id: str | None):
    """Return (nv, handle, None) or (None, None, unavailable-dict). Handles are cached."""
    nv, error = _nvml()
    if nv is None:
        return None, None, {"nvml": f"unavailable: {error}"}
    key = (ordinal, pci_bus_id)
    handle = _handles.get(key)
    if handle is None:
        try:
            handle = _resolve(nv, ordinal, pci_bus_id)
        except Exception as e:
            where = f"PCI bus id {pci_bus_id}" if pci_bus_id else f"CUDA ordinal {ordinal}"
            return None, None, {"nvml": f"unavailable: no NVML device for {where}: {e}"}
        _handles[key] = handle
    return nv, handle, None


def _cuda_version(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}"  # NVML encodes 13.0 as 13000


def device_identity(ordinal: int, pci_bus_id: str | None = None) -> dict:
    """Static description of the device; each field read on its own, ``None`` if unreadable."""
    nv, h, unavailable = _open(ordinal, pci_bus_id)
    if unavailable:
        return unavailable
    readers = {
        "name": lambda: _text(nv.nvmlDeviceGetName(h)),
        "uuid": lambda: _text(nv.nvmlDeviceGetUUID(h)),
        "pci_bus_id": lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId),
        "compute_capability": lambda: "%d.%d" % tuple(nv.nvmlDeviceGetCudaComputeCapability(h)),
        "memory_total_bytes": lambda: int(nv.nvmlDeviceGetMemoryInfo(h).total),
        "driver_version": lambda: _text(nv.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": lambda: _cuda_version(
            _call_first(nv, ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
        ),
        # NVML reports power in milliwatts.
        "power_limit_w": lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
        "enforced_power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        # Mode getters return [current, pending]; the current mode is what the run saw.
        "ecc": lambda: bool(nv.nvmlDeviceGetEccMode(h)[0]),
        "mig": lambda: bool(nv.nvmlDeviceGetMigMode(h)[0]),
        "persistence_mode": lambda: bool(nv.nvmlDeviceGetPersistenceMode(h)),
        "max_sm_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "applications_sm_clock_mhz": lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM),
        "applications_mem_clock_mhz": lambda: nv.nvmlDeviceGetApplicationsClock(
            h, nv.NVML_CLOCK_MEM
        ),
        "vbios_version": lambda: _text(nv.nvmlDeviceGetVbiosVersion(h)),
    }
    return {name: _field(read) for name, read in readers.items()}


def _reason_names(nv, mask: int) -> list[str]:
    names = []
    for name, suffix in _REASONS:
        bit = getattr(nv, "nvmlClocksEventReason" + suffix, None)
        if bit is None:
            bit = getattr(nv, "nvmlClocksThrottleReason" + suffix, None)
        if bit and mask & bit:
            names.append(name)
            mask &= ~bit
    if mask:
        names.append(f"unknown_0x{mask:x}")
    return names


def _other_processes(nv, h) -> list[dict]:
    # Inside a container, drivers that ignore PID namespaces report host pids, so our
    # own process can show up here under a pid os.getpid() does not know.
    me = os.getpid()
    procs = _call_first(
        nv,
        ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
        h,
    )
    return [
        {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory} for p in procs if p.pid != me
    ]


def device_state(ordinal: int, pci_bus_id: str | None = None) -> dict:
    """Cheap snapshot around a measurement: clocks (MHz), temperature (C), power (W),
    clock-event reasons, GPU utilisation (%), and other compute processes on the GPU."""
    nv, h, unavailable = _open(ordinal, pci_bus_id)
    if unavailable:
        return unavailable
    return {
        "sm_clock_mhz": _field(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        "mem_clock_mhz": _field(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        "temperature_c": _field(
            _call_first,
            nv,
            ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
            h,
            nv.NVML_TEMPERATURE_GPU,
        ),
        "power_w": _field(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        "throttle_reasons": _field(
            lambda: _reason_names(
                nv,
                _call_first(
                    nv,
                    (
                        "nvmlDeviceGetCurrentClocksEventReasons",
                        "nvmlDeviceGetCurrentClocksThrottleReasons",
                    ),
                    h,
                ),
            )
        ),
        "utilization_gpu_pct": _field(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
        "other_processes": _field(_other_processes, nv, h),
    }


def sm_clock_mhz(ordinal: int, pci_bus_id: str | None = None) -> int | None:
    """The SM clock now (MHz), one NVML query; None when NVML cannot read it."""
    nv, h, unavailable = _open(ordinal, pci_bus_id)
    return None if unavailable else _field(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)


def disturbances(
    before: dict,
    after: dict,
    *,
    temperature_limit_c: float = TEMPERATURE_LIMIT_C,
    clock_tolerance: float = 0.05,
) -> list[str]:
    """Reasons the measurement between two ``device_state`` snapshots is not clean.

    An empty list means clean as far as NVML can tell; readings that are missing
    (``None``, or NVML unavailable) add no reason, since absent telemetry is not evidence.
    """
    reasons = []
    for label, state in (("before", before), ("after", after)):
        for reason in state.get("throttle_reasons") or ():
            if reason not in BENIGN_REASONS:
                reasons.append(f"clock event {reason} ({label})")
    seen = set()
    for state in (before, after):
        for proc in state.get("other_processes") or ():
            if proc["pid"] in seen:
                continue
            seen.add(proc["pid"])
            used = proc.get("used_memory_bytes")
            memory = f", {used / 2**20:.0f} MiB" if used is not None else ""
            reasons.append(f"{OTHER_PROCESS} (pid {proc['pid']}{memory})")
    clock0, clock1 = before.get("sm_clock_mhz"), after.get("sm_clock_mhz")
    if clock0 and clock1 is not None and abs(clock1 - clock0) > clock_tolerance * clock0:
        reasons.append(
            f"SM clock changed {clock0} -> {clock1} MHz ({(clock1 - clock0) / clock0:+.1%})"
        )
    for label, state in (("before", before), ("after", after)):
        temperature = state.get("temperature_c")
        if temperature is not None and temperature > temperature_limit_c:
            reasons.append(
                f"temperature {temperature} C above {temperature_limit_c:g} C ({label})"
            )
    return reasons


def card_reasons(reasons: list[str]) -> list[str]:
    """The reasons of :func:`disturbances` that are the card's own state (clock events, a clock
    change, heat), which a kernel may bring on itself, rather than another process."""
    return [reason for reason in reasons if not reason.startswith(OTHER_PROCESS)]


def card_events(state: dict, temperature_limit_c: float = TEMPERATURE_LIMIT_C) -> list[str]:
    """One snapshot's non-benign clock events by name, and ``hot`` above the temperature limit."""
    events = [reason for reason in state.get("throttle_reasons") or () if reason not in BENIGN_REASONS]
    temperature = state.get("temperature_c")
    if temperature is not None and temperature > temperature_limit_c:
        events.append("hot")
    return events
