"""Wire vs recorded ops (docs/crossvalidation.md): per strategy and per cell, does the wire
agree with what the ranks recorded? From the aggregated ``crosscheck`` and ``matrix_check``
tables."""

from __future__ import annotations

import pandas as pd

from commscope.metrics import crosscheck_by_strategy
from commscope.metrics.study import crosscheck_per_cell
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section

_CROSSCHECK_STRATEGY_INTRO = (
    "Cross-validation of the two measurement levels (docs/crossvalidation.md). "
    "For every cell, the bytes each node's interface counted during the training window "
    "against the bytes its recorded ops imply under the algorithms the backend really "
    "runs (gloo: all-reduce rings, reduce-scatter as a full all-reduce, binomial "
    "broadcast, pairwise all-to-all), plus 66 B of headers per counted packet and gloo's "
    "48 B message preambles. A cell passes when the unexplained rest is at most 2 % of "
    "the ops' bytes (or 4 KB per step) on every node and direction. ratio = wire / ops, "
    "headers included."
)
_CROSSCHECK_CELL_INTRO = (
    "wire/ops: the cell's transmitted bytes on the wire over the bytes its ops "
    "imply (headers included, so slightly above 1). unexplained_max_pct: the largest "
    "share left unexplained on any node and direction. unresolved_max_pct: the largest "
    "share the counters saw inside a bin straddling a window edge (one 100 µs bin with the "
    "BPF source, one sample interval with the /proc sampler), which counts on either side. "
    "pairs_passed: node pairs whose "
    "bytes on the wire (the receivers' BPF ingress by sender, or the packet-header capture) "
    "agree with the "
    "framework node x node matrix within the same tolerance. agree = both checks pass."
)


def crosscheck_cells(results: StudyResults) -> pd.DataFrame:
    """One row per cell: does the wire agree with the recorded ops? The aggregated
    ``crosscheck`` and ``matrix_check`` tables through
    :func:`commscope.metrics.study.crosscheck_per_cell`."""
    return crosscheck_per_cell(results.table("crosscheck"), results.table("matrix_check"))


def crosscheck_strategies(results: StudyResults) -> pd.DataFrame:
    """Per strategy: cells that passed the cross-validation and the spread of their ratios
    (from the aggregated ``crosscheck`` table)."""
    if not results.exists("crosscheck"):
        return pd.DataFrame()
    return crosscheck_by_strategy(results.table("crosscheck"))


PER_STRATEGY = Section(
    "Wire vs recorded ops, per strategy", _CROSSCHECK_STRATEGY_INTRO, crosscheck_strategies
)
PER_CELL = Section(
    "Wire vs recorded ops, per cell", _CROSSCHECK_CELL_INTRO, crosscheck_cells, place="detail"
)
