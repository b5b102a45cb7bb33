"""Files in, files out: the only functions the Snakemake scripts call.

The workflow's scripts call :func:`write_cell_metrics` and :func:`aggregate_tables` (which also
writes the derived study tables, :data:`~commscope.contracts.STUDY_TABLES`) with the files
their rules declare (no directory from which the package would pick names);
:func:`compute_cell_metrics` and :func:`aggregate_cells` are the directory-based conveniences
for tests and interactive use, with the contract's file names (:mod:`commscope.contracts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from commscope.cell.load import CellTraces, load_cell_files, read_optional
from commscope.contracts import (
    CELL_FILE,
    COUNTERS_FILE,
    METRIC_TABLES,
    OPS_FILE,
    ROUTING_FILE,
    SOCKETS_FILE,
    STEPS_FILE,
    STUDY_TABLES,
    WIRE_FLOWS_FILE,
    table_file,
)
from commscope.metrics._common import _concat
from commscope.metrics.counters import (
    DEFAULT_BIN_MS,
    SHAPE_COLUMNS,
    THROUGHPUT_COLUMNS,
    throughput_table,
    traffic_shape,
)
from commscope.metrics.crosscheck import crosscheck, matrix_check
from commscope.metrics.framework import WIRE_COLUMNS, wire_vs_framework
from commscope.metrics.matrix import comm_matrix, node_matrix
from commscope.metrics.sockets import socket_stats
from commscope.metrics.steps import step_times, training_window
from commscope.metrics.study import STUDY_SOURCES, derive_study_tables
from commscope.metrics.summary import cell_summary
from commscope.metrics.volume import message_sizes, op_volume


def cell_metric_tables(traces: CellTraces, wire_flows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Every per-cell metric table of one cell, by name (:data:`METRIC_TABLES`).

    summary, op_volume (per rank), msg_sizes, throughput (bins 0.1/1/10/100 ms stacked, column
    ``bin_ms``; the 0.1 ms bins only inside the training window, :func:`throughput_table`),
    shape (inside the training window, the same bins), step_times, wire, comm_matrix (rank x
    rank bytes per measured step), node_matrix (node x node), crosscheck (wire vs recorded ops
    per node and direction, :func:`crosscheck`), matrix_check (node x node matrix vs the
    captured ``wire_flows`` when the cell has them, :func:`matrix_check`) and sockets (TCP's
    rtt, cwnd and retransmissions per node, :func:`socket_stats`).
    """
    params = traces.params
    st = step_times(traces.steps, traces.warmup_steps)
    # The same measured steps as the summary: steps that issued no op still count as steps.
    measured_steps = st.loc[~st["warmup"].astype(bool), "step"] if not st.empty else []
    rank_mat = comm_matrix(
        traces.ops, traces.warmup_steps, measured_steps=measured_steps, backend=traces.backend
    )
    node_mat = node_matrix(rank_mat)
    tables: dict[str, pd.DataFrame] = {
        "summary": cell_summary(traces, node_mat=node_mat),
        "comm_matrix": rank_mat,
        "node_matrix": node_mat,
        "op_volume": op_volume(traces.ops, per_rank=True),
        "msg_sizes": message_sizes(traces.ops, traces.warmup_steps),
        "step_times": st,
    }
    if traces.counters.empty:
        tables["throughput"] = pd.DataFrame(columns=[*params, *THROUGHPUT_COLUMNS])
        tables["shape"] = pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
        tables["wire"] = pd.DataFrame(columns=[*params, *WIRE_COLUMNS])
    else:
        window = training_window(st) if not st.empty else None
        tables["throughput"] = _concat(
            [throughput_table(traces.counters, window, DEFAULT_BIN_MS)],
            [*params, *THROUGHPUT_COLUMNS],
        )
        tables["shape"] = (
            traffic_shape(traces.counters, window, DEFAULT_BIN_MS)
            if window is not None
            else pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
        )
        tables["wire"] = wire_vs_framework(traces.ops, traces.counters, traces.meta)
    tables["crosscheck"] = crosscheck(traces)
    tables["matrix_check"] = matrix_check(traces, wire_flows)
    tables["sockets"] = socket_stats(traces)
    return tables


def write_cell_metrics(
    cell: Path,
    ops: Path,
    steps: Path,
    outputs: Mapping[str, Path],
    counters: Path | None = None,
    routing: Path | None = None,
    sockets: Path | None = None,
    wire_flows: Path | None = None,
) -> None:
    """Compute one cell's metric tables from its trace files (``cell`` = cell.json, ``ops``,
    ``steps``, ``counters``, ``routing`` = moe.parquet, ``sockets``, ``wire_flows``; missing
    optional ones count as empty, see :func:`~commscope.cell.load.load_cell_files`) and write
    each to ``outputs[name]`` for every name of :data:`METRIC_TABLES`
    (:func:`cell_metric_tables`)."""
    missing = [name for name in METRIC_TABLES if name not in outputs]
    if missing:
        raise ValueError(f"write_cell_metrics: no output path for tables {missing}")
    traces = load_cell_files(cell, ops, steps, counters, routing, sockets)
    tables = cell_metric_tables(traces, read_optional(wire_flows))
    for name in METRIC_TABLES:
        Path(outputs[name]).parent.mkdir(parents=True, exist_ok=True)
        tables[name].to_parquet(outputs[name], index=False)


def compute_cell_metrics(cell_dir: Path, out_dir: Path) -> None:
    """:func:`write_cell_metrics` for a cell's trace directory ``cell_dir``, writing
    ``<name>.parquet`` for every table into ``out_dir`` (a convenience for tests)."""
    cell_dir, out_dir = Path(cell_dir), Path(out_dir)
    write_cell_metrics(
        cell=cell_dir / CELL_FILE,
        ops=cell_dir / OPS_FILE,
        steps=cell_dir / STEPS_FILE,
        outputs={name: out_dir / table_file(name) for name in METRIC_TABLES},
        counters=cell_dir / COUNTERS_FILE,
        routing=cell_dir / ROUTING_FILE,
        sockets=cell_dir / SOCKETS_FILE,
        wire_flows=cell_dir / WIRE_FLOWS_FILE,
    )


def aggregate_tables(inputs: Mapping[str, Sequence[Path]], outputs: Mapping[str, Path]) -> None:
    """Concatenate each metric table across cells: ``inputs[name]`` (one file per cell; a
    missing file is skipped) into ``outputs[name]``, for every metric table named in
    ``outputs``; then derive every study table of :data:`STUDY_TABLES` named in ``outputs``
    (:func:`~commscope.metrics.study.derive_study_tables`) from the concatenated
    :data:`STUDY_SOURCES` as written, which ``outputs`` must then name too.

    Tables carry their cell parameters, so this is a plain concat. A table no cell produced is
    still written (empty) so downstream rules always find their inputs.
    """
    for name, out in outputs.items():
        if name in STUDY_TABLES:
            continue
        frames = [pd.read_parquet(p) for p in inputs.get(name, ()) if Path(p).exists()]
        non_empty = [f for f in frames if not f.empty]
        if non_empty:
            table = pd.concat(non_empty, ignore_index=True)
        elif frames:
            table = frames[0]
        else:
            table = pd.DataFrame()
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(out, index=False)
    derived = [name for name in STUDY_TABLES if name in outputs]
    if not derived:
        return
    missing = [name for name in STUDY_SOURCES if name not in outputs]
    if missing:
        raise ValueError(f"aggregate_tables: study tables need the aggregated {missing}")
    # Read back what was written, so the study tables see exactly the files a reader sees.
    study = derive_study_tables({name: pd.read_parquet(outputs[name]) for name in STUDY_SOURCES})
    for name in derived:
        Path(outputs[name]).parent.mkdir(parents=True, exist_ok=True)
        study[name].to_parquet(outputs[name], index=False)


def aggregate_cells(metric_dirs: list[Path], out_dir: Path) -> None:
    """:func:`aggregate_tables` over directories: every table of :data:`METRIC_TABLES` from
    ``<dir>/<table>.parquet`` of each of ``metric_dirs`` into ``out_dir/<table>.parquet``,
    and the :data:`STUDY_TABLES` derived from them beside."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    aggregate_tables(
        {name: [Path(d) / table_file(name) for d in metric_dirs] for name in METRIC_TABLES},
        {name: out_dir / table_file(name) for name in (*METRIC_TABLES, *STUDY_TABLES)},
    )
