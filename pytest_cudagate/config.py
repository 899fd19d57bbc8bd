"""Project settings from ``[tool.cudagate]`` in pyproject.toml (all optional)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudagate import boundary
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


def settings_problems(raw: dict) -> list[str]:
    """Each ``[tool.cudagate]`` value against its type and a sane range (a PR may edit pyproject.toml)."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        return [f"tool.cudagate: unknown key(s) {', '.join(unknown)[:200]}; allowed: {', '.join(sorted(_KEYS))}"]
    problems = []
    for key in ("suites", "trusted_keys"):
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 256:
            problems.append(f"tool.cudagate.{key}: expected a list of relative paths (strings), e.g. {key} = [\"...\"]")
            continue
        for entry in value:
            path = Path(entry)
            # An absolute path may name one key file (an organisation's key kept outside the project);
            # folders are walked, so they must lie below the project root.
            outside_file = key == "trusted_keys" and path.is_absolute() and path.suffix == ".pub"
            if not outside_file and (not entry.strip() or path.is_absolute() or ".." in path.parts
                                     or entry.strip() in (".", "./")):
                problems.append(f"tool.cudagate.{key}: {entry[:80]!r} must be a path below the project root "
                                "(not empty, '.', absolute or with '..')"
                                + ("; an absolute path may name one .pub file" if key == "trusted_keys" else ""))
    arch = raw.get("arch")
    if arch is not None and not (isinstance(arch, str) and re.fullmatch(r"sm_[0-9]{2,3}[af]?", arch)):
        problems.append(f"tool.cudagate.arch: expected a compile target like \"sm_90\", not {str(arch)[:40]!r}")
    timeout = raw.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= 86400):
        problems.append(f"tool.cudagate.timeout_s: expected seconds between 0 and 86400, not {str(timeout)[:40]}")
    return problems


def load_settings(root: Path) -> Settings:
    path = root / "pyproject.toml"
    if not path.is_file():
        return Settings(root)
    try:
        data = tomllib.loads(boundary.read_text(path, boundary.MAX_SETTINGS_BYTES, "project file"))
    except (OSError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise FileError(path, [f"cannot read [tool.cudagate]: {str(exc)[:200] or 'nested too deeply'}"]) from None
    raw = data.get("tool", {}).get("cudagate", {}) if isinstance(data.get("tool"), dict) else {}
    problems = settings_problems(raw) if isinstance(raw, dict) else ["tool.cudagate: expected a table"]
    if problems:
        raise FileError(path, problems)
    return Settings(
        root=root,
        suites=tuple(raw.get("suites", ())),
        arch=raw.get("arch"),
        timeout_s=raw.get("timeout_s"),
        trusted_keys=tuple(raw.get("trusted_keys", ())),
    )
