"""``--proposer autotune``: no model; a search over the -D constants a suite declares.

The kernel's ``tunables`` (``{NAME: [default, other, ...]}``) span the space; ``tuning_launch``
(or the kernel's launch) gives each point its launch, its expressions using the tunables' names.
Round 1 times the defaults and their neighbours (one tunable moved one step in sorted order);
every later round the unvisited neighbours of the best points so far, topped up with random
points. A point whose launch breaks a hardware limit on a visible case is skipped without costing
an attempt. The source is the suite's own kernel: nothing here is written by a model.
"""

from __future__ import annotations

import itertools
import math
import random

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.suite.expr import ExprError
from pytest_cudagate.optimize.candidate import Candidate, launch_problems
from pytest_cudagate.optimize.proposers import ProposerExhausted, RoundContext

DEFAULT_BATCH = 8
ENUMERATE_LIMIT = 200_000


class AutotuneProposer:
    name = "autotune"
    supports_repair = False

    def __init__(self, suite, program, visible, *, batch: int = DEFAULT_BATCH, seed: int = 0):
        if not program.tunables:
            raise CudagateError(f"kernel {program.name!r} of {suite.path} declares no tunables: add e.g. "
                                "`tunables: {TILE: [16, 8, 32]}` (and `tuning_launch` if the launch depends on "
                                "them) to use --proposer autotune")
        self.program = program
        self.visible = list(visible)
        self.batch = max(1, int(batch))
        self.rng = random.Random(seed)
        self.names = list(program.tunables)
        self.default = tuple(values[0] for values in program.tunables.values())
        self.axes = [sorted(values) for values in program.tunables.values()]
        self.size = math.prod(len(a) for a in self.axes)
        self.source = program.source.read_text(encoding="utf-8")
        self.launch = program.tuning_launch or program.launch
        self.overrides = dict(program.tuning_overrides)
        self.seen: set[tuple] = set()
        self.skipped: dict[tuple, str] = {}

    def describe(self) -> dict:
        return {"tunables": {n: list(v) for n, v in self.program.tunables.items()}, "space": self.size,
                "launch": self.launch.to_json(), "batch": self.batch}

    def candidate(self, point: tuple) -> Candidate | None:
        values = dict(zip(self.names, point))
        launch = self.launch.with_constants(values)
        overrides = {case: l.with_constants(values) for case, l in self.overrides.items()}
        for case in self.visible:
            try:
                problems = launch_problems(overrides.get(case.name, launch), case)
            except ExprError as exc:
                problems = [str(exc)]
            if problems:
                self.skipped[point] = problems[0]
                return None
        label = " ".join(f"{n}={v}" for n, v in values.items() if len(self.program.tunables[n]) > 1) or "defaults"
        return Candidate(source=self.source, launch=launch, launch_overrides=overrides, defines=values,
                         origin="autotune", label=label, notes=f"tunables {values}")

    def _neighbours(self, point: tuple) -> list[tuple]:
        found = []
        for axis, values in enumerate(self.axes):
            index = values.index(point[axis])
            for step in (-1, 1):
                if 0 <= index + step < len(values):
                    found.append(point[:axis] + (values[index + step],) + point[axis + 1:])
        self.rng.shuffle(found)
        return found

    def _random(self) -> list[tuple]:
        if self.size <= ENUMERATE_LIMIT:
            rest = [p for p in itertools.product(*self.axes) if p not in self.seen]
            self.rng.shuffle(rest)
            return rest
        return [tuple(self.rng.choice(a) for a in self.axes) for _ in range(self.batch * 20)]

    def propose(self, context: RoundContext) -> list[Candidate]:
        scores: dict[tuple, float] = {}
        for attempt in context.history:
            cand = attempt.candidate
            if cand.origin == "autotune" and cand.defines:
                point = tuple(cand.defines.get(n) for n in self.names)
                scores[point] = attempt.geomean_ms if attempt.passed and attempt.geomean_ms else math.inf
        ranked = [p for p, s in sorted(scores.items(), key=lambda kv: kv[1]) if math.isfinite(s)]
        order = [self.default] if self.default not in self.seen else []
        for point in ranked[:3] or [self.default]:
            order += self._neighbours(point)
        batch: list[Candidate] = []
        for source in (order, None):
            for point in source if source is not None else self._random():
                if len(batch) >= self.batch:
                    break
                if point in self.seen:
                    continue
                self.seen.add(point)
                made = self.candidate(point)
                if made is not None:
                    batch.append(made)
        if not batch:
            raise ProposerExhausted(f"all {self.size} points of the tunable space were tried or skipped "
                                    f"({len(self.skipped)} break a launch limit)")
        return batch

    def close(self) -> None:
        pass
