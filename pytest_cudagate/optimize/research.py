"""``--nvidia-research``: a tool the model may call to search local optimisation notes.

The user points ``--research-dir`` at a folder of notes (Markdown, text, HTML: NVIDIA's CUDA best
practices, the project's own findings). Nothing is fetched: the tool ranks paragraphs of those
files by BM25 against the model's query and returns the best few excerpts. Files are read only
from inside the folder (links leading out of it are ignored).
"""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pytest_cudagate.boundary import walk

SUFFIXES = {".md", ".markdown", ".txt", ".rst", ".html", ".htm"}
MAX_FILE_BYTES = 4 << 20
MAX_FILES = 2000
CHUNK_CHARS = 900
MAX_RESULT_CHARS = 4000
_WORD = re.compile(r"[a-z0-9_]+")
_TAG = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.DOTALL | re.IGNORECASE)

TOOL = {
    "type": "function",
    "function": {
        "name": "search_notes",
        "description": "Search the engineer's local folder of CUDA optimisation notes (NVIDIA guides, past findings). "
                       "Returns a few relevant excerpts with their file names.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "keywords, e.g. 'register blocking shared memory bank conflicts'"}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


@dataclass
class Chunk:
    file: str
    text: str
    terms: Counter


class Notes:
    def __init__(self, folder: Path):
        self.folder = Path(folder).resolve()
        if not self.folder.is_dir():
            raise FileNotFoundError(f"research folder {folder} does not exist")
        self.chunks: list[Chunk] = []
        for path in walk(self.folder, "research folder")[:MAX_FILES * 4]:
            if len({c.file for c in self.chunks}) >= MAX_FILES:
                break
            try:
                real = path.resolve()
                if self.folder not in real.parents or not real.is_file() or real.suffix.lower() not in SUFFIXES:
                    continue
                if real.stat().st_size > MAX_FILE_BYTES:
                    continue
                text = real.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if real.suffix.lower() in (".html", ".htm"):
                text = html.unescape(_TAG.sub(" ", text))
            self._add(str(path.relative_to(self.folder)), text)
        self.df = Counter()
        for chunk in self.chunks:
            self.df.update(set(chunk.terms))
        self.avg = sum(sum(c.terms.values()) for c in self.chunks) / max(len(self.chunks), 1)

    def _add(self, name: str, text: str) -> None:
        buffer = ""
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = re.sub(r"[ \t]+", " ", paragraph.strip())
            if not paragraph:
                continue
            if buffer and len(buffer) + len(paragraph) > CHUNK_CHARS:
                self.chunks.append(Chunk(name, buffer, Counter(_WORD.findall(buffer.lower()))))
                buffer = ""
            buffer = f"{buffer}\n\n{paragraph}" if buffer else paragraph
        if buffer:
            self.chunks.append(Chunk(name, buffer, Counter(_WORD.findall(buffer.lower()))))

    def search(self, query: str, k: int = 4) -> list[Chunk]:
        words = _WORD.findall(query.lower())
        n = len(self.chunks)
        scored = []
        for chunk in self.chunks:
            length = sum(chunk.terms.values())
            score = 0.0
            for w in words:
                tf = chunk.terms.get(w, 0)
                if not tf:
                    continue
                idf = math.log(1 + (n - self.df[w] + 0.5) / (self.df[w] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / max(self.avg, 1)))
            if score > 0:
                scored.append((score, chunk))
        scored.sort(key=lambda s: -s[0])
        return [c for _, c in scored[:k]]

    def answer(self, query: str) -> str:
        hits = self.search(query)
        if not hits:
            return f"no notes match {query!r}"
        out, used = [], 0
        for chunk in hits:
            piece = f"[{chunk.file}]\n{chunk.text}"
            if used + len(piece) > MAX_RESULT_CHARS:
                piece = piece[:max(0, MAX_RESULT_CHARS - used)]
            out.append(piece)
            used += len(piece)
            if used >= MAX_RESULT_CHARS:
                break
        return "\n\n---\n\n".join(out)
