"""Device facts a launch expression may read (``grid: [sm_count * 4]``): the GPU the process holds.

A launch is resolved on the host before the worker runs it, so the facts come from the worker's
hello (:func:`use`, called where a worker is opened, session.open_worker). Without a GPU
(``cudagate check``, an approval's diff, the optimizer's checks) they are an H100 SXM's, the
:data:`STAND_IN`: such a launch is checked against the device limits with those values, and on
the GPU the gate resolves it again with the card's own.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping

FACTS = ("sm_count", "max_shared_per_block", "warp_size")
# An H100 SXM (sm_90): 132 SMs, 227 KiB of shared memory a block may opt in to, warps of 32.
STAND_IN = {"sm_count": 132, "max_shared_per_block": 232448, "warp_size": 32}
STAND_IN_TEXT = "without a GPU, device facts are an H100 SXM's: " + ", ".join(f"{k} = {v}" for k, v in STAND_IN.items())

_held: dict[str, int] | None = None  # the facts of the worker this process holds, if any


def from_description(device: Mapping) -> dict[str, int]:
    """The facts of a worker's device description (its hello's ``device``); a fact it lacks keeps
    the stand-in's value."""
    seen = {"sm_count": device.get("sm_count"), "max_shared_per_block": device.get("max_shared_per_block_optin"),
            "warp_size": device.get("warp_size")}
    return {name: int(value) if isinstance(value, int) else STAND_IN[name] for name, value in seen.items()}


def use(facts: dict[str, int] | None) -> None:
    """The facts of the worker just opened (None: it closed)."""
    global _held
    _held = dict(facts) if facts is not None else None


def current() -> dict[str, int]:
    """The held GPU's facts, or the stand-in's without one."""
    return _held if _held is not None else STAND_IN


def with_facts(scalars: Mapping, facts: Mapping | None = None) -> ChainMap:
    """``scalars`` with the device facts behind them: a scalar of the same name wins, so a suite
    that already had a scalar ``warp_size`` keeps its meaning."""
    return ChainMap(scalars, current() if facts is None else facts)
