"""Reporting: terminal summary tables, `kfray status`, and the HTML report with its plots.

Submodules: `summary` (end-of-run table), `data` (read-only access to a run database),
`status` (live status tables), `plots` (matplotlib PNGs), `html` (report.html).
"""
from kfray.report.summary import print_summary, summary_table

__all__ = ["print_summary", "summary_table"]
