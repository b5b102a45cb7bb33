"""Files in, files out: the only functions the Snakemake scripts call."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.cell.load import _read_optional, load_cell
from commscope.contracts import METRIC_TABLES, WIRE_FLOWS_FILE
from commscope.metrics._common import _concat
from commscope.metrics.counters import (
    DEFAULT_BIN_MS,
    SHAPE_COLUMNS,
    THROUGHPUT_COLUMNS,
    throughput,
    traffic_shape,
)
from commscope.metrics.crosscheck import crosscheck, matrix_check
from commscope.metrics.framework import WIRE_COLUMNS, wire_vs_framework
from commscope.metrics.matrix import comm_matrix, node_matrix
from commscope.metrics.sockets import socket_stats
from commscope.metrics.steps import step_times, training_window
from commscope.metrics.summary import cell_summary
from commscope.metrics.volume import message_sizes, op_volume


def compute_cell_metrics(cell_dir: Path, out_dir: Path) -> None:
    """Compute every per-cell metric table of ``cell_dir`` and write them to ``out_dir``.

    Writes summary, op_volume (per rank), msg_sizes, throughput (bins 1/10/100 ms stacked,
    column ``bin_ms``), shape (inside the training window), step_times, wire, comm_matrix
    (rank x rank bytes per measured step), node_matrix (node x node), crosscheck (wire vs
    recorded ops per node and direction, :func:`crosscheck`), matrix_check (node x node
    matrix vs the captured ``wire_flows.parquet`` when the cell has one,
    :func:`matrix_check`) and sockets (TCP's rtt, cwnd and retransmissions per node,
    :func:`socket_stats`), each as ``<name>.parquet``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = load_cell(Path(cell_dir))
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
        tables["throughput"] = _concat(
            (throughput(traces.counters, b) for b in DEFAULT_BIN_MS),
            [*params, *THROUGHPUT_COLUMNS],
        )
        tables["shape"] = (
            traffic_shape(traces.counters, training_window(st), DEFAULT_BIN_MS)
            if not st.empty
            else pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
        )
        tables["wire"] = wire_vs_framework(traces.ops, traces.counters, traces.meta)
    tables["crosscheck"] = crosscheck(traces)
    tables["matrix_check"] = matrix_check(traces, _read_optional(Path(cell_dir) / WIRE_FLOWS_FILE))
    tables["sockets"] = socket_stats(traces)
    for name in METRIC_TABLES:
        tables[name].to_parquet(out_dir / f"{name}.parquet", index=False)


def aggregate_cells(metric_dirs: list[Path], out_dir: Path) -> None:
    """Concatenate each metric table across cells into ``out_dir/<table>.parquet``.

    Tables carry their cell parameters, so this is a plain concat. A table no cell produced is
    still written (empty) so downstream rules always find their inputs.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in METRIC_TABLES:
        frames = [
            pd.read_parquet(p) for d in metric_dirs if (p := Path(d) / f"{name}.parquet").exists()
        ]
        non_empty = [f for f in frames if not f.empty]
        if non_empty:
            table = pd.concat(non_empty, ignore_index=True)
        elif frames:
            table = frames[0]
        else:
            table = pd.DataFrame()
        table.to_parquet(out_dir / f"{name}.parquet", index=False)
