"""Project settings from ``[tool.cudagate]`` in pyproject.toml (all optional)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudagate.errors import FileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_KEYS = {"suites", "arch", "timeout_s", "trusted_keys"}


@dataclass(frozen=True)
class Settings:
    root: Path
    suites: tuple[str, ...] = ()
    arch: str | None = None  # compile target when no GPU is present
    timeout_s: float | None = None  # per-case watchdog
    trusted_keys: tuple[str, ...] = field(default_factory=tuple)


def load_settings(root: Path) -> Settings:
    path = root / "pyproject.toml"
    if not path.is_file():
        return Settings(root)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FileError(path, [f"cannot read [tool.cudagate]: {exc}"]) from None
    return settings_from_table(root, data.get("tool", {}).get("cudagate", {}), path)


def settings_from_table(root: Path, raw: dict, path) -> Settings:
    """Settings from a ``[tool.cudagate]`` table already parsed (``path`` names it in errors)."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise FileError(path, [f"tool.cudagate: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}"])
    return Settings(
        root=root,
        suites=tuple(raw.get("suites", ())),
        arch=raw.get("arch"),
        timeout_s=raw.get("timeout_s"),
        trusted_keys=tuple(raw.get("trusted_keys", ())),
    )
