"""Every package of the source tree ships in a built install (an editable one would hide a gap)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {folder: name for name, folder in config["package-dir"].items()}
    found = set()
    for init in ROOT.rglob("__init__.py"):
        relative = init.parent.relative_to(ROOT)
        top = relative.parts[0]
        if top not in mapped or any(part.startswith(".") for part in relative.parts):
            continue
        found.add(".".join([mapped[top], *relative.parts[1:]]))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
