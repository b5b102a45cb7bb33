"""Learning runs: training loss at the first and last step and, for MoE cells, how uneven the
experts' token load was (the learning stage's ``loss`` and ``routing`` tables)."""

from __future__ import annotations

import pandas as pd

from commscope.metrics.learning import learning_table
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, declared

_LEARNING_INTRO = (
    "Training loss at the first and last step (mean over ranks) and, for MoE "
    "cells, the all-to-all non-uniform factor ((max - min) / mean tokens received per "
    "EP rank) at the first and last step."
)


def learning_section(results: StudyResults) -> pd.DataFrame:
    """:func:`commscope.metrics.learning.learning_table` of the learning stage's tables."""
    return learning_table(results.path("learning_loss"), results.path("learning_routing"))


SECTION = Section(
    "Learning runs",
    _LEARNING_INTRO,
    learning_section,
    declared("learning_loss", "learning_routing"),
)
