"""Files in, files out: the only functions the Snakemake scripts call.

The workflow's scripts call :func:`write_cell_metrics` and :func:`aggregate_tables` (which also
writes the derived study tables, :data:`~commscope.contracts.STUDY_TABLES`) with the files
their rules declare (no directory from which the package would pick names);
:func:`compute_cell_metrics` and :func:`aggregate_cells` are the directory-based conveniences
for tests and interactive use, with the contract's file names (:mod:`commscope.contracts`).

Both keep memory near the size of the numbers a cell holds, whatever its length
(docs/analysis.md): what is written is what :func:`cell_metric_tables` and ``pd.concat`` give,
but the largest tables are read lean and written in parts (:mod:`._parquet`).
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from commscope.cell.load import CellTraces, read_optional
from commscope.cell.parse import node_clock, to_orchestrator_clock
from commscope.cell.wire import snap
from commscope.cluster.shaping import ETH_HEADER_BYTES, tbf_burst_bytes
from commscope.collectives.moe import alltoall_splits_from_routing
from commscope.contracts import (
    CELL_FILE,
    COUNTERS_FILE,
    HOST_FILE,
    METRIC_TABLES,
    NODE_WIRE_FILE,
    OPS_FILE,
    PARAM_COLUMNS,
    ROUTING_FILE,
    RUN_FILE,
    SOCKETS_FILE,
    STEPS_FILE,
    STUDY_TABLES,
    WIRE_FLOW_COLUMNS,
    WIRE_FLOWS_FILE,
    table_file,
    with_params,
)
from commscope.metrics._common import _concat, shared_results
from commscope.metrics._parquet import PartWriter, concat_files, write_frame
from commscope.metrics.counter_series import counter_series
from commscope.metrics.counters import (
    DEFAULT_BIN_MS,
    SHAPE_COLUMNS,
    THROUGHPUT_COLUMNS,
    throughput_frame,
    throughput_parts,
    throughput_rows,
    throughput_specs,
    traffic_shape,
)
from commscope.metrics.crosscheck import (
    crosscheck,
    matrix_check,
    summed_flows,
    window_transfers,
)
from commscope.metrics.fidelity import delayer_lateness, fidelity_table, shaper_table
from commscope.metrics.framework import WIRE_COLUMNS, wire_vs_framework
from commscope.metrics.matrix import comm_matrix, node_matrix
from commscope.metrics.sockets import SOCKET_INPUT_COLUMNS, socket_stats
from commscope.metrics.steps import step_times, training_window, zoom_window
from commscope.metrics.study import STUDY_SOURCES, derive_study_tables
from commscope.metrics.summary import cell_summary
from commscope.metrics.sync import sync_tables
from commscope.metrics.temporal import temporal_tables
from commscope.metrics.volume import message_sizes, op_volume
from commscope.metrics.window import check_window
from commscope.spec.link import ReferenceLink

# The widths of the throughput table (the shape table's are DEFAULT_BIN_MS too). Its 100 µs
# rows cover only the step the cell figure zooms into (zoom_window): over the whole run they
# would be ten rows per node and millisecond, most of a long run's metrics time
# (docs/analysis.md; the benchmark's --throughput-bins measures other widths).
THROUGHPUT_BIN_MS: tuple[float, ...] = DEFAULT_BIN_MS


def cell_metric_tables(traces: CellTraces, wire_flows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Every per-cell metric table of one cell, by name (:data:`METRIC_TABLES`).

    summary, op_volume (per rank), msg_sizes, throughput (bins 0.1/1/10/100 ms stacked, column
    ``bin_ms``; the 0.1 ms bins only over the step the cell figure zooms into,
    :func:`~commscope.metrics.steps.zoom_window`, :func:`throughput_table`),
    shape (inside the training window, the same bins), step_times, wire, comm_matrix (rank x
    rank bytes per measured step), node_matrix (node x node), crosscheck (wire vs recorded ops
    per node and direction, :func:`crosscheck`), matrix_check (node x node matrix vs the
    captured ``wire_flows`` when the cell has them, :func:`matrix_check`), sockets (TCP's
    rtt, cwnd and retransmissions per node, :func:`socket_stats`) and the temporal structure
    (temporal_onoff, temporal_dispersion, temporal_periodicity, temporal_ops:
    :func:`~commscope.metrics.temporal.temporal_tables`, docs/temporal.md) and the
    synchronization structure (sync_counts, sync_points, exposed_comm, critical_path,
    pipeline_bubble, sync_summary: :func:`~commscope.metrics.sync.sync_tables`, docs/sync.md).

    The throughput table of a long run is large (a row per node and millisecond at 1 ms):
    :func:`write_cell_metrics` writes the same tables without ever holding it whole.
    """
    with shared_results():
        tables = _cell_tables(traces, wire_flows, counter_params=None)
        return {
            name: table.frame() if isinstance(table, _ThroughputSource) else table
            for name, table in tables
        }


class _ThroughputSource:
    """The cell's throughput table before it is computed: stacked whole (:meth:`frame`, what
    :func:`cell_metric_tables` returns) or written part by part (:meth:`write`)."""

    def __init__(
        self,
        counters: pd.DataFrame,
        st: pd.DataFrame,
        params: dict[str, Any] | None,
        empty_columns: list[str],
    ) -> None:
        self.counters = counters
        # The training window and the zoomed step of the step times ``st`` (none without steps).
        window, zoom = (training_window(st), zoom_window(st)) if not st.empty else (None, None)
        self.specs = throughput_specs(window, THROUGHPUT_BIN_MS, zoom)
        # The counters' parameters when they were read without their columns (else None).
        self.params = params
        self.empty_columns = empty_columns

    def prepare(self) -> None:
        """Clean the counter series now (inside ``shared_results`` they are then shared):
        :meth:`write` may run in another thread beside the tables that read them too."""
        for _, _, series in counter_series(self.counters):
            for col in ("tx_bytes", "rx_bytes"):
                series.cum[col]  # noqa: B018 (computed and kept now, not in both threads)

    def frame(self) -> pd.DataFrame:
        """The whole table (as :func:`throughput_table` gives it)."""
        table = throughput_rows(self.counters, self.specs, 0)
        if self.params is not None and not table.empty:
            table = with_params(self.params, table)
        return _concat([table], self.empty_columns)

    def write(self, path: Path) -> None:
        """Write the table to ``path`` as ``frame().to_parquet(path, index=False)`` would, one
        part (:func:`throughput_parts`) at a time, when the counters were read without their
        parameter columns (one cell); otherwise as that."""
        cells = list(throughput_parts(self.counters, self.specs))
        parts = iter(cells[0][1]) if self.params is not None and len(cells) == 1 else iter(())
        first = next(parts, None)
        if first is None:
            self.frame().to_parquet(path, index=False)
            return
        head = with_params(self.params or {}, throughput_frame([first.head(1)]))
        with PartWriter(path, head) as writer:
            for part in _chain(first, parts):
                writer.write(
                    len(part),
                    {
                        **(self.params or {}),
                        "node": part.node,
                        "iface": part.iface,
                        "bin_ms": part.bin_ms,
                        "t_start_ns": part.t_start_ns,
                        "tx_bps": part.tx_bps,
                        "rx_bps": part.rx_bps,
                        "resolved": part.resolved,
                    },
                )


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _throughput_source(
    counters: pd.DataFrame,
    traces: CellTraces,
    st: pd.DataFrame,
    counter_params: dict[str, Any] | None,
) -> _ThroughputSource | None:
    """The throughput table of ``counters`` (None when there are none), ``traces``' cell, from
    its step times ``st``."""
    if counters.empty:
        return None
    empty = [*traces.params, *THROUGHPUT_COLUMNS]
    return _ThroughputSource(counters, st, counter_params, empty)


def _cell_tables(
    traces: CellTraces,
    wire_flows: pd.DataFrame,
    counter_params: dict[str, Any] | None,
    throughput: _ThroughputSource | None = None,
    shaper: pd.DataFrame | None = None,
) -> Iterator[tuple[str, pd.DataFrame | _ThroughputSource]]:
    """:func:`cell_metric_tables`' tables, each as soon as it is computed (a caller writing
    them lets go of each before the next), the throughput table not yet computed
    (``throughput`` when the caller made it already). With ``counter_params`` the counters
    were read without their parameter columns (whose values, those of every row,
    ``counter_params`` holds) and the tables from them get them back. ``shaper``: the
    cell's shaped ports over the window (:func:`read_shaper_table`), for the fidelity table."""
    params = traces.params
    st = step_times(traces.steps, traces.warmup_steps)
    window = training_window(st) if not st.empty else None
    # The shape first: the summary asks for the same statistics (shared_results then hands
    # them over), and computing them beside the summary's own copy of the measured ops would
    # hold both at once.
    shape = pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
    if not traces.counters.empty and window is not None:
        shape = traffic_shape(traces.counters, window, DEFAULT_BIN_MS)
        if counter_params is not None and not shape.empty:
            shape = with_params(counter_params, shape)
    # The same measured steps as the summary: steps that issued no op still count as steps.
    measured_steps = st.loc[~st["warmup"].astype(bool), "step"] if not st.empty else []
    rank_mat = comm_matrix(
        traces.ops, traces.warmup_steps, measured_steps=measured_steps, backend=traces.backend
    )
    node_mat = node_matrix(rank_mat)
    delayers = delayer_lateness(traces.meta.get("link_engine"))
    fidelity = fidelity_table(traces.host, window, shaper, delayers)
    yield "summary", cell_summary(traces, node_mat=node_mat, fidelity=fidelity)
    yield "fidelity", with_params(params, fidelity)
    yield "comm_matrix", rank_mat
    yield "node_matrix", node_mat
    yield "op_volume", op_volume(traces.ops, per_rank=True)
    yield "msg_sizes", message_sizes(traces.ops, traces.warmup_steps)
    yield "step_times", st
    if traces.counters.empty:
        yield "throughput", pd.DataFrame(columns=[*params, *THROUGHPUT_COLUMNS])
        yield "shape", pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
        yield "wire", pd.DataFrame(columns=[*params, *WIRE_COLUMNS])
    else:
        yield (
            "throughput",
            throughput or _throughput_source(traces.counters, traces, st, counter_params),
        )
        yield "shape", shape
        yield "wire", wire_vs_framework(traces.ops, traces.counters, traces.meta)
    yield "crosscheck", crosscheck(traces)
    yield "matrix_check", matrix_check(traces, wire_flows)
    yield "sockets", socket_stats(traces)
    # After the shape table: inside shared_results its cleaned series and bin statistics are
    # reused, not recomputed.
    yield from temporal_tables(
        traces.counters, traces.ops, st, link_cap_bps=traces.meta.get("bw_bps"), params=params
    ).items()
    yield from sync_tables(
        traces.ops, traces.steps, plan=traces.meta.get("plan"), warmup_steps=traces.warmup_steps
    ).items()


def write_cell_metrics(
    cell: Path,
    ops: Path,
    steps: Path,
    outputs: Mapping[str, Path],
    counters: Path | None = None,
    routing: Path | None = None,
    sockets: Path | None = None,
    wire_flows: Path | None = None,
    host: Path | None = None,
    raw: Path | None = None,
) -> None:
    """Compute one cell's metric tables from its trace files (``cell`` = cell.json, ``ops``,
    ``steps``, ``counters``, ``routing`` = moe.parquet, ``sockets``, ``wire_flows``,
    ``host``, and ``raw``, the cell's raw directory, whose senders' egress bins the shaper
    check of the fidelity table needs, :func:`read_shaper_table`; missing optional ones count
    as empty, see
    :func:`~commscope.cell.load.load_cell_files`) and write each to ``outputs[name]`` for every
    name of :data:`METRIC_TABLES`: the files hold what :func:`cell_metric_tables` of
    :func:`~commscope.cell.load.load_cell_files`' traces gives.

    Read lean (a long run's inputs are 10**7 rows): the text parameter columns of ``ops`` and
    ``steps`` as categoricals, ``counters`` and ``sockets`` without their parameter columns
    (each holds one value, taken once from the counters file for the tables built from them)
    and sockets without the columns no metric reads, ``wire_flows`` summed per node pair over
    the window as it is read (:func:`~commscope.metrics.crosscheck.summed_flows`). The
    throughput table is written in parts, by a thread of its own, while the other tables are
    computed and written (each as soon as it is computed).
    """
    missing = [name for name in METRIC_TABLES if name not in outputs]
    if missing:
        raise ValueError(f"write_cell_metrics: no output path for tables {missing}")
    for name in METRIC_TABLES:
        Path(outputs[name]).parent.mkdir(parents=True, exist_ok=True)
    meta = json.loads(Path(cell).read_text())
    steps_table, steps_text = _read_params_categorical(steps)
    # The counters' interface names only tell series apart (counters.py groups by them).
    counter_table, counter_params = _read_cell_data(counters, categorical=["iface"])
    with shared_results(), ThreadPoolExecutor(max_workers=1) as pool:
        # The cell as far as it is read: enough for its throughput table.
        early = CellTraces(ops=pd.DataFrame(), steps=steps_table, counters=counter_table, meta=meta)
        st = step_times(steps_table, early.warmup_steps)
        throughput = _throughput_source(counter_table, early, st, counter_params)
        writing = None
        if throughput is not None:
            # The throughput table (a row per node and millisecond) is written by a thread
            # of its own, started as soon as the counters and steps are in, while the other
            # inputs are read and the other tables computed: its time is spent encoding
            # parquet, outside the GIL. The series it reads are cleaned here first, so both
            # threads share them (shared_results, carried over by copy_context).
            throughput.prepare()
            job = contextvars.copy_context().run
            writing = pool.submit(job, throughput.write, Path(outputs["throughput"]))
        ops_table, ops_text = _read_params_categorical(ops)
        ops_table = alltoall_splits_from_routing(ops_table, read_optional(routing))
        text_params = {*ops_text, *steps_text}
        # What load_cell_files gives, read leaner.
        traces = CellTraces(
            ops=ops_table,
            steps=steps_table,
            counters=counter_table,
            meta=meta,
        )
        del ops_table
        checked = check_window(traces)
        if checked is not None and not counter_table.empty:
            # What crosscheck models of the ops in its window, now: cutting the ops to the
            # window copies nearly all of them, better done before the sockets are read.
            window_transfers(traces, checked[0], traces.backend)
        traces.sockets = _read_cell_data(sockets, SOCKET_INPUT_COLUMNS)[0]
        traces.host = read_optional(host)
        window = training_window(st) if not st.empty else None
        shaper = read_shaper_table(meta, raw, wire_flows, window)
        flows = _window_flows(wire_flows, checked[0]) if checked else pd.DataFrame()
        written = []
        for name, table in _cell_tables(traces, flows, counter_params, throughput, shaper):
            written.append(name)
            if not isinstance(table, _ThroughputSource):
                write_frame(table, Path(outputs[name]), plain=text_params)
                pa.default_memory_pool().release_unused()
            elif writing is None:
                table.write(Path(outputs[name]))
            del table
        if writing is not None:
            writing.result()
    if sorted(written) != sorted(METRIC_TABLES):
        raise RuntimeError(f"write_cell_metrics wrote {written}, not {list(METRIC_TABLES)}")


def _read_params_categorical(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """The table at ``path`` (an empty frame without it) with its text parameter columns as
    categoricals (one byte a row instead of the text), and their names: the tables that copy
    them (op_volume, msg_sizes, step_times) are written back as text (:func:`write_frame`)."""
    if not Path(path).exists():
        return pd.DataFrame(), []
    schema = pq.read_schema(path)
    text = [c for c in PARAM_COLUMNS if c in schema.names and schema.field(c).type in _TEXT_TYPES]
    return _read(path, read_dictionary=text or None), text


_TEXT_TYPES = (pa.string(), pa.large_string())


def _read(path: Path, **kwargs: Any) -> pd.DataFrame:
    """``pd.read_parquet(path, **kwargs)`` that needs little more memory than the frame: one
    block per column (no copy into 2-d blocks), arrow's buffers freed as they are converted,
    and what arrow's allocator kept of them handed back (numpy allocates elsewhere)."""
    frame = pd.read_parquet(
        path, to_pandas_kwargs={"split_blocks": True, "self_destruct": True}, **kwargs
    )
    pa.default_memory_pool().release_unused()
    return frame


def _read_cell_data(
    path: Path | None, columns: Sequence[str] | None = None, categorical: Sequence[str] = ()
) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """A per-cell trace table without its cell parameter columns (and, given ``columns``,
    only those of them it has; the text columns named in ``categorical`` as categoricals),
    and the parameters' values, when each parameter column holds one value throughout the
    file (by the file's statistics); otherwise (several cells, no statistics) the whole table
    and None. A missing file (or none given) is an empty frame, as
    :func:`~commscope.cell.load.read_optional` gives."""
    if path is None or not Path(path).exists():
        return pd.DataFrame(), None
    meta = pq.ParquetFile(path)
    names = meta.schema_arrow.names
    param_cols = [c for c in PARAM_COLUMNS if c in names]
    if not param_cols or meta.metadata.num_rows == 0 or not _constant(meta, param_cols):
        return _read(path), None
    keep = [c for c in names if c not in param_cols and (columns is None or c in columns)]
    text = [c for c in categorical if c in keep and meta.schema_arrow.field(c).type in _TEXT_TYPES]
    data = _read(path, columns=keep, read_dictionary=text or None)
    first = next(meta.iter_batches(batch_size=1, columns=param_cols)).to_pandas()
    return data, {c: first[c].iloc[0] for c in param_cols}


def _constant(meta: pq.ParquetFile, columns: list[str]) -> bool:
    """Whether each of ``columns`` holds a single non-null value in every row of the file,
    judged from the row groups' statistics (False when some are missing)."""
    index = {name: i for i, name in enumerate(meta.schema_arrow.names)}
    seen: dict[str, Any] = {}
    for g in range(meta.metadata.num_row_groups):
        group = meta.metadata.row_group(g)
        for col in columns:
            stats = group.column(index[col]).statistics
            if stats is None or not stats.has_min_max or stats.null_count != 0:
                return False
            if stats.min != stats.max or seen.setdefault(col, stats.min) != stats.min:
                return False
    return True


def _window_flows(path: Path | None, window: tuple[int, int]) -> pd.DataFrame:
    """The wire_flows table at ``path`` as :func:`matrix_check` needs it over ``window``
    (:func:`~commscope.metrics.crosscheck.summed_flows`), read a row group at a time; an
    empty frame without the file."""
    if path is None or not Path(path).exists():
        return pd.DataFrame()
    source = pq.ParquetFile(path)
    if not set(WIRE_FLOW_COLUMNS) <= set(source.schema_arrow.names):
        return pd.read_parquet(path)
    batches = (
        _pair_sums_in_window(source.read_row_group(g, columns=WIRE_FLOW_COLUMNS), window)
        for g in range(source.metadata.num_row_groups)
    )
    return summed_flows(batches, window)


def _pair_sums_in_window(group: pa.Table, window: tuple[int, int]) -> pd.DataFrame:
    """One row group of wire_flows as :func:`summed_flows` sums it: its bins inside
    ``window`` summed per node pair by arrow (a long run's 20 M rows in a third of the time
    of pandas, outside the GIL), so the same integer sums. A group with no bin inside gives
    its first row (outside the window, counted by nothing), the row summed_flows returns
    when no group has one."""
    t = group["t_ns"]
    inside = group.filter(pc.and_(pc.greater_equal(t, window[0]), pc.less(t, window[1])))
    if inside.num_rows == 0:
        return group.slice(0, 1).to_pandas()
    sums = inside.group_by(["src_node", "dst_node"]).aggregate(
        [("bytes", "sum"), ("packets", "sum")]
    )
    frame = sums.to_pandas().rename(columns={"bytes_sum": "bytes", "packets_sum": "packets"})
    return frame.assign(t_ns=window[0])[WIRE_FLOW_COLUMNS]


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
        host=cell_dir / HOST_FILE,
        raw=cell_dir.parent / "raw",
    )


def read_shaper_table(
    meta: Mapping[str, Any],
    raw: Path | None,
    wire_flows: Path | None,
    window: tuple[int, int] | None,
) -> pd.DataFrame | None:
    """The cell's shaped ports over ``window``
    (:func:`~commscope.metrics.fidelity.shaper_table`), or None where there is nothing to
    check: no cap (cell.json ``bw_bps``), no BPF wire accounting, no raw directory or no
    window. What each sender offered its shaper is its own egress hook's bins
    (``raw/<node>/wire.parquet``, put on the orchestrator's clock and snapped to the bins as
    the parse stage does its ingress bins); what the shaper delivered is the receivers' ingress
    bins by sender (``wire_flows``). The tbf's bucket is the one shaping sized for the
    nodes' MTU and offloads (cell.json ``links``)."""
    rate = meta.get("bw_bps")
    wire = meta.get("wire") or {}
    if not rate or wire.get("source") != "bpf" or window is None or raw is None:
        return None
    raw, bin_ns = Path(raw), int(wire["bin_ns"])
    if not (raw / RUN_FILE).exists() or wire_flows is None or not Path(wire_flows).exists():
        return None
    run = json.loads((raw / RUN_FILE).read_text())
    index = {n["name"]: int(n["index"]) for n in run["nodes"]}
    egress = []
    for name, node in index.items():
        path = raw / name / NODE_WIRE_FILE
        if path.exists():
            # The egress rows only: a long run's file holds 10**7 bins of both hooks.
            bins = pd.read_parquet(
                path, columns=["t_ns", "bytes"], filters=[("hook", "==", "egress")]
            )
            egress.append(bins.assign(node=node))
    if not egress:
        return None
    clock = node_clock(run, index)
    offered = to_orchestrator_clock(pd.concat(egress, ignore_index=True), ("t_ns",), clock)
    offered = offered.assign(t_ns=snap(offered["t_ns"], bin_ns))
    delivered = pd.read_parquet(
        wire_flows,
        columns=["t_ns", "src_node", "bytes"],
        filters=[("t_ns", ">=", window[0] - bin_ns), ("t_ns", "<=", window[1])],
    )
    links = list((meta.get("links") or {}).values())
    mtu = max((int(link.get("mtu", 1500)) for link in links), default=1500)
    offload = any(link.get("tso") or link.get("gso") for link in links)
    # Each node's shaper at its own rate where the topology gives it one (an uncapped node has
    # none to check).
    own = meta.get("bw_bps_per_node") or {}
    rates = {n: own.get(str(n), rate) for n in index.values()}
    tables = [
        shaper_table(
            offered[offered["node"].isin([n for n, r in rates.items() if r == node_rate])],
            delivered,
            window,
            rate_bps=float(node_rate),
            bin_ns=bin_ns,
            burst_bytes=tbf_burst_bytes(int(node_rate), mtu, offload),
            frame_bytes=mtu + ETH_HEADER_BYTES,
        )
        for node_rate in sorted({r for r in rates.values() if r})
    ]
    return pd.concat(tables, ignore_index=True) if tables else None


def aggregate_tables(
    inputs: Mapping[str, Sequence[Path]],
    outputs: Mapping[str, Path],
    reference: ReferenceLink | None = None,
) -> None:
    """Concatenate each metric table across cells: ``inputs[name]`` (one file per cell; a
    missing file is skipped) into ``outputs[name]``, for every metric table named in
    ``outputs``; then derive every study table of :data:`STUDY_TABLES` named in ``outputs``
    (:func:`~commscope.metrics.study.derive_study_tables`, slowdowns against ``reference``,
    the study's reference link) from the concatenated :data:`STUDY_SOURCES` as written, which
    ``outputs`` must then name too.

    Tables carry their cell parameters, so this is a plain concat. A table no cell produced is
    still written (empty) so downstream rules always find their inputs.
    """
    for name, out in outputs.items():
        if name in STUDY_TABLES:
            continue
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        concat_files([Path(p) for p in inputs.get(name, ()) if Path(p).exists()], Path(out))
    derived = [name for name in STUDY_TABLES if name in outputs]
    if not derived:
        return
    missing = [name for name in STUDY_SOURCES if name not in outputs]
    if missing:
        raise ValueError(f"aggregate_tables: study tables need the aggregated {missing}")
    # Read back what was written, so the study tables see exactly the files a reader sees.
    sources = {name: pd.read_parquet(outputs[name]) for name in STUDY_SOURCES}
    study = derive_study_tables(sources, reference)
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
