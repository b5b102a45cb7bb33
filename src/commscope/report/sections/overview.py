"""The two sections at the top of the report, laid out by the template itself: "What was run"
(one row per cell, with its link engine) and "Summary per strategy" (means over each strategy's
cells), both from the aggregated summary."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.contracts import PARAM_COLUMNS
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section
from commscope.units import (
    fmt_bps,
    fmt_bytes,
    fmt_count,
    fmt_ms,
    fmt_pct,
    fmt_ratio,
    fmt_us,
    is_missing,
)

# Per-strategy table: (summary column, header, formatter name); means over the strategy's cells.
STRATEGY_COLUMNS: list[tuple[str, str, str]] = [
    ("step_time_mean_s", "mean step time", "ms"),
    ("framework_bytes_per_step", "framework bytes / step", "bytes"),
    ("messages_per_step", "messages / step", "count"),
    ("internode_bytes_per_step", "inter-node bytes / step (model)", "bytes"),
    ("intranode_bytes_per_step", "intra-node bytes / step (model)", "bytes"),
    ("wire_tx_bytes_per_step_per_node", "wire tx / step / node", "bytes"),
    ("throughput_mean_bps", "mean tx rate / node", "bps"),
    ("peak_to_mean_10ms", "peak / mean (10 ms)", "ratio"),
    ("cov_10ms", "CoV (10 ms)", "ratio"),
    ("wire_over_framework", "wire / framework", "ratio"),
]

FORMATTERS = {
    "bytes": fmt_bytes,
    "bps": fmt_bps,
    "ms": fmt_ms,
    "ratio": fmt_ratio,
    "count": fmt_count,
}


def strategy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (strategy, model): number of cells and the mean of each headline metric over them.

    Means skip NaN (a cell whose counters could not resolve 10 ms bins does not drag the
    burstiness to NaN for the whole strategy). Columns: strategy, model, cells, then the
    summary columns of :data:`STRATEGY_COLUMNS`.
    """
    metrics = [c for c, _, _ in STRATEGY_COLUMNS if c in summary]
    keys = [c for c in ("strategy", "model") if c in summary]
    if summary.empty or not keys:
        return pd.DataFrame(columns=[*keys, "cells", *metrics])
    grouped = summary.groupby(keys, sort=True, dropna=False)
    out = grouped[metrics].mean(numeric_only=False).reset_index()
    out.insert(len(keys), "cells", grouped.size().to_numpy())
    return out


def cells_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the "what was run" table: one row per cell of ``summary``, with
    the link engine that applied its delay, jitter and loss (:func:`link_engine_text`)."""
    params = [c for c in PARAM_COLUMNS if c in summary and c != "cell"]
    header = [*params, "world size", "measured steps", "mean step time", "link engine"]
    # Caps sort by rate, not as strings ("100mbit" < "10mbit"), uncapped last.
    order = [("bw_bps" if c == "bw" and "bw_bps" in summary else c) for c in params] or ["cell"]
    rows = []
    for rec in summary.sort_values(order, na_position="last").to_dict("records"):
        rows.append(
            [
                *(str(rec[c]) for c in params),
                fmt_count(rec.get("world_size")),
                fmt_count(rec.get("measured_steps")),
                fmt_ms(rec.get("step_time_mean_s")),
                link_engine_text(rec),
            ]
        )
    return header, rows


def link_engine_text(rec: dict[str, Any]) -> str:
    """A cell's link engine for the cells table: ``—`` without delay, jitter and loss (a
    summary without the column, from runs before there was one, reads the same), else the
    engine with what it measured where it measured anything (the delayer's mean and p99
    lateness on its worst node, the share of packets its loss rules dropped): ``"nfqueue
    (late 48 µs, p99 1.10 ms)"``."""
    engine = rec.get("link_engine")
    if is_missing(engine) or not str(engine):
        return "—"
    measured = []
    if not is_missing(rec.get("delay_late_us_mean")):
        late, p99 = fmt_us(rec["delay_late_us_mean"]), fmt_us(rec.get("delay_late_us_p99"))
        measured.append(f"late {late}, p99 {p99}")
    if not is_missing(rec.get("loss_measured_pct")):
        measured.append(f"{fmt_pct(rec['loss_measured_pct'])} dropped")
    return f"{engine} ({'; '.join(measured)})" if measured else str(engine)


def strategy_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the per-strategy summary (:func:`strategy_table`), formatted."""
    table = strategy_table(summary)
    keys = [c for c in ("strategy", "model") if c in table]
    present = [(c, h, f) for c, h, f in STRATEGY_COLUMNS if c in table]
    header = [*keys, "cells", *(h for _, h, _ in present)]
    rows = [
        [
            *(str(rec[k]) for k in keys),
            fmt_count(rec["cells"]),
            *(FORMATTERS[f](rec[c]) for c, _, f in present),
        ]
        for rec in table.to_dict("records")
    ]
    return header, rows


def _rows_frame(rows: tuple[list[str], list[list[str]]]) -> pd.DataFrame:
    header, text = rows
    return pd.DataFrame(text, columns=header)


# The template writes these two sections' intros and lays out their tables (text rows).
RUN = Section(
    "What was run",
    "",
    lambda results: _rows_frame(cells_rows(results.summary)),
    fixed_anchor="run",
)
STRATEGIES = Section(
    "Summary per strategy",
    "",
    lambda results: _rows_frame(strategy_rows(results.summary)),
    fixed_anchor="strategies",
)


def unresolved_cells(results: StudyResults) -> int:
    """Cells whose counters could not resolve 10 ms bins (their burstiness is n/a)."""
    summary = results.summary
    if "shape_resolved_10ms" not in summary:
        return 0
    return int((~summary["shape_resolved_10ms"].astype(bool)).sum())
