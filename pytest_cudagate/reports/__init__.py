"""Evidence of a gate run: report.json + report.html, GitHub job summary and annotations,
pytest-benchmark JSON, and merging of reports from matrix jobs.

Everything renders from the report document (``schemas/report.schema.json``), never from live
GPU state, so a recorded report re-renders, merges and converts on a CPU-only machine.
"""
