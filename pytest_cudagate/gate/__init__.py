"""The gate: a kernel's case prepared, measured by its route, judged and decided (replay.py)."""

from pytest_cudagate.gate.job import CaseJob, baseline_timing, case_data_problem
from pytest_cudagate.gate.options import GateOptions
from pytest_cudagate.gate.replay import Gate
from pytest_cudagate.gate.verdict import decide

__all__ = ["CaseJob", "Gate", "GateOptions", "baseline_timing", "case_data_problem", "decide"]
