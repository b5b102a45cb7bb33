"""Imported traces (config ``imports:``): each imported trace's summary, in one table."""

from __future__ import annotations

from commscope.report.sections._base import Section

_IMPORTS_INTRO = (
    "Traces recorded by others on GPU clusters (config imports:), loaded into "
    "the same ops table: per-step volume and op mix. Their op tables, message sizes "
    "and communication matrices are under results/imports/."
)

SECTION = Section("Imported traces", _IMPORTS_INTRO, lambda results: results.table("imports"))
