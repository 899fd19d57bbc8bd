"""``cudagate optimize``: a bounded search for a faster kernel that must pass the same gate.

A proposer (a model behind an OpenAI-compatible endpoint, an autotuner over the suite's declared
tunables, or a replay of recorded proposals) suggests CUDA source and launch configurations; the
harness compiles and checks each on the suite's visible cases and times the ones that pass; the
fastest (geometric mean over the performance cases) must then pass the full gate against the
approved kernel, holdout cases and fresh inputs included, before it is called the winner. Every
attempt, model exchange and measurement lands in an audit pack, ``results/run-NNN/``.

Modules: :mod:`.loop` (the rounds), :mod:`.candidate` (what a proposal is and the checks it passes
before any GPU time), :mod:`.evaluator` (the harness and the gate), :mod:`.budgets`,
:mod:`.proposers`, :mod:`.pack` (the audit pack), :mod:`.charts` (SVG of the search), :mod:`.heatmap`,
:mod:`.report`, :mod:`.gitpropose`,
:mod:`.progress`, :mod:`.cli`.
"""
