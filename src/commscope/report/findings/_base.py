"""What every finding is made of: a :class:`Finding` (a sentence and the anchor of the section
that holds its numbers, imported from that section's module, never retyped), the comparison
group most findings compare strategies in, and the wording helpers they share."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import is_replay
from commscope.metrics.study import (
    baseline_rows,
    host_limited_mask,
    mean_ci,
    runs_to_separate,
    slowdown_table,
    strategy_label,
)
from commscope.report.sections import (
    crosscheck,
    overview,
    predictions,
    replay,
    sensitivity,
    structure,
)
from commscope.spec.link import ReferenceLink

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


# --------------------------------------------------------------------- host-limited cells


def host_limited_cells(results: Any) -> set[str]:
    """The cells the fidelity monitor marked host-limited (``summary.host_limited``): no finding
    rests on one. A summary without the column (cells not monitored) marks none."""
    summary = results.summary
    if summary.empty or "host_limited" not in summary or "cell" not in summary:
        return set()
    return set(summary.loc[host_limited_mask(summary), "cell"].astype(str))


def kept(results: Any, name: str) -> tuple[pd.DataFrame, int]:
    """``(table, cells left out)``: the table ``name`` without the rows of host-limited cells
    (:func:`host_limited_cells`), and how many of its cells were left out. The slowdown table
    (one row per setting, no cell column) is derived again from the summary's kept rows."""
    limited = host_limited_cells(results)
    if name == "slowdown":
        if not limited:
            return results.slowdown, 0
        summary, n = kept(results, "summary")
        return slowdown_table(summary, results.reference), n
    table = results.table(name)
    if not limited or table.empty or "cell" not in table:
        return table, 0
    out = table["cell"].astype(str).isin(limited)
    return table[~out], int(table.loc[out, "cell"].nunique())


def lost_in(results: Any, unshaped: bool = False, **match: Any) -> int:
    """How many host-limited cells a finding lost: those of the summary in its setup (each
    ``match`` column equal to its value, or in it for a set/list/tuple; only those on the
    reference link with ``unshaped`` (the unshaped ones without a reference,
    :func:`~commscope.metrics.study.baseline_rows`); replays named as ``replayed NAME``)."""
    limited = host_limited_cells(results)
    if not limited:
        return 0
    summary = results.summary
    rows = named(summary[summary["cell"].astype(str).isin(limited)])
    if unshaped:
        rows = baseline_rows(rows, results.reference)
    for col, value in match.items():
        if col in rows:
            values = value if isinstance(value, (set, frozenset, list, tuple)) else {value}
            rows = rows[rows[col].isin(values)]
    return int(rows["cell"].nunique())


def left_out(n: int) -> str:
    """`` (N host-limited cells left out)`` when a finding lost cells to the monitor, else ''."""
    return f" ({n} host-limited cell{'' if n == 1 else 's'} left out)" if n else ""


# --------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Spread:
    """A quantity over repeats: its mean, sample sd (NaN for one), repeats and interval."""

    mean: float
    sd: float
    n: int
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        v = np.asarray([x for x in values if pd.notna(x)], dtype="float64")
        n = len(v)
        mean = float(v.mean()) if n else math.nan
        sd = float(v.std(ddof=1)) if n > 1 else math.nan
        low, high = mean_ci(mean, sd, n)
        return cls(mean, sd, n, low, high)

    @property
    def interval(self) -> str:
        """``95 % CI a-b`` (3 significant digits) or ``one run``/``N runs``, no interval."""
        return self.interval_in(lambda v: f"{v:.3g}")

    def interval_in(self, fmt: Callable[[float], str]) -> str:
        """:attr:`interval` with the bounds written by ``fmt`` (e.g. as milliseconds)."""
        if math.isnan(self.low):
            return "one run" if self.n == 1 else f"{self.n} runs"
        return f"95 % CI {fmt(self.low)}-{fmt(self.high)}, {self.n} runs"


def separated(a: Spread, b: Spread) -> bool:
    """Whether the two intervals exist and do not overlap."""
    if math.isnan(a.low) or math.isnan(b.low):
        return False
    return a.low > b.high or b.low > a.high


def unsettled(a: Spread, b: Spread) -> str:
    """Why ``a`` vs ``b`` is not established, and how many runs would settle it."""
    if a.n < 2 or b.n < 2:
        runs = "one run each" if a.n == b.n == 1 else f"{a.n} and {b.n} runs"
        return f"not established: {runs}, no interval (at least 2 runs each are needed)"
    n = runs_to_separate(a.mean, a.sd, b.mean, b.sd)
    more = f"about {n} runs each would settle it" if n else "the means do not differ"
    return f"not established: their 95 % intervals overlap ({a.n} and {b.n} runs); {more}"


def ordering(hi: Spread, lo: Spread) -> str:
    """'' when ``hi`` and ``lo`` separate, else ``; <why not established>``."""
    return "" if separated(hi, lo) else f"; {unsettled(hi, lo)}"


# --------------------------------------------------------------------- setups


def comparison_group(summary: pd.DataFrame, reference: ReferenceLink | None = None) -> pd.DataFrame:
    """One row per strategy (mean over repeats and congestion controls) of the setup (model,
    nodes, ranks per node) on the ``reference`` link (the unshaped link without one) that ran
    the most strategies; empty when none ran two."""
    if summary.empty or "bw_bps" not in summary:
        return pd.DataFrame()
    base = baseline_rows(summary, reference)
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


def comparison_cells(summary: pd.DataFrame, reference: ReferenceLink | None = None) -> pd.DataFrame:
    """The cells on the ``reference`` link (the unshaped ones without one; every repeat) of the
    :func:`comparison_group`'s setup, under the setup's usual congestion control; empty without
    a group."""
    group = comparison_group(summary, reference)
    if group.empty:
        return group
    first = group.iloc[0]
    base = baseline_rows(summary, reference)
    keep = np.ones(len(base), dtype=bool)
    for col in ("model", "nodes", "ranks_per_node"):
        keep &= (base[col] == first[col]).to_numpy()
    base = base[keep]
    if "cc" in base and len(base):
        base = base[base["cc"] == base["cc"].mode().iloc[0]]
    return base


def in_setup(table: pd.DataFrame, setup: Any) -> pd.DataFrame:
    """The rows of ``table`` in the (model, nodes, ranks per node) of the row ``setup``."""
    keep = np.ones(len(table), dtype=bool)
    for col in ("model", "nodes", "ranks_per_node"):
        if col in table:
            keep &= (table[col] == setup[col]).to_numpy()
    return table[keep]


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
