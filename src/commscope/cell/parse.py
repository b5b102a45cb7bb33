"""Raw per-node run output → tidy per-cell tables (the data contract of docs/traces.md).

Every table repeats the cell's parameters as columns plus ``cell`` (its path id), so
aggregating cells is a concat, never path parsing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from commscope.cell.pcap import read_pcap, wire_flows
from commscope.cell.wire import counters_from_bins, flows_from_bins, snap_bins
from commscope.cluster.clock import offset_at
from commscope.config import cell_id
from commscope.contracts import (
    CELL_TABLE_FILES,
    HOST_SAMPLE_COLUMNS,
    NODE_COUNTERS_FILE,
    NODE_HOST_FILE,
    NODE_SOCKETS_FILE,
    NODE_WIRE_FILE,
    NODE_WIRE_META_FILE,
    RUN_FILE,
    SOCKET_SAMPLE_COLUMNS,
    SWEEP_AXES,
    WAIT_END_COLUMN,
    WAIT_START_COLUMN,
    WIRE_FLOW_COLUMNS,
    rank_meta_file,
    rank_table_file,
)
from commscope.importers.nccl_log import load_nccl_log
from commscope.spec.link import DEFAULT_CC, IMPAIRMENT_AXES, SHAPING, LinkShape, axes_shape
from commscope.spec.settings import CellSettings

# Per table, the columns that hold a node's own clock (ns) and get its offset removed (those a
# table has: traces from before the wait columns lack them).
_TIME_COLUMNS = {
    "ops": ("t_issue_ns", "t_end_ns", WAIT_START_COLUMN, WAIT_END_COLUMN),
    "steps": ("t_start_ns", "t_end_ns"),
    "counters": ("t_ns",),
    "wire": ("t_ns", "t_start_ns", "t_end_ns"),
}


def _cell_params(cell: CellSettings) -> dict[str, Any]:
    """The cell's sweep values in the sweep's order (every axis set: the cell trains)."""
    return {axis: getattr(cell, axis) for axis in SWEEP_AXES}


def _append_params(frame: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    """``frame`` followed by the cell's axes and its ``cell`` id as constant columns (after the
    data: the raw tables' own columns lead, unlike the metric tables)."""
    frame = frame.copy()
    for axis, value in params.items():
        frame[axis] = value
    frame["cell"] = cell_id(params)
    return frame


def _concat(paths: list[Path], what: str, raw_dir: Path) -> pd.DataFrame:
    if not paths:
        raise FileNotFoundError(f"no {what} files under {raw_dir}: did training finish?")
    return pd.concat([pd.read_parquet(p) for p in sorted(paths)], ignore_index=True)


def to_orchestrator_clock(
    frame: pd.DataFrame, columns: tuple[str, ...], clock: dict[str, Any] | None
) -> pd.DataFrame:
    """Map each node's timestamps (``frame.node``) onto the orchestrator's clock with the
    offsets the runner estimated (``run.json`` "clock", see commscope.cluster.clock). Nothing
    changes when the clock is shared (netns) or was not measured. Integer ns stay exact.
    Columns of ``columns`` that ``frame`` lacks are skipped."""
    if not clock or not clock.get("applied") or frame.empty:
        return frame
    frame = frame.copy()
    by_index = clock["by_index"]
    present = [c for c in columns if c in frame.columns]
    for node, rows in frame.groupby("node").groups.items():
        sample = by_index[int(node)]
        for col in present:
            values = frame.loc[rows, col]
            known = values.notna() & (values.astype("Int64") >= 0)  # -1 / null: no time
            t = values[known].astype(np.int64).to_numpy()
            shift = np.rint(offset_at(sample["start"], sample.get("end"), t)).astype(np.int64)
            frame.loc[values[known].index, col] = t - shift
    return frame


def _pcap_flows(raw_dir: Path, nodes: list[dict[str, Any]], clock: dict | None) -> pd.DataFrame:
    """The wire node x node flows of every node's packet capture (empty without captures)."""
    addr_to_node = {n["exp_addr"]: int(n["index"]) for n in nodes if n.get("exp_addr")}
    packets = {}
    for node in nodes:
        files = sorted((raw_dir / node["name"]).glob("*.pcap*"))
        if files:
            frame = pd.concat([read_pcap(f) for f in files], ignore_index=True)
            frame.insert(0, "node", int(node["index"]))
            packets[int(node["index"])] = to_orchestrator_clock(frame, ("t_ns",), clock)
    return wire_flows(packets, addr_to_node)


def _nccl_ops(raw_dir: Path, ranks: list[dict[str, Any]]) -> pd.DataFrame:
    """NCCL's own COLL log lines of a GPU run as an ops table (the second source)."""
    logs = sorted(raw_dir.glob("*/nccl.*.log"))
    if not logs:
        return pd.DataFrame()
    ops = load_nccl_log("\n".join(p.read_text(errors="replace") for p in logs))
    # The importer numbers hosts in name order; use the cluster's own node indices.
    host_node = {r["hostname"]: int(r["node"]) for r in ranks if r.get("hostname")}
    hosts = sorted(host_node)
    if not ops.empty and hosts:
        ops["node"] = ops["node"].map(lambda i: host_node[hosts[i]] if 0 <= i < len(hosts) else i)
    return ops


_NULLABLE_UINT64 = {pa.uint64(): pd.UInt64Dtype()}


def _per_node(raw_dir: Path, name: str, node_index: dict[str, int]) -> list[pd.DataFrame]:
    """Every node's ``name`` table with its node index as the first column."""
    frames = []
    for path in sorted(raw_dir.glob(f"*/{name}")):
        # Unsigned counters (the socket statistics' tcp_info) as nullable UInt64 whether or not
        # the writer stored pandas' metadata: the node programs write with pyarrow alone.
        frame = pq.read_table(path).to_pandas(types_mapper=_NULLABLE_UINT64.get)
        frame.insert(0, "node", node_index[path.parent.name])
        frames.append(frame)
    return frames


def _sampled(
    raw_dir: Path,
    name: str,
    columns: list[str],
    node_index: dict[str, int],
    clock: dict[str, Any] | None,
) -> pd.DataFrame:
    """Every node's samples of a periodic node program (``name``: its file, ``columns``: its
    own columns, after ``node``) in one table on the orchestrator's clock; empty with those
    columns when no node wrote one (a run from before that program)."""
    frames = _per_node(raw_dir, name, node_index)
    table = (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["node", *columns])
    )
    return to_orchestrator_clock(table, ("t_ns",), clock)


def node_clock(run_meta: dict[str, Any], node_index: dict[str, int]) -> dict[str, Any] | None:
    """run.json's clock offsets (``clock``) with ``by_index``: each node's offset by its
    index (``node_index``: name -> index), as :func:`to_orchestrator_clock` takes them; None
    without a clock record."""
    clock = run_meta.get("clock")
    if clock:
        clock = {**clock, "by_index": {node_index[n]: v for n, v in clock["nodes"].items()}}
    return clock


def cell_table_paths(out_dir: Path) -> dict[str, Path]:
    """The default path of every per-cell table (see ``CELL_TABLE_FILES``) under ``out_dir``."""
    return {name: Path(out_dir) / file for name, file in CELL_TABLE_FILES.items()}


def node_rates(run_meta: Mapping[str, Any]) -> dict[int, int | None]:
    """Each node's link rate in a run (by the cell's node index): the cell's cap, or the node's
    own where the topology overrides it (run.json ``node_shapes``, by node name)."""
    cell_rate = LinkShape(**run_meta["shape"]).rate_bps
    own = run_meta.get("node_shapes") or {}
    return {
        int(n["index"]): (own[n["name"]]["rate_bps"] if n["name"] in own else cell_rate)
        for n in run_meta["nodes"]
    }


def _wire_tables(
    raw_dir: Path,
    nodes: list[dict[str, Any]],
    clock: dict[str, Any] | None,
    rate_bps: int | None | Mapping[int, int | None] = None,
) -> dict[str, Any] | None:
    """The BPF accounting's counters and node-pair flows of every node (see
    :mod:`commscope.cell.wire`; ``rate_bps`` the cell's cap, at which its bytes are
    serialised) and each node's wire.json, or None when no node has a wire.parquet (the
    counters source, or a raw directory from before it existed)."""
    node_index = {n["name"]: int(n["index"]) for n in nodes}
    frames = _per_node(raw_dir, NODE_WIRE_FILE, node_index)
    if not frames:
        return None
    metas = {
        node_index[p.parent.name]: json.loads(p.read_text())
        for p in sorted(raw_dir.glob(f"*/{NODE_WIRE_META_FILE}"))
    }
    bin_ns = {int(m["bin_ns"]) for m in metas.values()}
    if len(bin_ns) != 1:
        raise ValueError(f"{raw_dir}: nodes used different BPF bin widths {sorted(bin_ns)}")
    bins = to_orchestrator_clock(pd.concat(frames, ignore_index=True), ("t_ns",), clock)
    spans_frame = pd.DataFrame(
        [
            {"node": i, "t_start_ns": m["t_start_ns"], "t_end_ns": m["t_end_ns"]}
            for i, m in metas.items()
        ]
    )
    spans_frame = to_orchestrator_clock(spans_frame, ("t_start_ns", "t_end_ns"), clock)
    spans = {int(r.node): (int(r.t_start_ns), int(r.t_end_ns)) for r in spans_frame.itertuples()}
    addr_to_node = {n["exp_addr"]: int(n["index"]) for n in nodes if n.get("exp_addr")}
    ifaces = {int(n["index"]): n["exp_iface"] for n in nodes if int(n["index"]) in metas}
    (width,) = bin_ns
    return {
        "counters": counters_from_bins(bins, width, addr_to_node, ifaces, spans, rate_bps),
        # At the accounting's own width: the checks cut them at window edges in quiet gaps
        # that can be shorter than 2 ms (an unshaped pipeline's activations).
        "wire_flows": flows_from_bins(snap_bins(bins, width), addr_to_node, width),
        "meta": metas,
    }


def _node_tables(
    raw_dir: Path,
    node_index: dict[str, int],
    clock: dict[str, Any] | None,
    wire: dict[str, Any] | None,
    sample_hz: float,
) -> dict[str, pd.DataFrame]:
    """The ops, steps, counters, sockets and host statistics of every node, each on the
    orchestrator's clock.
    The counters come from the BPF accounting (``wire``) when it ran, else from the sampler."""
    ops_files, steps_files = rank_table_file("ops", "*"), rank_table_file("steps", "*")
    ops = _concat(list(raw_dir.glob(f"*/{ops_files}")), ops_files, raw_dir)
    steps = _concat(list(raw_dir.glob(f"*/{steps_files}")), steps_files, raw_dir)
    ops = to_orchestrator_clock(ops, _TIME_COLUMNS["ops"], clock)
    steps = to_orchestrator_clock(steps, _TIME_COLUMNS["steps"], clock)
    counters = _per_node(raw_dir, NODE_COUNTERS_FILE, node_index)
    if counters:
        counters_df = pd.concat(counters, ignore_index=True)
        counters_df = counters_df[
            ["node", "iface", "t_ns", "tx_bytes", "rx_bytes", "tx_packets", "rx_packets"]
        ]
        counters_df = to_orchestrator_clock(counters_df, _TIME_COLUMNS["counters"], clock)
        # The sampler's resolution is its period (its samples jitter around it).
        counters_df["resolution_ns"] = np.int64(round(1e9 / sample_hz)) if sample_hz else 0
    elif wire is not None:
        counters_df = wire["counters"]
    else:
        raise FileNotFoundError(
            f"neither {NODE_WIRE_FILE} nor {NODE_COUNTERS_FILE} under {raw_dir}: "
            "did the wire accounting or the sampler run?"
        )
    sockets_df = _sampled(raw_dir, NODE_SOCKETS_FILE, SOCKET_SAMPLE_COLUMNS, node_index, clock)
    host_df = _sampled(raw_dir, NODE_HOST_FILE, HOST_SAMPLE_COLUMNS, node_index, clock)
    return {
        "ops": ops.sort_values(["rank", "t_issue_ns"]),
        "steps": steps.sort_values(["rank", "t_start_ns"]),
        "counters": counters_df.sort_values(["node", "t_ns"]),
        "sockets": sockets_df.sort_values(["node", "t_ns"]),
        "host": host_df.sort_values(["node", "t_ns"]),
    }


def _rank_tables(raw_dir: Path) -> dict[str, pd.DataFrame]:
    """Per-step loss and MoE routing: every rank writes them (empty for dense models)."""
    tables = {}
    for table in ("train", "moe"):
        files = sorted(raw_dir.glob(f"*/{rank_table_file(table, '*')}"))
        tables[table] = (
            pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            if files
            else pd.DataFrame()
        )
    return tables


def _cell_meta(
    params: dict[str, Any], warmup_steps: int, run_meta: dict[str, Any], ranks: list[dict]
) -> dict[str, Any]:
    """cell.json: the cell, what ran (world, backend, torch, plan) and how it was measured.
    The link is the shape the nodes applied (run.json ``shape``) as numbers: ``bw_bps`` (null
    uncapped), ``delay_ms``, ``jitter_ms``, ``loss_pct`` (read back by :func:`cell_link`)."""
    shape = LinkShape(**run_meta["shape"])
    return {
        "cell": cell_id(params),
        "params": params,
        "world_size": ranks[0]["world_size"] if ranks else None,
        "backend": ranks[0]["backend"] if ranks else None,
        **shape.numbers(),
        "bw_bps": shape.rate_bps,  # null, not NaN, uncapped: cell.json is strict JSON
        # Where a topology gives nodes links of their own: each node's rate (by node index).
        "bw_bps_per_node": _own_rates(run_meta, shape.rate_bps),
        "param_bytes": ranks[0]["grad_bytes_local"] if ranks else None,
        "grad_bytes": ranks[0]["grad_bytes_local"] if ranks else None,
        "grad_bytes_per_rank": [r["grad_bytes_local"] for r in ranks],
        "warmup_steps": int(warmup_steps),
        "t0_ns": run_meta["t_start_ns"],
        "t1_ns": run_meta["t_end_ns"],
        "qdisc_before": run_meta.get("qdisc_before"),
        "qdisc_after": run_meta.get("qdisc_after"),
        "torch": ranks[0]["torch"] if ranks else None,
        "plan": ranks[0].get("plan") if ranks else None,
        "captures": run_meta.get("captures"),
        # The capture's kernel under functional collectives: "native" (C++) or "python"
        # (a build was missing: more CPU per functional op, docs/overhead.md).
        "capture_kernel": sorted({r.get("capture", "python") for r in ranks}),
        "clock": run_meta.get("clock"),
        "links": run_meta.get("links"),
        # Which engine applied delay/jitter/loss, and its record (delayer lateness, drops).
        "link_engine": _cell_local_nodes(run_meta.get("link_engine"), run_meta.get("nodes")),
        # A leaf-spine fabric's caps for the cell and its uplink queues (cluster.fabric), and
        # the nodes whose own link the topology overrides.
        "fabric": run_meta.get("fabric"),
        "node_shapes": run_meta.get("node_shapes"),
        "placement": run_meta.get("placement"),
    }


def _cell_local_nodes(
    record: Mapping[str, Any] | None, nodes: list[dict] | None
) -> Mapping[str, Any] | None:
    """``record`` with its per-node entries (``nodes``, keyed by the cluster's node names) keyed
    ``node<i>`` by the cell's own node index, as every table numbers nodes: a cell placed over a
    leaf-spine's racks runs on, say, node0 and node2 as its nodes 0 and 1."""
    if not record or not record.get("nodes") or not nodes:
        return record
    index = {n["name"]: int(n["index"]) for n in nodes}
    local = {
        (f"node{index[name]}" if name in index else name): value
        for name, value in record["nodes"].items()
    }
    return {**record, "nodes": local}


def _own_rates(run_meta: Mapping[str, Any], cell_rate: int | None) -> dict[str, int | None] | None:
    """Each node's rate (keys: node indices as strings) when some node's differs from the
    cell's, else None."""
    if not run_meta.get("node_shapes") or "nodes" not in run_meta:
        return None
    rates = node_rates(run_meta)
    if all(rate == cell_rate for rate in rates.values()):
        return None
    return {str(i): rate for i, rate in sorted(rates.items())}


def cell_link(meta: Mapping[str, Any]) -> LinkShape:
    """The link a cell ran on, from its cell.json ``meta``: the applied shape's numbers
    :func:`_cell_meta` wrote (``bw_bps``, ``delay_ms``, ``jitter_ms``, ``loss_pct``; an
    impairment added since is 0); for a cell.json from before they were written, or one without
    them (an import), its link axes (``params``) parsed, missing ones at their defaults. ``cc``
    is the params' (the default without one). ValueError for a link axis the link model
    refuses."""
    params = meta.get("params") or {}
    if any(SHAPING[axis] in meta for axis in IMPAIRMENT_AXES):
        return LinkShape.from_numbers(meta, cc=str(params.get("cc") or DEFAULT_CC))
    return axes_shape(params)


def _wire_node_summary(meta: dict[str, Any]) -> dict[str, Any]:
    """What cell.json keeps of a node's wire.json: bin width, ring overruns, and the BPF totals
    beside the interface counters over the time it was attached."""
    iface = {k: meta["counters_end"][k] - meta["counters_start"][k] for k in meta["counters_end"]}
    return {
        "bin_ns": meta["bin_ns"],
        "overruns": meta.get("overruns"),
        "bpf": {
            "rx_bytes": meta["totals"]["ingress"]["bytes"],
            "tx_bytes": meta["totals"]["egress"]["bytes"],
        },
        "iface": {"rx_bytes": iface["rx_bytes"], "tx_bytes": iface["tx_bytes"]},
    }


def build_cell_tables(
    raw_dir: Path,
    cell: CellSettings,
    warmup_steps: int,
    paths: Mapping[str, Path],
) -> dict[str, Path]:
    """Write one cell's tables (ops, steps, counters, train, moe, sockets, host, wire_flows,
    nccl_ops parquet and cell.json) to ``paths`` (one per name of ``CELL_TABLE_FILES``, e.g.
    the rule's declared outputs or :func:`cell_table_paths`); returns them.

    ``cell`` is a training cell (every sweep axis set; the rule script reads the rule's params
    with :meth:`CellSettings.from_mapping`)."""
    params = _cell_params(cell)
    raw_dir = Path(raw_dir)
    paths = {name: Path(paths[name]) for name in CELL_TABLE_FILES}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    run_meta = json.loads((raw_dir / RUN_FILE).read_text())
    node_index = {n["name"]: int(n["index"]) for n in run_meta["nodes"]}
    clock = node_clock(run_meta, node_index)
    wire = _wire_tables(raw_dir, run_meta["nodes"], clock, node_rates(run_meta))
    sample_hz = float(run_meta.get("captures", {}).get("sample_hz") or 0)
    tables = {
        **_node_tables(raw_dir, node_index, clock, wire, sample_hz),
        **_rank_tables(raw_dir),
    }
    ranks = sorted(
        (json.loads(p.read_text()) for p in raw_dir.glob(f"*/{rank_meta_file('*')}")),
        key=lambda m: m["rank"],
    )
    flows = wire["wire_flows"] if wire else _pcap_flows(raw_dir, run_meta["nodes"], clock)
    tables["wire_flows"] = flows[WIRE_FLOW_COLUMNS]
    tables["nccl_ops"] = _nccl_ops(raw_dir, ranks)
    for name, frame in tables.items():
        _append_params(frame, params).to_parquet(paths[name], index=False)
    meta = _cell_meta(params, warmup_steps, run_meta, ranks)
    meta["wire"] = {
        **run_meta.get("wire", {"source": "counters", "reason": None}),
        "nodes": {str(i): _wire_node_summary(m) for i, m in (wire or {}).get("meta", {}).items()},
    }
    paths["cell"].write_text(json.dumps(meta, indent=2, default=str))
    return paths
