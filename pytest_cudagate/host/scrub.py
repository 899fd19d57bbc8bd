"""Keep secrets out of everything a report writes.

Values of environment variables whose names look secret are masked wherever they appear, in the
document before rendering and again in each finished text (JSON, HTML, markdown, annotations),
including the forms JSON, HTML and workflow-command escaping would turn them into. A secret is
masked whole, each of its lines alone (a key's PEM body line printed without its armour), and any
run of :data:`MIN_FRAGMENT` or more of its characters without white space (a message clipped in the
middle of a key, a key quoted in pieces).
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Mapping
from typing import Any

SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
ALWAYS_SECRET = ("CUDAGATE_SIGNING_KEY", "OPENAI_API_KEY")
# Shorter values ("1", "true", "off") are flags, not secrets; masking them would shred the text.
MIN_SECRET_LENGTH = 6
# A piece of a secret this long is masked wherever it appears: 96 bits of a base64 key, and longer than
# the words and hashes of a report share with one by chance.
MIN_FRAGMENT = 16
_GRAM = MIN_FRAGMENT // 2  # every piece of MIN_FRAGMENT characters holds a whole _GRAM at any stride of _GRAM
MASK = "***"


def secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret (its value is masked, and a child
    process that runs a pull request's code does not get it)."""
    upper = name.upper()
    return upper in ALWAYS_SECRET or any(part in upper for part in SECRET_NAME_PARTS)


def secret_values(environ: Mapping[str, str]) -> list[str]:
    found = set()
    for name, value in environ.items():
        if secret_name(name):
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
        lines = {line.strip() for value in values for line in value.splitlines()}
        whole = {v for s in [*values, *lines] if len(s) >= MIN_SECRET_LENGTH for v in _variants(s) if v}
        # Longest first, so a secret that contains another is masked whole.
        self.secrets = sorted(whole, key=len, reverse=True)
        pieces = {v for s in values for word in s.split() for v in _variants(word) if len(v) >= MIN_FRAGMENT}
        # Every _GRAM characters of each piece, with where they stand in it.
        self._grams: dict[str, list[tuple[str, int]]] = {}
        for piece in pieces:
            for start in range(len(piece) - _GRAM + 1):
                self._grams.setdefault(piece[start:start + _GRAM], []).append((piece, start))
        alphabet = "".join(re.escape(c) for c in sorted({c for piece in pieces for c in piece}))
        # Stretches of text made of the pieces' characters alone: the only places a piece can be.
        self._stretch = re.compile(f"[{alphabet}]{{{MIN_FRAGMENT},}}") if pieces else None

    def _mask_pieces(self, match: re.Match) -> str:
        stretch = match.group()
        spans = []
        for at in range(0, len(stretch) - _GRAM + 1, _GRAM):
            for piece, start in self._grams.get(stretch[at:at + _GRAM], ()):
                left, right = at, at + _GRAM
                while left > 0 and left - at + start > 0 and stretch[left - 1] == piece[left - at + start - 1]:
                    left -= 1
                while (right < len(stretch) and right - at + start < len(piece)
                       and stretch[right] == piece[right - at + start]):
                    right += 1
                if right - left >= MIN_FRAGMENT:
                    spans.append((left, right))
        if not spans:
            return stretch
        parts, end = [], 0
        for left, right in sorted(spans):
            if left > end:
                parts += [stretch[end:left], MASK]
            elif not parts:
                parts.append(MASK)
            end = max(end, right)
        return "".join(parts) + stretch[end:]

    def text(self, value: str) -> str:
        """``value`` with its secrets masked (``value`` itself where it holds none)."""
        masked = value
        for secret in self.secrets:
            if secret in masked:
                masked = masked.replace(secret, MASK)
        if self._stretch is not None:
            masked = self._stretch.sub(self._mask_pieces, masked)
        return value if masked == value else masked

    def data(self, value: Any) -> Any:
        """``value`` (JSON-like) with every string, keys included, scrubbed: a copy where anything was
        masked, ``value`` itself where nothing was (a report of thousands of items holds millions of
        numbers, and copying them is most of the time)."""
        if not self.secrets and self._stretch is None:
            return value
        return self._data(value)

    def _data(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            items = [(self.text(k) if isinstance(k, str) else k, self._data(v)) for k, v in value.items()]
            same = all(k is old_k and v is old_v for (k, v), (old_k, old_v) in zip(items, value.items()))
            return value if same else dict(items)
        if isinstance(value, (list, tuple)):
            if all(type(v) is float or type(v) is int for v in value):  # timing samples: nothing to mask
                return value
            items = [self._data(v) for v in value]
            return value if all(new is old for new, old in zip(items, value)) else items
        return value
