"""The study report: :mod:`.sections` assembles its tables from the result files, :mod:`.render`
writes them, with the figures, into one self-contained HTML file."""

from commscope.report.render import render_report, software_versions
from commscope.report.sections import findings, strategy_table, study_tables

__all__ = ["findings", "render_report", "software_versions", "strategy_table", "study_tables"]
