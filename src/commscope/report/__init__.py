"""The study report: :class:`StudyResults` loads the study's result files once,
:mod:`.sections` (one module per section) and :mod:`.findings` compute the report's tables and
sentences from it, :mod:`.render` writes them, with the figures, into one self-contained HTML
file."""

from commscope.report.findings import FINDINGS, study_findings
from commscope.report.render import render_report, software_versions
from commscope.report.results import StudyResults
from commscope.report.sections import SECTIONS
from commscope.report.sections.overview import strategy_table

__all__ = [
    "FINDINGS",
    "SECTIONS",
    "StudyResults",
    "render_report",
    "software_versions",
    "strategy_table",
    "study_findings",
]
