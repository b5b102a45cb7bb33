"""One cell's analysis, as one workflow job runs it: the raw files to the trace tables
(:mod:`commscope.cell.parse`), the metric tables (:mod:`commscope.metrics.io`), the throughput
figure (:mod:`commscope.plots.cell`) and the exports (:mod:`commscope.export.cell`), each stage
reading what the one before wrote.

One job, not four: a cell's analysis runs between measurements (the measuring job holds every
core), so a study lasts as long as their sum, and a job of its own per stage paid ~1.5-2 s of
CPU for its interpreter and imports against ~0.5 s of work (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from commscope.cell.parse import build_cell_tables
from commscope.contracts import CELL_TABLE_FILES, METRIC_TABLES
from commscope.export.cell import export_cell_files
from commscope.metrics.io import write_cell_metrics
from commscope.plots.cell import plot_cell_throughput
from commscope.spec.settings import CellSettings

# The exports of a cell by output name (export.cell.export_cell_files' arguments).
EXPORT_OUTPUTS = ("perfetto", "chakra", "astra", "flows")


def analyse_cell(
    raw: Path, cell: CellSettings, warmup_steps: int, outputs: Mapping[str, str | Path]
) -> dict[str, Path]:
    """Analyse the cell whose raw directory is ``raw`` into ``outputs``, the job's declared
    files by name: every name of ``CELL_TABLE_FILES`` (the trace tables), ``metrics_<table>``
    for every name of ``METRIC_TABLES``, ``figure`` and the :data:`EXPORT_OUTPUTS`. Returns the
    trace tables' paths by name (what a later stage of the same job reads)."""
    trace = {name: Path(outputs[name]) for name in CELL_TABLE_FILES}
    metrics = {table: Path(outputs[f"metrics_{table}"]) for table in METRIC_TABLES}
    build_cell_tables(raw_dir=raw, cell=cell, warmup_steps=warmup_steps, paths=trace)
    write_cell_metrics(
        cell=trace["cell"],
        ops=trace["ops"],
        steps=trace["steps"],
        outputs=metrics,
        counters=trace["counters"],
        routing=trace["moe"],
        sockets=trace["sockets"],
        wire_flows=trace["wire_flows"],
        host=trace["host"],
        # The senders' egress bins (raw/<node>/wire.parquet): what each capped port was
        # offered, for the fidelity table's shaper check (docs/fidelity.md).
        raw=raw,
    )
    plot_cell_throughput(
        throughput=metrics["throughput"],
        step_times=metrics["step_times"],
        summary=metrics["summary"],
        out_png=Path(outputs["figure"]),
    )
    export_cell_files(
        ops=trace["ops"],
        steps=trace["steps"],
        cell=trace["cell"],
        **{name: Path(outputs[name]) for name in EXPORT_OUTPUTS},
    )
    return trace
