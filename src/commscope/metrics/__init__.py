"""Metrics of one sweep cell, computed from its trace tables (definitions: docs/traces.md).

Every function here is a pure function of DataFrames and returns a *tidy* DataFrame whose first
columns are the cell parameters (``cell``, ``strategy``, ``model``, ... whichever the input
carries), so tables of many cells aggregate by concatenation and never by parsing paths. Inputs
may hold several cells at once; every computation is done per cell.

Units: bytes, bits per second (``*_bps``), seconds (``*_s``), nanoseconds (``*_ns``,
one clock shared by all nodes). Sizes are SI (1 MB = 10**6 bytes) wherever they are printed.

Definitions worth knowing before reading a number:

* *framework bytes* are the payload bytes of each op's input tensor(s) as each rank recorded
  them, summed over ranks (a send and its matching recv both count, as do the n inputs of an
  n-rank all-reduce). It measures what the framework asks for, not what the wire carries.
* *modelled bytes* are what one rank must transmit for an op under the algorithm its backend
  really runs: gloo's own algorithms (ring all-reduce, reduce-scatter as a full all-reduce,
  binomial-tree broadcast, ...) for gloo cells, the bandwidth-optimal rings and chains that
  NCCL uses for large messages otherwise (see docs/crossvalidation.md).
  ``op_destinations`` (:mod:`commscope.collectives.traffic`) is the one model of who
  sends how much to whom;
  ``ring_send_bytes`` (per-rank totals), :func:`wire_vs_framework` (whose inter-node
  part is compared with the interface counters), :func:`comm_matrix` and the per-cell
  cross-validation (:func:`crosscheck`, :func:`matrix_check`) all derive from it.
* the *communication matrix* (:func:`comm_matrix`, :func:`node_matrix`) gives those bytes
  per measured step for every (sender, receiver) pair of ranks and of nodes; its node
  diagonal is traffic inside a node, which never reaches the experiment interface.
* *traffic shape* is computed from the interface counters binned at several widths; a bin width
  finer than the sampling interval cannot show bursts, so such rows are flagged and hold NaN
  rather than an interpolated, artificially smooth number.

Layout: this package is a facade; every name below is defined in the module of its concern
and re-exported here, so ``from commscope.metrics import X`` and ``commscope.metrics.X`` work
for the whole metric API:

* :mod:`.steps` step times, the training window and the zoomed step; :mod:`.volume` framework
  bytes, op counts and message sizes; :mod:`.counters` throughput, traffic shape and wire
  bytes from the interface counters; :mod:`.framework` framework vs wire per node;
  :mod:`.matrix` the rank and node communication matrices; :mod:`.window` and
  :mod:`.crosscheck` the cross-validation; :mod:`.sockets` TCP's own statistics;
  :mod:`.summary` the one-row cell summary; :mod:`.temporal` on/off periods, dispersion and
  bursts of the wire (and all temporal tables), :mod:`.periodicity` its periodicity,
  :mod:`.cadence` the op cadence; :mod:`.sync` synchronization points, exposed communication,
  the critical path and the pipeline bubble;
* :mod:`.io` the files-in, files-out functions the Snakemake scripts call; :mod:`.imported`
  the op-level metrics of traces recorded elsewhere (``imports:``);
* not re-exported, since they are not one cell's metrics: :mod:`.study` derives the study
  tables from every cell's aggregated tables (the aggregate job), :mod:`.learning` the
  learning curves across cells (the learning job); each rule's script imports its module;
* from a lower layer, the input of them all: trace loading (:mod:`commscope.cell.load`). The
  traffic model (:mod:`commscope.collectives`) and the table, file and column names
  (:mod:`commscope.contracts`) are imported from their own modules.
"""

from __future__ import annotations

from commscope.cell.load import CellTraces, load_cell, load_cell_files
from commscope.metrics.cadence import OP_CADENCE_COLUMNS, op_cadence
from commscope.metrics.counter_series import RESOLUTION_SLACK
from commscope.metrics.counters import (
    DEFAULT_BIN_MS,
    SHAPE_COLUMNS,
    THROUGHPUT_COLUMNS,
    counted_wire_bytes,
    throughput,
    traffic_shape,
    wire_counts,
)
from commscope.metrics.crosscheck import (
    CROSSCHECK_COLUMNS,
    CROSSCHECK_FLOOR_BYTES_PER_STEP,
    CROSSCHECK_SUMMARY_COLUMNS,
    CROSSCHECK_TOLERANCE,
    MATRIX_CHECK_COLUMNS,
    crosscheck,
    crosscheck_by_strategy,
    framework_node_bytes,
    matrix_check,
)
from commscope.metrics.framework import WIRE_COLUMNS, wire_vs_framework
from commscope.metrics.io import (
    aggregate_cells,
    aggregate_tables,
    cell_metric_tables,
    compute_cell_metrics,
    write_cell_metrics,
)
from commscope.metrics.matrix import (
    COMM_MATRIX_COLUMNS,
    NODE_MATRIX_COLUMNS,
    comm_matrix,
    node_matrix,
    node_traffic_split,
)
from commscope.metrics.periodicity import PERIODICITY_COLUMNS, periodicity
from commscope.metrics.sockets import SOCKET_COLUMNS, retransmitted_bytes, socket_stats
from commscope.metrics.steps import STEP_TIME_COLUMNS, step_times, training_window, zoom_window
from commscope.metrics.summary import SUMMARY_BIN_MS, SUMMARY_COLUMNS, cell_summary
from commscope.metrics.sync import (
    BUBBLE_COLUMNS,
    CRITICAL_PATH_COLUMNS,
    EXPOSED_COLUMNS,
    SYNC_COUNT_COLUMNS,
    SYNC_POINT_COLUMNS,
    SYNC_SUMMARY_COLUMNS,
    SYNC_TABLES,
    critical_path,
    exposed_comm,
    pipeline_bubble,
    sync_counts,
    sync_points,
    sync_summary,
    sync_tables,
)
from commscope.metrics.temporal import (
    DISPERSION_COLUMNS,
    ONOFF_COLUMNS,
    TEMPORAL_COLUMNS,
    TEMPORAL_TABLES,
    dispersion_by_width,
    onoff_periods,
    temporal_tables,
)
from commscope.metrics.volume import (
    MSG_SIZE_COLUMNS,
    bytes_per_step,
    message_sizes,
    op_volume,
    size_cdf,
)
from commscope.metrics.window import check_window, ops_in_window, quiet_window

__all__ = [
    "BUBBLE_COLUMNS",
    "COMM_MATRIX_COLUMNS",
    "CRITICAL_PATH_COLUMNS",
    "CROSSCHECK_COLUMNS",
    "CROSSCHECK_FLOOR_BYTES_PER_STEP",
    "CROSSCHECK_SUMMARY_COLUMNS",
    "CROSSCHECK_TOLERANCE",
    "CellTraces",
    "DEFAULT_BIN_MS",
    "DISPERSION_COLUMNS",
    "EXPOSED_COLUMNS",
    "MATRIX_CHECK_COLUMNS",
    "MSG_SIZE_COLUMNS",
    "NODE_MATRIX_COLUMNS",
    "ONOFF_COLUMNS",
    "OP_CADENCE_COLUMNS",
    "PERIODICITY_COLUMNS",
    "RESOLUTION_SLACK",
    "SHAPE_COLUMNS",
    "SOCKET_COLUMNS",
    "STEP_TIME_COLUMNS",
    "SUMMARY_BIN_MS",
    "SUMMARY_COLUMNS",
    "SYNC_COUNT_COLUMNS",
    "SYNC_POINT_COLUMNS",
    "SYNC_SUMMARY_COLUMNS",
    "SYNC_TABLES",
    "TEMPORAL_COLUMNS",
    "TEMPORAL_TABLES",
    "THROUGHPUT_COLUMNS",
    "WIRE_COLUMNS",
    "aggregate_cells",
    "aggregate_tables",
    "bytes_per_step",
    "cell_metric_tables",
    "cell_summary",
    "check_window",
    "comm_matrix",
    "compute_cell_metrics",
    "crosscheck",
    "crosscheck_by_strategy",
    "critical_path",
    "dispersion_by_width",
    "exposed_comm",
    "framework_node_bytes",
    "load_cell",
    "load_cell_files",
    "matrix_check",
    "message_sizes",
    "op_volume",
    "ops_in_window",
    "node_matrix",
    "node_traffic_split",
    "onoff_periods",
    "op_cadence",
    "periodicity",
    "pipeline_bubble",
    "quiet_window",
    "retransmitted_bytes",
    "size_cdf",
    "socket_stats",
    "step_times",
    "sync_counts",
    "sync_points",
    "sync_summary",
    "sync_tables",
    "temporal_tables",
    "throughput",
    "traffic_shape",
    "training_window",
    "counted_wire_bytes",
    "wire_counts",
    "wire_vs_framework",
    "write_cell_metrics",
    "zoom_window",
]
