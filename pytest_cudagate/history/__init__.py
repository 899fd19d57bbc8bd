"""The run history: every timed case of the gate's reports, by commit, in one SQLite file.

``cudagate history record REPORT_DIR`` stores a report's timed cases with their commit's facts from
git (:mod:`.record`, :mod:`.commit`, :mod:`.store`); ``cudagate history show --out DIR`` writes the
trend page and its CSV and JSON exports (:mod:`.series`, :mod:`.chart`, :mod:`.page`, :mod:`.export`).
"""
