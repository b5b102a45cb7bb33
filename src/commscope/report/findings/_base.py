"""What every finding is made of: a :class:`Finding` (a sentence and the anchor of the section
that holds its numbers, imported from that section's module, never retyped), the comparison
group most findings compare strategies in, and the wording helpers they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from commscope.contracts import is_replay
from commscope.metrics.study import strategy_label, unshaped_rows
from commscope.report.sections import (
    crosscheck,
    overview,
    predictions,
    replay,
    sensitivity,
    structure,
)

# The sections findings link to (their anchors, derived from their titles where they are defined).
RUN = overview.RUN.anchor
STRATEGIES = overview.STRATEGIES.anchor
SENSITIVITY = sensitivity.SECTION.anchor
CROSSCHECK = crosscheck.PER_STRATEGY.anchor
SYNC = structure.SYNC.anchor
TEMPORAL = structure.TEMPORAL.anchor
COMPARE = predictions.TRAFFIC.anchor
TIMING = predictions.STEP_TIME.anchor
PREDICTIONS = predictions.SCENARIOS.anchor
REPLAY = replay.SECTION.anchor


# The research questions the report groups its findings by, in its order (issue 25: a
# report that argues), and where a finding's numbers come from: measured training runs,
# replays of traces, predictions of the analytic model, or checks of the tool itself.
QUESTIONS: tuple[str, ...] = (
    "volume",
    "temporal structure",
    "synchronisation",
    "sensitivity",
    "placement and scale",
    "checks",
)
SOURCES: tuple[str, ...] = ("measured", "replayed", "predicted", "check")


@dataclass(frozen=True)
class Finding:
    """One sentence of the findings list, the report section (anchor) behind it, the research
    question it answers (:data:`QUESTIONS`) and what its numbers come from (:data:`SOURCES`)."""

    text: str
    anchor: str
    question: str = "volume"
    source: str = "measured"

    def __post_init__(self) -> None:
        if self.question not in QUESTIONS:
            raise ValueError(f"Finding.question {self.question!r}: one of {QUESTIONS}")
        if self.source not in SOURCES:
            raise ValueError(f"Finding.source {self.source!r}: one of {SOURCES}")


def comparison_group(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per strategy (mean over repeats and congestion controls) of the unshaped setup
    (model, nodes, ranks per node) that ran the most strategies; empty when none ran two."""
    if summary.empty or "bw_bps" not in summary:
        return pd.DataFrame()
    base = unshaped_rows(summary)
    setup = ["model", "nodes", "ranks_per_node"]
    if base.empty:
        return base
    counts = base.groupby(setup)["strategy"].nunique()
    if counts.max() < 2:
        return base.iloc[:0]
    # Ties: the smallest cluster (the default study's main comparison), then by name.
    best = counts[counts == counts.max()].sort_index(level=["nodes", "ranks_per_node"]).index[0]
    group = base[(base[setup] == pd.Series(best, index=setup)).all(axis=1)]
    return (
        group.groupby("strategy", as_index=False)
        .mean(numeric_only=True)
        .assign(model=best[0], nodes=best[1], ranks_per_node=best[2])
    )


def setup_words(row: Any) -> str:
    rpn = int(row["ranks_per_node"])
    return f"{row['model']} on {int(row['nodes'])} nodes, {rpn} rank{'' if rpn == 1 else 's'} each"


def named(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each replay cell's strategy read as ``replayed NAME``."""
    if frame.empty or "strategy" not in frame or "model" not in frame:
        return frame
    return frame.assign(strategy=strategy_label(frame))


def without_replays(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` that are not replay cells."""
    if frame.empty or "strategy" not in frame:
        return frame
    return frame[~is_replay(frame)]
