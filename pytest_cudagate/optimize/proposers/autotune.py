"""``--proposer autotune``: no model; a search over the -D constants a suite declares.

The kernel's ``tunables`` (``{NAME: [default, other, ...]}``) span the space; ``tuning_launch``
(or the kernel's launch) gives each point its launch, its expressions using the tunables' names;
``tuning_source`` (or the kernel's source) is the file every candidate is built from. A point is
feasible when its launch resolves on every visible case within the hardware's limits (threads and
block dimensions, shared memory, whole numbers: ``BN / TN`` with TN not dividing BN is refused).

The search is successive halving around a model, so a handful of rounds find the good region of
a space of hundreds of points:

- round 1 times the default and a space-filling sample of the feasible set (each next point the
  one farthest from those already chosen);
- every later round keeps the best measured points (the batch's half in round 2, halving each
  round, at least three), gathers the unmeasured feasible points near them (one or two tunables
  moved one step, a seeded sample of the pairs past 64 moves, and mixtures of two of them), ranks
  those by an additive model of log latency fitted to every measurement so far, and times the
  best-ranked ones; one point per round (of a batch of four or more) still goes to the farthest
  unmeasured point, so a wrong model cannot trap the search.

Shape classes (a case's ``class:``) are searched separately: each class's objective is the
geometric mean over its visible performance cases, and every round's batch is split between the
classes, each planning its share from its own elite, neighbours and model (every point is still
timed on every visible case, so each measurement informs every class). After the rounds,
:meth:`AutotuneProposer.compose` offers one more candidate when a class's best point beats the
shared default (the best point over all classes) there by more than the suite's threshold: the
shared default's source plus, for each such class, a variant with that point's ``-D`` options and
launch (the suite's ``classes:``). The loop times it like any candidate, and the gate judges it
with every variant, so it wins only if it is faster as it would ship.

Ties are broken by a random generator seeded by ``--seed``: the same seed and the same timings
give the same candidates. The source is the suite's own file: nothing here is written by a model.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, read_text
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.suite.expr import ExprError
from pytest_cudagate.suite.model import Variant
from pytest_cudagate.optimize.candidate import Candidate, ClassChoice, launch_problems
from pytest_cudagate.optimize.proposers import ProposerExhausted, RoundContext

DEFAULT_BATCH = 8
ENUMERATE_LIMIT = 20_000  # larger spaces are searched through a random pool of feasible points
POOL_SIZE = 4096
# Pairs of one-step moves tried around each elite point: every pair up to 64 moves (32 tunables
# inside their range), a seeded sample beyond, so a round's cost grows with the tunables, not their square.
MAX_PAIRS = 2016
RIDGE = 0.1  # keeps the fit defined with fewer measurements than coefficients


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
        self.scalars = {c.name: suite.scalars(c) for c in self.visible}  # derived ones included
        self.threshold = suite.threshold
        self.case_class = {c.name: c.shape_class for c in suite.cases}
        perf = [c for c in self.visible if c.kind == "performance"]
        # class -> its visible performance cases, in suite order (one entry: nothing to split)
        self.classes = {name: [c.name for c in perf if c.shape_class == name]
                        for name in dict.fromkeys(c.shape_class for c in perf)}
        self.batch = max(1, int(batch))
        self.rng = random.Random(seed)
        self.names = list(program.tunables)
        self.default = tuple(values[0] for values in program.tunables.values())
        self.axes = [sorted(values) for values in program.tunables.values()]
        # each value's position on its axis, scaled to 0..1 (axes are sorted, so steps are neighbours)
        self._positions = [{v: i / max(1, len(values) - 1) for i, v in enumerate(values)} for values in self.axes]
        self.size = math.prod(len(a) for a in self.axes)
        self.source_path = program.tuning_source or program.source
        self.source = read_text(self.source_path, MAX_SOURCE_BYTES, "tuning source")
        self.launch = program.tuning_launch or program.launch
        self.overrides = dict(program.tuning_overrides)
        self.seen: set[tuple] = set()
        self.skipped: dict[tuple, str] = {}
        self._made: dict[tuple, Candidate | None] = {}
        self._feasible: list[tuple] | None = None

    def describe(self) -> dict:
        return {"tunables": {n: list(v) for n, v in self.program.tunables.items()}, "space": self.size,
                "feasible": len(self.feasible()), "source": self.source_path.name, "launch": self.launch.to_json(),
                "batch": self.batch, "strategy": "successive halving around an additive model of log latency",
                "classes": {name: list(cases) for name, cases in self.classes.items()}}

    # -- the space ------------------------------------------------------------------------------------

    def candidate(self, point: tuple) -> Candidate | None:
        """The candidate at ``point``, or None when its launch breaks a limit on a visible case."""
        if point in self._made:
            return self._made[point]
        values = dict(zip(self.names, point))
        launch = self.launch.with_constants(values)
        overrides = {case: l.with_constants(values) for case, l in self.overrides.items()}
        made = None
        for case in self.visible:
            try:
                problems = launch_problems(overrides.get(case.name, launch), case, self.scalars[case.name])
            except ExprError as exc:
                problems = [str(exc)]
            if problems:
                self.skipped[point] = problems[0]
                break
        else:
            made = Candidate(source=self.source, launch=launch, launch_overrides=overrides, defines=values,
                             origin="autotune", label=self._label(point), notes=f"tunables {values}")
        self._made[point] = made
        return made

    def feasible(self) -> list[tuple]:
        """Every feasible point (or, for a huge space, a fixed random pool of them), in a fixed order."""
        if self._feasible is None:
            if self.size <= ENUMERATE_LIMIT:
                points = itertools.product(*self.axes)
            else:
                points = sorted({tuple(self.rng.choice(a) for a in self.axes) for _ in range(POOL_SIZE)})
            self._feasible = [p for p in points if self.candidate(p) is not None]
        return self._feasible

    def _coords(self, point: tuple) -> tuple[float, ...]:
        return tuple(positions[v] for v, positions in zip(point, self._positions))

    def _farthest(self, chosen: list[tuple], count: int) -> list[tuple]:
        """Up to ``count`` unmeasured feasible points, each the farthest from ``chosen`` and those before it."""
        rest = [p for p in self.feasible() if p not in self.seen and p not in chosen]
        self.rng.shuffle(rest)  # ties go to a seeded draw, not to the enumeration order
        if not rest:
            return []
        coords = np.array([self._coords(p) for p in rest])
        anchors = [self._coords(p) for p in chosen]
        nearest = (np.min([np.abs(coords - np.array(a)).sum(axis=1) for a in anchors], axis=0) if anchors
                   else np.full(len(rest), np.inf))
        picked = []
        for _ in range(min(count, len(rest))):
            index = int(np.argmax(nearest))
            picked.append(rest[index])
            nearest = np.minimum(nearest, np.abs(coords - coords[index]).sum(axis=1))
            nearest[index] = -1.0
        return picked

    def _near(self, elite: list[tuple]) -> list[tuple]:
        """Unmeasured feasible points one or two steps from an elite point, or mixing two of them."""
        feasible = set(self.feasible())
        found: dict[tuple, None] = {}
        for point in elite:
            index = [values.index(v) for v, values in zip(point, self.axes)]
            moves = [(axis, step) for axis in range(len(self.axes)) for step in (-1, 1)
                     if 0 <= index[axis] + step < len(self.axes[axis])]
            pairs = itertools.combinations(moves, 2)
            if len(moves) * (len(moves) - 1) // 2 > MAX_PAIRS:
                pairs = (tuple(self.rng.sample(moves, 2)) for _ in range(MAX_PAIRS))
            for chosen in itertools.chain(((m,) for m in moves), pairs):
                if len({axis for axis, _ in chosen}) != len(chosen):
                    continue
                moved = list(point)
                for axis, step in chosen:
                    moved[axis] = self.axes[axis][index[axis] + step]
                found[tuple(moved)] = None
        for first, second in itertools.combinations(elite, 2):
            differ = [axis for axis in range(len(self.axes)) if first[axis] != second[axis]]
            for pick in itertools.product((0, 1), repeat=min(len(differ), 10)):
                mixed = list(first)
                for axis, side in zip(differ, pick):
                    if side:
                        mixed[axis] = second[axis]
                found[tuple(mixed)] = None
        return [p for p in found if p in feasible and p not in self.seen]

    def _model(self, scores: dict[tuple, float]):
        """An additive model of log latency over the tunables' values (ridge least squares), as a predictor."""
        columns = {(axis, v): i for i, (axis, v) in
                   enumerate((axis, v) for axis, values in enumerate(self.axes) for v in values)}

        def features(points):
            rows = np.zeros((len(points), len(columns)))
            for r, point in enumerate(points):
                for axis, v in enumerate(point):
                    rows[r, columns[(axis, v)]] = 1.0
            return rows

        points = list(scores)
        x = features(points)
        y = np.log([scores[p] for p in points])
        mean = float(y.mean())
        weights = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(columns)), x.T @ (y - mean))
        return lambda candidates: features(candidates) @ weights + mean

    # -- the rounds -----------------------------------------------------------------------------------

    def _scores(self, history, cases: list[str] | None = None) -> dict[tuple, float]:
        """Geometric-mean latency per measured point (of a single point: no class variants), over
        ``cases`` (default: every visible performance case); inf where it failed."""
        scores: dict[tuple, float] = {}
        for attempt in history:
            cand = attempt.candidate
            if cand is not None and cand.origin == "autotune" and cand.defines and not cand.classes:
                point = tuple(cand.defines.get(n) for n in self.names)
                if cases is None:
                    score = attempt.geomean_ms
                else:
                    values = [attempt.anchored.get(name) for name in cases]
                    score = (math.exp(sum(math.log(v) for v in values) / len(values))
                             if values and all(v and v > 0 for v in values) else None)
                scores[point] = score if attempt.passed and score else math.inf
        return scores

    def _plan(self, context: RoundContext) -> list[tuple]:
        scores = self._scores(context.history)
        measured = {p: s for p, s in scores.items() if math.isfinite(s)}
        if not measured:  # round 1, or nothing has passed yet: cover the space
            start = [self.default] if self.default not in self.seen and self.candidate(self.default) else []
            return start + self._farthest(start or list(self.seen), self.batch - len(start))
        if len(self.classes) <= 1:
            return self._plan_share(scores, self.batch, context.round, [])
        plan: list[tuple] = []
        share, extra = divmod(self.batch, len(self.classes))
        for number, cases in enumerate(self.classes.values()):  # the batch split between the classes
            plan += self._plan_share(self._scores(context.history, cases), share + (number < extra), context.round, plan)
        return plan

    def _plan_share(self, scores: dict[tuple, float], batch: int, round_number: int, taken: list[tuple]) -> list[tuple]:
        """``batch`` points for one objective (``scores``): near its elite, ranked by its model, and
        one far point; none of them in ``taken`` (another class's share this round)."""
        measured = {p: s for p, s in scores.items() if math.isfinite(s)}
        if not measured or batch <= 0:
            return self._farthest(list(scores) + taken, batch)
        keep = max(3, batch >> max(0, round_number - 1))
        elite = sorted(measured, key=lambda p: (measured[p], p))[:keep]
        explore = 1 if batch >= 4 else 0
        near = [p for p in self._near(elite) if p not in taken]
        self.rng.shuffle(near)
        if near:
            predicted = self._model(measured)(near)
            near = [near[i] for i in np.argsort(predicted, kind="stable")]
        order = near[:batch - explore]
        return order + self._farthest(list(scores) + taken + order, batch - len(order))

    # -- the per-class winner -------------------------------------------------------------------------

    def compose(self, history) -> Candidate | None:
        """One source and per-class variants: the shared default (the best point over every visible
        performance case) and, for each class whose own best point is faster there by more than the
        suite's threshold, that point as the class's variant. None when no class gains (one build
        serves them all) or there is only one class."""
        if len(self.classes) <= 1:
            return None
        overall = {p: s for p, s in self._scores(history).items() if math.isfinite(s)}
        if not overall:
            return None
        shared = min(overall, key=lambda p: (overall[p], p))
        base = self.candidate(shared)
        shared_values = dict(zip(self.names, shared))
        variants, choices, chosen = {}, {}, {}
        for name, cases in self.classes.items():
            scores = {p: s for p, s in self._scores(history, cases).items() if math.isfinite(s)}
            if shared not in scores:  # the shared point has no time on this class's cases: nothing to compare
                choices[name] = ClassChoice(shared_values, False, (
                    f"shared default: {self._label(shared)} (no measured point covers every visible performance "
                    f"case of class {name}, so it keeps the shared build)"))
                continue
            best = min(scores, key=lambda p: (scores[p], p))
            best_label = self._label(best)
            if best != shared and scores[best] < scores[shared] * (1 - self.threshold):
                made = self.candidate(best)
                chosen[name] = made
                variants[name] = Variant(
                    options=tuple(f"-D{n}={v}" for n, v in zip(self.names, best) if v != shared_values[n]),
                    launch=made.launch if made.launch != base.launch else None)
                choices[name] = ClassChoice(dict(zip(self.names, best)), True, (
                    f"class {name}: {best_label} ({scores[best] * 1000:.2f} µs geomean over its {len(cases)} visible "
                    f"performance case(s), {scores[shared] / scores[best]:.2f}× faster there than the shared default "
                    f"{self._label(shared)}); best of {len(scores)} measured points in the class"))
            else:
                choices[name] = ClassChoice(shared_values, False, (
                    f"shared default: {self._label(shared)} (best geomean over every class, {overall[shared] * 1000:.2f} µs"
                    + (f"; also the class's best of {len(scores)} measured points)" if best == shared else
                       f"; the class's best point {best_label} is within {self.threshold:.0%} of it here, "
                       f"{scores[shared] / scores[best]:.3f}×)")))
        if not variants:
            return None
        overrides = dict(base.launch_overrides)
        for case, launch in self.overrides.items():  # a case's tuning override follows its class's point
            made = chosen.get(self.case_class.get(case))
            if made is not None:
                overrides[case] = made.launch_overrides[case]
        label = "per class: " + "; ".join(f"{name} {self._label(tuple(c.defines[n] for n in self.names))}"
                                          for name, c in choices.items())
        return Candidate(source=self.source, launch=base.launch, launch_overrides=overrides, defines=shared_values,
                         origin="autotune", label=label, notes=f"shared default {shared_values}; class variants "
                         + ", ".join(f"{n}: {list(v.options)}" for n, v in variants.items()),
                         classes=variants, choices=choices)

    def _label(self, point: tuple) -> str:
        values = dict(zip(self.names, point))
        return " ".join(f"{n}={v}" for n, v in values.items() if len(self.program.tunables[n]) > 1) or "defaults"

    def propose(self, context: RoundContext) -> list[Candidate]:
        batch: list[Candidate] = []
        for point in self._plan(context):
            if point in self.seen:
                continue
            self.seen.add(point)
            made = self.candidate(point)
            if made is not None:
                batch.append(made)
        if not batch:
            raise ProposerExhausted(f"all {len(self.feasible())} feasible points of the tunable space "
                                    f"({self.size} in all, {len(self.skipped)} break a launch limit) were tried")
        return batch

    def close(self) -> None:
        pass
