"""The data contract: names of tables, files and columns, op sets and dtype sizes that more than
one module (or the workflow) has to agree on, defined once (definitions: docs/traces.md).

This module imports nothing of commscope, so every layer may import it: the capture that writes
a table and the metrics that read it take its name from here instead of retyping it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported where a function needs it, not here: the node programs and the cell
# runner read this module's names and start faster without it (~0.4 s, benchmarks/cell.py).

# --------------------------------------------------------------------------------------------
# Sweep cells
# --------------------------------------------------------------------------------------------

# The axes a study sweeps over, in the order they lead every table and every cell path.
SWEEP_AXES: tuple[str, ...] = (
    "strategy",
    "model",
    "nodes",
    "ranks_per_node",
    "bw",
    "delay",
    "jitter",
    "loss",
    "cc",
    "steps",
    "repeat",
)

# Columns that identify a sweep cell, in the order they lead every output table.
PARAM_COLUMNS: tuple[str, ...] = ("cell", *SWEEP_AXES)

# The strategy name of a replay cell: a recorded or predicted program replayed on the cluster
# (docs/replay.md), not a training run. Reserved: no strategy of a config may take it.
REPLAY_STRATEGY = "replay"


def is_replay(cell: Mapping[str, Any] | pd.DataFrame | str) -> Any:
    """Whether a cell is a replay cell, the one answer to "is this a replay": for a strategy
    name, a cell's settings (``{"strategy": ...}``) or a table with a ``strategy`` column (a
    boolean Series then, one value a row; a table without the column has no replay rows)."""
    if isinstance(cell, str):
        return cell == REPLAY_STRATEGY
    if isinstance(cell, Mapping):
        return cell.get("strategy") == REPLAY_STRATEGY
    if "strategy" not in cell:
        import pandas as pd

        return pd.Series(False, index=cell.index)
    return cell["strategy"] == REPLAY_STRATEGY


# --------------------------------------------------------------------------------------------
# Files of one cell's trace directory (written by the parse step, read by metrics and exports)
# --------------------------------------------------------------------------------------------

CELL_FILE = "cell.json"
OPS_FILE = "ops.parquet"
STEPS_FILE = "steps.parquet"
COUNTERS_FILE = "counters.parquet"
# Per node and connection at a low rate (docs/traces.md, sockets), next to the other traces.
SOCKETS_FILE = "sockets.parquet"
# Per node at 2 Hz: the host's CPU and the node's run-queue waits (HOST_SAMPLE_COLUMNS, after
# ``node``), the fidelity monitor's input (docs/traces.md, host).
HOST_FILE = "host.parquet"
# The MoE model's routing table: per rank, step, MoE layer and destination EP rank, the tokens
# the dispatch all-to-all sent there and received from there.
ROUTING_FILE = "moe.parquet"
# Packet-header capture of a cell (optional), next to its other trace tables.
WIRE_FLOWS_FILE = "wire_flows.parquet"
# Per rank and step, the training loss.
TRAIN_FILE = "train.parquet"
# NCCL's own COLL log lines of a GPU run as a second ops table (empty without NCCL logs).
NCCL_OPS_FILE = "nccl_ops.parquet"

# Every per-cell table by name, in the order analyse_cell declares them as outputs.
CELL_TABLE_FILES: dict[str, str] = {
    "ops": OPS_FILE,
    "steps": STEPS_FILE,
    "counters": COUNTERS_FILE,
    "train": TRAIN_FILE,
    "moe": ROUTING_FILE,
    "sockets": SOCKETS_FILE,
    "host": HOST_FILE,
    "wire_flows": WIRE_FLOWS_FILE,
    "nccl_ops": NCCL_OPS_FILE,
    "cell": CELL_FILE,
}

# --------------------------------------------------------------------------------------------
# Raw files of one cell (what the runner leaves in its raw/ directory, read by the parse step)
# --------------------------------------------------------------------------------------------

# raw/: the runner's record of the cell (link shape, nodes, start/end, qdisc stats, clock).
RUN_FILE = "run.json"
# raw/: written instead of the traces when a cell still failed after its attempts (its phase,
# node and reason; commscope.experiment.attempts): the workflow leaves the cell out of the
# findings, names it in the report and runs it again on the next invocation.
CELL_FAILED_FILE = "failed.json"
# Per cell, beside raw/: whether the cell ran, and if not its failure (the report's input).
CELL_STATUS_FILE = "status.json"
# raw/<node>/: what the interface counter sampler and the socket sampler of a node write.
NODE_COUNTERS_FILE = "counters.parquet"
NODE_SOCKETS_FILE = "sockets.parquet"
# What the socket statistics program prints to its log once it samples (the cell waits for it).
SOCKSTATS_READY = "commscope.node.sockstats: sampling"
# raw/<node>/: the host's CPU and the node's run-queue waits over the cell
# (commscope.node.hoststat), and what that program prints once it samples.
NODE_HOST_FILE = "host.parquet"
HOSTSTAT_READY = "commscope.node.hoststat: sampling"
# host.parquet's columns: cumulative counters at each sample (a window's share is a difference).
# host_id: the kernel's boot id (its first 60 bits): nodes with the same one share a host;
# cpu_*_ns: all of the host's CPUs (/proc/stat; steal: given by the hypervisor to other guests);
# cpu_pressure_us: /proc/pressure/cpu "some" total (-1 without PSI); ranks_* / delayer_*: the
# CPU time the node's rank (delayer) threads ran and waited on a run queue, and their threads.
HOST_SAMPLE_COLUMNS: list[str] = [
    "t_ns",
    "host_id",
    "cpus",
    "cpu_busy_ns",
    "cpu_idle_ns",
    "cpu_steal_ns",
    "cpu_total_ns",
    "cpu_pressure_us",
    "ranks_run_ns",
    "ranks_wait_ns",
    "ranks_threads",
    "delayer_run_ns",
    "delayer_wait_ns",
    "delayer_threads",
]
# raw/<node>/: what the in-kernel wire accounting of a node writes (commscope.node.wire): bytes,
# frames and socket buffers per time bin, hook (ingress/egress) and peer address, and its metadata
# (bin width, clock mapping, totals, the reason a fallback was taken).
NODE_WIRE_FILE = "wire.parquet"
NODE_WIRE_META_FILE = "wire.json"
# wire.parquet as commscope.node.wire writes it (before the parse step adds ``node``): one row
# per non-empty bin; ``t_ns`` is the bin's start on the node's CLOCK_REALTIME, ``peer`` the other
# end's IP address ('' for traffic from/to no known peer: ARP, broadcasts, other hosts).
WIRE_BIN_COLUMNS: list[str] = ["t_ns", "hook", "peer", "bytes", "packets", "skbs"]


def rank_table_file(table: str, rank: int | str) -> str:
    """raw/<node>/ file of one rank's ``table`` (``"ops", 3`` -> ``"ops_rank3.parquet"``);
    ``rank="*"`` gives the glob pattern of every rank's."""
    return f"{table}_rank{rank}.parquet"


def rank_meta_file(rank: int | str) -> str:
    """raw/<node>/ file of what one rank reports about itself (``3`` -> ``"rank3.json"``);
    ``rank="*"`` gives the glob pattern of every rank's."""
    return f"rank{rank}.json"


# --------------------------------------------------------------------------------------------
# Metric tables (compute_cell_metrics writes them per cell, aggregate_cells concatenates them)
# --------------------------------------------------------------------------------------------

# Temporal structure per cell (commscope.metrics.temporal, docs/temporal.md).
TEMPORAL_TABLES: tuple[str, ...] = (
    "temporal_onoff",
    "temporal_dispersion",
    "temporal_periodicity",
    "temporal_ops",
    "temporal_bursts",
)
# Synchronization structure per cell (commscope.metrics.sync, docs/sync.md).
SYNC_TABLES: tuple[str, ...] = (
    "sync_counts",
    "sync_points",
    "exposed_comm",
    "critical_path",
    "pipeline_bubble",
    "sync_summary",
)
METRIC_TABLES: tuple[str, ...] = (
    "summary",
    "op_volume",
    "msg_sizes",
    "throughput",
    "shape",
    "step_times",
    "wire",
    "comm_matrix",
    "node_matrix",
    "crosscheck",
    "matrix_check",
    "sockets",
    "fidelity",
    *TEMPORAL_TABLES,
    *SYNC_TABLES,
)
# The one-row-per-cell (or per-import, per-link) headline table of a result directory.
SUMMARY_FILE = "summary.parquet"
# The study tables the aggregate job derives from the aggregated metric tables
# (results/aggregate/<name>.parquet; commscope.metrics.study.derive_study_tables).
STUDY_TABLES: tuple[str, ...] = (
    "msg_size_cdf",
    "step_time_over_repeats",
    "bytes_per_step_by_op",
    "slowdown",
)
# The cross-cell figures (results/figures/<name>.png) and the aggregate tables they draw.
STUDY_FIGURES: tuple[str, ...] = (
    "msg_size_cdf",
    "step_time_vs_bw",
    "bytes_per_step_by_op",
    "comm_matrix_nodes",
    "comm_matrix_ranks",
    "slowdown",
    "bursts",
)
STUDY_FIGURE_TABLES: tuple[str, ...] = (
    *STUDY_TABLES,
    "summary",
    "node_matrix",
    "comm_matrix",
    "temporal_onoff",
)
# The microbenchmark figures (results/microbench/figures/<name>.png).
BENCH_FIGURES: tuple[str, ...] = ("busbw_vs_size", "time_vs_size")


def table_file(name: str) -> str:
    """The file name of metric table ``name`` (``"summary"`` -> ``"summary.parquet"``)."""
    return f"{name}.parquet"


# The tables of an imported trace (results/imports/<name>/), in the order import_trace declares
# them: the ops table and the op-level metrics a measured cell also gets.
IMPORT_TABLES: tuple[str, ...] = ("ops", "summary", "op_volume", "msg_sizes", "comm_matrix")
# The tables predict_cell writes per cell: the predicted ops, predicted vs measured, step time.
PREDICT_CELL_TABLES: tuple[str, ...] = ("ops", "compare", "timing")
# The files of one prediction scenario by name (the fields of predict.scenarios.ScenarioFiles).
SCENARIO_FILES: dict[str, str] = {
    "traffic": "traffic.parquet",
    "node_matrix": "node_matrix.parquet",
    "rank_matrix": "rank_matrix.parquet",
    "meta": "scenario.json",
}


def with_params(params: Mapping[str, Any], frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` led by one constant column per parameter, in ``params``' order (parameters
    first, as in every table); a column of ``frame`` with a parameter's name is replaced."""
    # Scalars broadcast over the index: far cheaper than building per-row lists.
    import pandas as pd

    lead = pd.DataFrame(dict(params), index=frame.index)
    return pd.concat([lead, frame.drop(columns=list(params), errors="ignore")], axis=1)


# --------------------------------------------------------------------------------------------
# Columns shared between writers and readers
# --------------------------------------------------------------------------------------------

# Optional ops.parquet column with the exact bytes a rank sends to each member of the group, in
# group_ranks order ("b0,b1,..." or a list), for all-to-alls with uneven splits (MoE dispatch).
# Null where not applicable; without it an all-to-all is modelled as an even split.
SPLIT_COLUMN = "split_bytes"
# Optional ops.parquet column naming the parallel dimension of an op's group (dp, tp, pp, ...).
GROUP_KIND_COLUMN = "group_kind"
# ops.parquet columns of the issuing (training) thread's wait on an op (docs/traces.md): the
# blocked interval [start, end] (null when it never blocked on the op) and its length in ns
# (0: never blocked; null: not observable, e.g. a CUDA op). Traces before them lack all three.
WAIT_START_COLUMN = "t_wait_start_ns"
WAIT_END_COLUMN = "t_wait_end_ns"
WAIT_COLUMN = "wait_ns"
# The ops table (ops.parquet, docs/traces.md): one row per communication op a rank issued, as
# the capture writes it (commscope.workload.capture.OpRecord is its row without the first three,
# which the rank adds) and as every importer returns it (commscope.importers). In this order.
OPS_COLUMNS: tuple[str, ...] = (
    "rank",
    "node",
    "local_rank",
    "op",
    "source",
    "group",
    "group_ranks",
    "group_size",
    "peer",
    "root",
    "dtype",
    "numel",
    "bytes",
    "bytes_out",
    SPLIT_COLUMN,
    "seq",
    "step",
    "phase",
    "t_issue_ns",
    "t_end_ns",
)
# Their dtypes: "str" is pandas' string dtype (what the capture's frames get); t_end_ns is
# nullable because many sources give no completion time, and float64 would round ns epoch times
# to 256 ns.
OPS_DTYPES: dict[str, str] = {
    **dict.fromkeys(OPS_COLUMNS, "int64"),
    **dict.fromkeys(("op", "source", "group", "group_ranks", "dtype", "phase"), "str"),
    SPLIT_COLUMN: "str",
    "t_end_ns": "Int64",
}
# What the capture adds after them (nullable Int64; the importers' tables have no waits).
WAIT_COLUMNS: tuple[str, ...] = (WAIT_START_COLUMN, WAIT_END_COLUMN, WAIT_COLUMN)
# Optional ops.parquet column: True where the issuing thread waited on the op over its whole
# [t_issue_ns, t_end_ns] (synchronous op, or issue immediately followed by wait()). The capture
# records the waits themselves instead; this column applies to ops without a recorded wait
# (hand-built or imported traces). Without either every op counts as blocking (docs/sync.md).
BLOCKING_COLUMN = "blocking"
# wire_flows.parquet: one row per 1 ms bin and node pair of the packet-header capture.
WIRE_FLOW_COLUMNS: list[str] = ["t_ns", "src_node", "dst_node", "bytes", "packets"]
# sockets.parquet as the socket sampler writes it (before the parse step adds ``node``): the
# connection, then struct tcp_info fields in the kernel's units (commscope.node.sockstats).
SOCKET_SAMPLE_COLUMNS: list[str] = [
    "t_ns",
    "src",
    "sport",
    "dst",
    "dport",
    "rtt_us",
    "rttvar_us",
    "min_rtt_us",
    "cwnd",
    "ssthresh",
    "snd_mss",
    "unacked",
    "lost",
    "retrans",
    "total_retrans",
    "bytes_sent",
    "bytes_acked",
    "bytes_received",
    "bytes_retrans",
    "notsent_bytes",
    "delivery_rate_Bps",
    "pacing_rate_Bps",
]

# --------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------

P2P_OPS = frozenset({"send", "recv"})
# Collectives whose bandwidth-optimal algorithm is a ring over the whole group.
RING_OPS = frozenset({"allreduce", "allgather", "reduce_scatter"})
# Ops whose traffic depends on a root rank (the ``root`` column; older traces lack it).
ROOTED_OPS = frozenset({"broadcast", "reduce", "gather", "scatter"})
# Every op the ops table may name (the importers map other spellings onto these).
KNOWN_OPS = frozenset(RING_OPS | ROOTED_OPS | {"alltoall", "send", "recv", "barrier"})

# Bytes per element of each dtype in the contract's spelling (torch dtype names without
# "torch."; float8 variants are 1 byte and keep torch's spelling).
DTYPE_SIZES: dict[str, int] = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "complex32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
}


def parse_ranks(group_ranks: Any) -> list[int]:
    """Global ranks from a ``group_ranks`` value: ``"0,1,2"`` (how the capture writes it), a
    sequence (a parquet list column), or null / NaN / ``""`` (unknown) -> ``[]``."""
    pandas = sys.modules.get("pandas")  # not imported: the value cannot be pd.NA
    if group_ranks is None or (pandas is not None and group_ranks is pandas.NA):
        return []
    if isinstance(group_ranks, float) and math.isnan(group_ranks):
        return []
    if isinstance(group_ranks, str):
        return [int(r) for r in group_ranks.split(",") if r.strip()]
    return [int(r) for r in group_ranks]


# A replay program (docs/replay.md): what every rank of a replay cell issues, in order. Built
# on the orchestrator from a source trace (commscope.replay), read on the nodes by
# commscope.workload.replay. One row per action of one rank; ranks are the launched ranks
# (the placement already applied), so rank r runs on node r // ranks_per_node.
REPLAY_PROGRAM_FILE = "program.parquet"
# The replay's description next to its program: source, placement, scale factors, scaling rule.
REPLAY_META_FILE = "replay.json"
REPLAY_PROGRAM_COLUMNS: tuple[str, ...] = (
    "rank",  # int: the launched rank that runs this row
    "idx",  # int: position in that rank's program, 0.. (rows are read in idx order)
    "kind",  # "op": issue an op; "step_end": the end of a step (record it, wait what is named)
    "step",  # int: the step the row belongs to (-1: set-up ops before the first step)
    "phase",  # str: fwd/bwd/optim/fwd_bwd/other, as recorded by the source (capture.set_phase)
    "pre_ns",  # int: busy compute before the waits (already x time scale)
    "waits",  # str: idx of this rank's earlier async ops to wait on, "3,7" ("" none)
    "post_ns",  # int: busy compute after the waits, before the op is issued
    "op",  # str: one of KNOWN_OPS ("" on step_end rows)
    "async_op",  # bool: issue with async_op=True and wait where a later row's `waits` names it
    "group_ranks",  # str: the group's launched ranks "0,1,2" (always explicit, world too)
    "peer",  # int: global peer of send/recv, -1 otherwise
    "root",  # int: global root of broadcast/reduce/gather/scatter, -1 otherwise
    "dtype",  # str: DTYPE_SIZES spelling
    "numel",  # int: input elements as the ops table counts them (already x size scale)
    "split_bytes",  # str|None: uneven all-to-all, bytes sent to each member in group order
    "recv_split_bytes",  # str|None: uneven all-to-all, bytes received from each member
    "src_seq",  # int: the source row's seq (-1 when the source has none), for tracing back
)
REPLAY_OP_KINDS: tuple[str, ...] = ("op", "step_end")
