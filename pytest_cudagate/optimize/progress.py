"""Terminal progress: the round, what is happening now, and the best so far (``rich`` if installed).

On a terminal a status line shows the current stage; every judged attempt prints one line. Without
a terminal (CI logs) or without rich, the same lines are printed plainly.
"""

from __future__ import annotations

import sys


def _us(ms) -> str:
    return "–" if ms is None else f"{ms * 1000:.2f} µs"


class Progress:
    def __init__(self, *, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.console = None
        self.status = None
        if quiet:
            return
        try:
            from rich.console import Console

            self.console = Console(file=self.stream, highlight=False)
        except ImportError:
            self.console = None

    def _print(self, text: str, style: str | None = None) -> None:
        if self.quiet:
            return
        if self.console is not None:
            self.console.print(text, style=style, markup=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def stage(self, round_: int, rounds: int, text: str, best=None) -> None:
        if self.quiet:
            return
        line = f"round {round_}/{rounds} · {text}"
        if best is not None and best.geomean_ms:
            line += f" · best {_us(best.geomean_ms)} ({best.speedup:.2f}× the initial)"
        if self.console is not None and self.console.is_terminal:
            if self.status is None:
                self.status = self.console.status(line)
                self.status.start()
            else:
                self.status.update(line)

    def attempt(self, attempt, best) -> None:
        label = attempt.candidate.label if attempt.candidate is not None else "answer"
        head = f"  [{attempt.index:>3}] round {attempt.round}{f' repair {attempt.repair}' if attempt.repair else ''} {label}"
        if attempt.passed:
            mark = " ★ best" if best is attempt and attempt.index else ""
            self._print(f"{head}: passed, geomean {_us(attempt.geomean_ms)}, {attempt.speedup:.2f}× the initial{mark}",
                        "green" if mark else None)
        else:
            reason = (attempt.rejection or "").strip().splitlines()
            self._print(f"{head}: rejected at {attempt.stage}: {reason[0][:140] if reason else ''}", "red")

    def validated(self, attempt, validation) -> None:
        if validation.passed:
            self._print(f"  gate: attempt {attempt.index} passed every case (holdout included) against the approved kernel",
                        "bold green")
        else:
            first = (validation.rejection or "").splitlines()
            self._print(f"  gate: attempt {attempt.index} REJECTED: {first[0][:200] if first else ''}", "bold red")

    def note(self, text: str) -> None:
        self._print(text, "yellow")

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
