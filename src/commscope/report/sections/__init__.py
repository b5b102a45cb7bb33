"""The report's sections, one module each, in the order the page shows them.

Each module defines its :class:`~commscope.report.sections._base.Section` (title, how to read it,
its table built from :class:`~commscope.report.results.StudyResults`); its anchor is derived
from its title, so findings link to it by importing it. The template lays out the first three
itself (:data:`FIXED`: what was run, the summary per strategy, the sensitivity to the link);
:data:`SECTIONS` are shown in this order within their place (:attr:`Section.place`: ``lead``
after the findings, ``main`` after the figures, ``detail`` folded at the end). A new section
is a module here and one line below.
"""

from commscope.report.sections import (
    bench,
    crosscheck,
    export,
    implications,
    imports,
    learning,
    limitations,
    overview,
    predictions,
    replay,
    sensitivity,
    structure,
    wire,
)
from commscope.report.sections._base import Section, anchor, setting_label

# Laid out by the template (report.html.j2), with their fixed ids.
FIXED: tuple[Section, ...] = (overview.RUN, overview.STRATEGIES, sensitivity.SECTION)

SECTIONS: tuple[Section, ...] = (
    implications.SECTION,
    limitations.SECTION,
    wire.SECTION,
    structure.SYNC,
    structure.TEMPORAL,
    crosscheck.PER_STRATEGY,
    crosscheck.PER_CELL,
    predictions.TRAFFIC,
    bench.UTILIZATION,
    bench.FITS,
    predictions.STEP_TIME,
    predictions.SCENARIOS,
    replay.SECTION,
    learning.SECTION,
    imports.SECTION,
    export.SECTION,
)

__all__ = ["FIXED", "SECTIONS", "Section", "anchor", "setting_label"]
