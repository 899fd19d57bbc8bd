"""Settings: ``[tool.cudagate]`` in pyproject.toml (all optional), the command-line options, and
every default, resolved once (:func:`resolve`) for each entry point.

Precedence: an option given on the command line, then ``[tool.cudagate]``, then the default here.
Light on purpose: the pytest plugin imports this module on every pytest run.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudagate import boundary
from pytest_cudagate.errors import FileError

_KEYS = {"suites", "arch", "timeout_s", "trusted_keys", "release_tags", "include"}

DEFAULT_ARCH = "sm_90"  # compile target when no GPU is present (the H200's)
DEFAULT_TIMEOUT_S = 60.0  # watchdog per case: a kernel silent for longer is killed
DEFAULT_BUDGET_S = 2.0  # measurement time per performance case of the interleaved comparison
DEFAULT_LOCK_TIMEOUT_S = 600.0  # wait for another gate run to release the GPU
LOCK_TIMEOUT_HELP = f"wait this long for another run to release the GPU (default {DEFAULT_LOCK_TIMEOUT_S:g})"
DEFAULT_RELEASE_TAGS = "v*"  # tags that name releases: the release gate's default reference is the newest


@dataclass(frozen=True)
class Settings:
    root: Path
    suites: tuple[str, ...] = ()
    arch: str | None = None  # compile target when no GPU is present
    timeout_s: float | None = None  # per-case watchdog
    trusted_keys: tuple[str, ...] = field(default_factory=tuple)
    release_tags: str = DEFAULT_RELEASE_TAGS  # fnmatch pattern of release tags
    include: tuple[str, ...] = ()  # folders of shared headers, searched after a kernel's own folder

    def include_folders(self) -> tuple[Path, ...]:
        """``include`` as folders of :attr:`root`, each checked on disk: a folder, inside the project, and
        reached through no link that leads out of it (:class:`FileError` naming pyproject.toml)."""
        folders, problems = [], []
        root = Path(os.path.realpath(self.root))
        for entry in self.include:
            folder = self.root / entry
            real = Path(os.path.realpath(folder))
            fix = "name a folder of the project, by its path from pyproject.toml's folder"
            link = _first_link(self.root, entry)
            if real != root and root not in real.parents:
                problems.append(f"tool.cudagate.include: {entry[:80]!r} leads out of the project (to {str(real)[:120]}) "
                                f"through a link; {fix}, with no link out of it")
            elif link is not None:
                # A pull request decides what a link in the checkout points to, though the setting is the
                # trusted commit's: one to ".git" or "." would hand the compiler the repository's config.
                problems.append(f"tool.cudagate.include: {entry[:80]!r} passes through the link {link[:80]!r}; {fix}, "
                                "reached through no link")
            elif real == root or ".git" in real.relative_to(root).parts:
                problems.append(f"tool.cudagate.include: {entry[:80]!r} is the project's root or lies in .git; {fix} "
                                "that holds headers only")
            elif not real.is_dir():
                problems.append(f"tool.cudagate.include: {entry[:80]!r} is not a folder of the project; {fix}")
            else:
                folders.append(folder)
        if problems:
            raise FileError(self.root / "pyproject.toml", problems)
        return tuple(folders)


def _first_link(root: Path, entry: str) -> str | None:
    """The first part of ``entry`` (below ``root``) that is a symbolic link, as written; None if none is."""
    place = root
    for part in Path(entry).parts:
        place = place / part
        if place.is_symlink():
            return str(place.relative_to(root))
    return None


def settings_problems(raw: dict) -> list[str]:
    """Each ``[tool.cudagate]`` value against its type and a sane range (a PR may edit pyproject.toml)."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        return [f"tool.cudagate: unknown key(s) {', '.join(unknown)[:200]}; allowed: {', '.join(sorted(_KEYS))}"]
    problems = []
    for key in ("suites", "trusted_keys", "include"):
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
    release_tags = raw.get("release_tags", DEFAULT_RELEASE_TAGS)
    if not isinstance(release_tags, str) or not release_tags.strip() or len(release_tags) > 200:
        problems.append(f"tool.cudagate.release_tags: {str(release_tags)[:60]!r} is not a tag pattern; give one string "
                        f"such as \"{DEFAULT_RELEASE_TAGS}\" or \"release-*\" (fnmatch syntax)")
    return problems


def load_settings(root: Path) -> Settings:
    path = root / "pyproject.toml"
    if not path.is_file():
        return Settings(root)
    # here, not at the top: the plugin's options import this module on every pytest run
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        data = tomllib.loads(boundary.read_text(path, boundary.MAX_SETTINGS_BYTES, "project file"))
    except (OSError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise FileError(path, [f"cannot read [tool.cudagate]: {str(exc)[:200] or 'nested too deeply'}"]) from None
    return settings_from_table(root, cudagate_table(data, path), path)


def cudagate_table(document: dict, path) -> dict:
    """``[tool.cudagate]`` of a parsed pyproject.toml, ``{}`` when it has none. Anything but a table is
    refused (``path`` names the file): every command and the gate read the same settings or none."""
    tool = document.get("tool", {})
    raw = tool.get("cudagate", {}) if isinstance(tool, dict) else tool
    if not isinstance(raw, dict):
        key = "tool.cudagate" if isinstance(tool, dict) else "tool"
        raise FileError(path, [f"{key}: expected a table, not a {type(raw).__name__}; write the settings as a "
                               "[tool.cudagate] table, e.g. suites = [\"path/to/suite\"]"])
    return raw


def settings_from_table(root: Path, raw: dict, path) -> Settings:
    """Settings from a ``[tool.cudagate]`` table already parsed (``path`` names it in errors)."""
    problems = settings_problems(raw)
    if problems:
        raise FileError(path, problems)
    return Settings(
        root=root,
        suites=tuple(raw.get("suites", ())),
        arch=raw.get("arch"),
        timeout_s=raw.get("timeout_s"),
        trusted_keys=tuple(raw.get("trusted_keys", ())),
        release_tags=raw.get("release_tags", DEFAULT_RELEASE_TAGS),
        include=tuple(raw.get("include", ())),
    )


@dataclass(frozen=True)
class GateConfig:
    """What one gate run uses, every value resolved (see the module's precedence)."""

    arch: str = DEFAULT_ARCH
    timeout_s: float = DEFAULT_TIMEOUT_S
    budget_s: float = DEFAULT_BUDGET_S
    threshold: float | None = None  # None: each suite's gate.threshold
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    strict: bool = False
    release: bool = False
    release_ref: str | None = None  # None: the newest release tag (see release_tags); only with release
    release_tags: str = DEFAULT_RELEASE_TAGS
    fresh_seed: int | None = None
    allow_unsigned: bool = False
    require_gpu: bool = False
    include: tuple[Path, ...] = ()  # the include folders of [tool.cudagate] (the trusted commit's, under a trust root)


def resolve(settings: Settings, *, arch: str | None = None, timeout_s: float | None = None, **options) -> GateConfig:
    """The run's configuration: command-line values (None when not given; each checked as the command
    line was parsed, :mod:`pytest_cudagate.boundary.options`) over ``settings`` over the defaults.
    ``options`` are the remaining :class:`GateConfig` fields, as given."""
    given = {k: v for k, v in options.items() if v is not None}
    return GateConfig(arch=arch or settings.arch or DEFAULT_ARCH, release_tags=settings.release_tags,
                      include=settings.include_folders(),
                      timeout_s=next(t for t in (timeout_s, settings.timeout_s, DEFAULT_TIMEOUT_S) if t is not None),
                      **given)


def project_root(start: Path) -> Path:
    """The folder of the nearest pyproject.toml at or above ``start`` (``start`` itself if none):
    where the ``cudagate`` commands read ``[tool.cudagate]``, as pytest does from its rootdir."""
    start = Path(start).resolve()
    folder = start if start.is_dir() else start.parent
    return next((p for p in (folder, *folder.parents) if (p / "pyproject.toml").is_file()), folder)


def project_config(where, **given) -> GateConfig:
    """:func:`resolve` for a ``cudagate`` command working on ``where`` (a suite, or a path in the project)."""
    path = Path(getattr(where, "path", where))
    return resolve(load_settings(project_root(path)), **given)
