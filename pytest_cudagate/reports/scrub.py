"""Keep secrets out of everything a report writes.

Values of environment variables whose names look secret are masked wherever they appear, in the
document before rendering and again in each finished text (JSON, HTML, markdown, annotations),
including the forms JSON, HTML and workflow-command escaping would turn them into.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from typing import Any

SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
ALWAYS_SECRET = ("CUDAGATE_SIGNING_KEY", "OPENAI_API_KEY")
# Shorter values ("1", "true", "off") are flags, not secrets; masking them would shred the text.
MIN_SECRET_LENGTH = 6
MASK = "***"


def secret_values(environ: Mapping[str, str]) -> list[str]:
    found = set()
    for name, value in environ.items():
        upper = name.upper()
        if upper in ALWAYS_SECRET or any(part in upper for part in SECRET_NAME_PARTS):
            for candidate in (value, value.strip()):
                if len(candidate) >= MIN_SECRET_LENGTH:
                    found.add(candidate)
    return sorted(found)


def _variants(secret: str) -> set[str]:
    escaped_command = secret.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
            html.escape(secret), html.escape(secret, quote=False), escaped_command}


class Scrubber:
    """Masks the secrets of ``environ`` (default: this process's environment)."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        values = secret_values(os.environ if environ is None else environ)
        # Longest first, so a secret that contains another is masked whole.
        self.secrets = sorted({v for s in values for v in _variants(s) if v}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def data(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string (keys included) scrubbed."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value
