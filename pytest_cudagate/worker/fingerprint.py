"""What a timing was measured on, and which of that decides whether timings are comparable."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

# Fields whose change can move kernel time, hence the fields of the baseline key.
# Left out on purpose:
# - uuid: a pool of identical cards must share one baseline, or every runner would
#   start from nothing; per-card drift is caught by the run's own disturbance checks.
# - cuda_bindings_version: the Python binding only wraps driver calls; it does not
#   compile or run the kernel, so bumping it must not invalidate baselines.
# - l2_bytes: fixed by the SKU, which gpu_name, memory size and SM count already pin.
KEY_FIELDS = (
    "gpu_name",
    "compute_capability",
    "memory_total_bytes",
    "driver_version",
    "cuda_driver_version",
    "nvrtc_version",
    "power_limit_w",
    "ecc",
    "mig",
    "sm_count",
    "timing_hold",  # in the key only when held: an unheld fingerprint keeps the key it had before the field
)
# Bump when KEY_FIELDS or their normalisation change, unless (as for timing_hold) a new field leaves
# every existing key as it was.
_KEY_SCHEMA = 1


@dataclass(frozen=True)
class Fingerprint:
    gpu_name: str
    compute_capability: str  # "9.0"
    memory_total_bytes: int
    driver_version: str
    cuda_driver_version: str  # "13.0"
    nvrtc_version: str
    cuda_bindings_version: str
    power_limit_w: float | None = None
    ecc: bool | None = None
    mig: bool | None = None
    uuid: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    # The device facts launch expressions read besides sm_count (suite/device.py); fixed by the SKU,
    # as l2_bytes is, so not in the key.
    max_shared_per_block: int | None = None
    warp_size: int | None = None
    # Timed launches held until enqueued (cudagate_harness.driver.Device.hold): unheld, a µs kernel
    # reads up to several µs slower in some launches, so the two never share a baseline. None: a
    # fingerprint recorded before launches were held (unheld).
    timing_hold: bool | None = None

    @classmethod
    def from_dict(cls, data: dict) -> Fingerprint:
        """Build from ``to_dict`` output; unknown keys (from newer versions) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_hello(cls, hello: dict) -> Fingerprint:
        """From a harness worker's hello: CUDA's view of the device plus NVML's identity."""
        device, identity = hello["device"], hello.get("identity") or {}
        return cls(
            gpu_name=device["name"],
            compute_capability=device["compute_capability"],
            memory_total_bytes=device["memory_total_bytes"],
            driver_version=identity.get("driver_version") or "unknown",
            cuda_driver_version=device["cuda_driver_version"],
            nvrtc_version=hello.get("nvrtc_version", "unknown"),
            cuda_bindings_version=hello.get("cuda_bindings_version", "unknown"),
            power_limit_w=identity.get("enforced_power_limit_w") or identity.get("power_limit_w"),
            ecc=identity.get("ecc"),
            mig=identity.get("mig"),
            uuid=device.get("uuid"),
            sm_count=device.get("sm_count"),
            l2_bytes=device.get("l2_bytes"),
            max_shared_per_block=device.get("max_shared_per_block_optin"),
            warp_size=device.get("warp_size"),
            timing_hold=hello.get("timing_hold"),
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def _key_values(self) -> dict:
        values = {name: getattr(self, name) for name in KEY_FIELDS}
        # NVML gives milliwatt-derived floats and JSON may round-trip 700 as 700.0:
        # whole watts keep the key stable across both.
        if values["power_limit_w"] is not None:
            values["power_limit_w"] = round(float(values["power_limit_w"]))
        # None (recorded before the field) and False both mean unheld, which is how launches were then timed.
        values["timing_hold"] = bool(values["timing_hold"])
        return values

    def _key_payload(self) -> dict:
        values = self._key_values()
        if not values["timing_hold"]:
            del values["timing_hold"]
        return values

    def key(self) -> str:
        """Stable 16-hex-digit id of the timing-relevant configuration (see KEY_FIELDS)."""
        payload = json.dumps(
            {"schema": _KEY_SCHEMA, **self._key_payload()}, sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for humans, e.g. "NVIDIA H200 (sm_90, 132 SMs) driver ... MIG off"."""
        sm = "sm_" + self.compute_capability.replace(".", "")
        sms = f", {self.sm_count} SMs" if self.sm_count is not None else ""
        power = f"{self.power_limit_w:.0f} W" if self.power_limit_w is not None else "n/a"
        return (
            f"{self.gpu_name} ({sm}{sms}) driver {self.driver_version} "
            f"CUDA {self.cuda_driver_version} NVRTC {self.nvrtc_version} "
            f"power {power} ECC {_on_off(self.ecc)} MIG {_on_off(self.mig)} launches {_held(self.timing_hold)}"
        )


def _on_off(flag: bool | None) -> str:
    return "n/a" if flag is None else ("on" if flag else "off")


def _held(flag: bool | None) -> str:
    return "held" if flag else "unheld"


def differences(a: Fingerprint, b: Fingerprint) -> list[tuple[str, object, object]]:
    """Key fields that differ, as (field, value in a, value in b), in KEY_FIELDS order."""
    ka, kb = a._key_values(), b._key_values()
    return [(f, getattr(a, f), getattr(b, f)) for f in KEY_FIELDS if ka[f] != kb[f]]


def shown(field: str, value: object) -> str:
    """A key field's value in a message (how launches were timed in words, not True or None)."""
    return f"launches {_held(value)}" if field == "timing_hold" else str(value)
