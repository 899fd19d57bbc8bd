"""One escaping per output format, for every string a pull request controls.

A report's names, messages, labels, notes, commands and fingerprints come from a run of the pull
request's code, and so does every report.json another job hands over. Each writer (the job summary,
annotations, report.html, the comment, the history page) puts such text through this module and
escapes nothing by hand:

- :func:`markdown`: GitHub-flavoured Markdown, inline (a table cell, or after other text on a
  line). The text shows exactly its characters on one line: ``\\ ` [ ] | < > & $`` are
  backslash-escaped, so nothing opens a link, image, code span, HTML element, entity, math or table
  column; and a zero-width space goes after what GitHub would link in the rendered text, where
  backslashes are gone (``www.``, ``scheme://``, ``@name``, ``#12``, ``GH-12``, ``a@b.c``).
- :func:`html`: text in an element or a quoted attribute value.

Every format shows a character that does not print as its escape (``\u202e``), so no bidirectional
control reorders what a reader sees.
- :func:`annotation` and :func:`annotation_property`: a workflow command's message and property
  values, by the runner's rules (actions/toolkit ``command.ts``): ``%``, CR and LF become ``%25``,
  ``%0D``, ``%0A``, and in a property ``:`` and ``,`` become ``%3A`` and ``%2C`` as well. So the line
  stays one line, and the first ``::`` after the command's name is the command's own: ``::`` in the
  message is inert text. Other characters that do not print (an escape sequence, which the log
  viewer would obey) are shown as escapes.
"""

from __future__ import annotations

import html as _html
import re
from typing import Any

from pytest_cudagate.reports.fmt import clip

# Marks by which text would make a link, image, code span, HTML, entity, math or a new table column.
# Emphasis marks are left as they are: they only restyle, and names are full of underscores.
_MARKUP = re.compile(r"([\\`\[\]|<>&$])")
# What GitHub links in rendered text: a mention or team (@name), a reference (#12, GH-12, owner/repo#12),
# a URL (scheme://, www.) or an address (a@b.c, mailto:a@b.c).
_LINKED = re.compile(r"[@#](?=\w)|\bgh-(?=\d)|:(?=//)|\bwww(?=\.)", re.IGNORECASE)
ZWSP = "\u200b"


def markdown(value: Any, limit: int | None = None) -> str:
    """``value`` as inline Markdown on one line (cut to ``limit`` characters first, where given) that
    shows exactly its characters and opens, links or mentions nothing."""
    line = " ".join(_shown("" if value is None else str(value)).split())  # a line break would end a table row
    if limit is not None:
        line = clip(line, limit)
    return _LINKED.sub(lambda m: m.group() + ZWSP, _MARKUP.sub(r"\\\1", line))


def html(value: Any) -> str:
    """``value`` as HTML text, also inside a quoted attribute value; None is empty."""
    return _html.escape(_shown("" if value is None else str(value)))


def _shown(text: str) -> str:
    """``text`` with what does not print shown as its escape: a control character, and a format
    character such as U+202E, which would reorder the text around it (a compiler log quotes the pull
    request's source lines); line breaks and tabs stay."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\r\n\t" else repr(c)[1:-1] for c in text)


def annotation(value: Any) -> str:
    """``value`` as a workflow command's message: one line, shown as it was written."""
    return _shown(str(value)).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotation_property(value: Any) -> str:
    """``value`` as a workflow command's property value (``file=``, ``title=``)."""
    return annotation(value).replace(":", "%3A").replace(",", "%2C")
