"""The one-row headline summary of a cell."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from commscope.cell.load import CellTraces
from commscope.cell.parse import cell_link
from commscope.contracts import P2P_OPS
from commscope.metrics.counters import bin_width_ns, counted_wire_bytes, traffic_shape
from commscope.metrics.fidelity import (
    FIDELITY_SUMMARY_COLUMNS,
    cell_verdict,
    delayer_lateness,
    fidelity_table,
)
from commscope.metrics.framework import wire_vs_framework
from commscope.metrics.matrix import comm_matrix, node_matrix, node_traffic_split
from commscope.metrics.steps import step_times, training_window
from commscope.spec.link import IMPAIRMENT_AXES, SHAPING, axes_shape
from commscope.units import NS_PER_S

# Bin width at which cell_summary() reports burstiness: fine enough for the micro-bursts that
# live below 10 ms to show, coarse enough for a 100 Hz sampler to resolve.
SUMMARY_BIN_MS = 10.0


# The link columns of the summary: the delay, jitter and loss the cell's nodes applied, as
# numbers (cell.json, :func:`commscope.cell.parse.cell_link`; the cap, ``bw_bps``, leads the
# summary), then the engine that applied them and what that engine measured while the cell ran
# (run.json ``link_engine``, copied into cell.json; see :func:`link_engine_summary`).
LINK_SUMMARY_COLUMNS = [
    *(SHAPING[axis] for axis in IMPAIRMENT_AXES),
    "link_engine",
    "delay_late_us_mean",
    "delay_late_us_p99",
    "delay_undelayed_share",
    "loss_packets_seen",
    "loss_measured_pct",
]

SUMMARY_COLUMNS = [
    "world_size",
    "bw_bps",
    "measured_steps",
    "step_time_mean_s",
    "step_time_std_s",
    "framework_bytes_per_step",
    "framework_bytes_per_step_per_rank",
    "messages_per_step",
    "p2p_byte_share",
    "internode_bytes_per_step",
    "intranode_bytes_per_step",
    "wire_tx_bytes_per_step_per_node",
    "throughput_mean_bps",
    "bw_utilization",
    "peak_to_mean_10ms",
    "cov_10ms",
    "shape_resolved_10ms",
    "peak_to_mean_100us",
    "cov_100us",
    "peak_to_mean_1ms",
    "cov_1ms",
    "peak_to_mean_100ms",
    "cov_100ms",
    "wire_over_framework",
    "wire_source",
    "wire_resolution_us",
    "wire_fallback",
    "wire_offload",
    *LINK_SUMMARY_COLUMNS,
    *FIDELITY_SUMMARY_COLUMNS,
]
# The burstiness columns of the summary beside the 10 ms ones: suffix -> bin width (ms).
SHAPE_SUMMARY_BINS: dict[str, float] = {"100us": 0.1, "1ms": 1.0, "100ms": 100.0}


def _wire_summary(
    traces: CellTraces, st: pd.DataFrame, n_measured: int, bw_bps: int | None
) -> dict[str, Any]:
    """The interface-counter columns of :func:`cell_summary` (NaN, and not resolved, without
    counters or measured steps)."""
    nan = float("nan")
    wire_row: dict[str, Any] = {}
    for col in (
        "wire_tx_bytes_per_step_per_node",
        "throughput_mean_bps",
        "bw_utilization",
        "peak_to_mean_10ms",
        "cov_10ms",
        "wire_over_framework",
        *(f"{m}_{suffix}" for suffix in SHAPE_SUMMARY_BINS for m in ("peak_to_mean", "cov")),
    ):
        wire_row[col] = nan
    wire_row["shape_resolved_10ms"] = False
    wire_row.update(_wire_source(traces))
    if n_measured and not traces.counters.empty:
        window = training_window(st)
        wire = counted_wire_bytes(traces.counters, window)
        duration_s = (window[1] - window[0]) / NS_PER_S
        wire_row["wire_tx_bytes_per_step_per_node"] = (
            float(wire["wire_tx_bytes"].mean()) / n_measured
        )
        wire_row["throughput_mean_bps"] = float(wire["wire_tx_bytes"].mean()) * 8 / duration_s
        if bw_bps:
            wire_row["bw_utilization"] = wire_row["throughput_mean_bps"] / float(bw_bps)
        widths = (SUMMARY_BIN_MS, *SHAPE_SUMMARY_BINS.values())
        shape = traffic_shape(traces.counters, window, widths)
        tx = shape[shape["direction"] == "tx"]
        for suffix, width in {"10ms": SUMMARY_BIN_MS, **SHAPE_SUMMARY_BINS}.items():
            at = tx[tx["bin_ms"].map(bin_width_ns) == bin_width_ns(width)]
            wire_row[f"peak_to_mean_{suffix}"] = float(at["peak_to_mean"].mean())
            wire_row[f"cov_{suffix}"] = float(at["cov"].mean())
            if suffix == "10ms":
                wire_row["shape_resolved_10ms"] = bool(at["resolved"].all()) if len(at) else False
    if not traces.ops.empty and not traces.counters.empty:
        wf = wire_vs_framework(traces.ops, traces.counters, traces.meta)
        fw_total = float(wf["framework_tx_bytes"].sum())
        if fw_total > 0:
            wire_row["wire_over_framework"] = float(wf["wire_tx_bytes"].sum()) / fw_total
    return wire_row


def _wire_source(traces: CellTraces) -> dict[str, Any]:
    """How the cell's wire was measured (cell.json ``wire``, the counters' ``resolution_ns``):
    ``bpf`` or ``counters`` (the /proc sampler), its resolution in µs (NaN unknown), and why a
    requested BPF source fell back ('' when it did not)."""
    wire = traces.meta.get("wire") or {}
    res = traces.counters.get("resolution_ns") if not traces.counters.empty else None
    res_ns = float(res.max()) if res is not None and res.notna().any() else 0.0
    links = (traces.meta.get("links") or {}).values()
    return {
        "wire_source": str(wire.get("source") or "counters"),
        "wire_resolution_us": res_ns / 1000 if res_ns > 0 else float("nan"),
        "wire_fallback": str(wire.get("reason") or ""),
        # TSO/GSO on at a node: its packets are super-packets of up to 64 KB, not frames.
        "wire_offload": any(bool(link.get("tso") or link.get("gso")) for link in links),
    }


def link_numbers(params: Mapping[str, Any]) -> dict[str, float]:
    """A cell's link axes as numbers (:meth:`commscope.spec.link.LinkShape.numbers` of
    :func:`commscope.spec.link.axes_shape`): ``bw_bps`` (NaN uncapped), ``delay_ms``,
    ``jitter_ms`` and ``loss_pct``, parsed from its axis strings (``"50mbit"``, ``"5ms"``,
    ``"0.1pct"``), missing axes at their defaults. Only for what has no link numbers of its own:
    a table with the :data:`commscope.spec.link.LINK_NUMBER_COLUMNS` (the summary, the study
    tables) is read, not re-parsed. ValueError for a value the link model refuses."""
    return axes_shape(params).numbers()


def link_engine_summary(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The link-engine columns of :func:`cell_summary` from a run's ``link_engine`` record
    (run.json, copied into cell.json; None for runs recorded before there was one).

    * link_engine: the engine that applied delay, jitter and loss (``netem`` or ``nfqueue``),
      ``''`` when the cell had none of them (or the run predates the record).
    * delay_late_us_mean, delay_late_us_p99: how late the NFQUEUE delayer released packets
      after their due time, the worst node's mean and p99 (µs); NaN without a delayer that
      released any packet (netem records no such statistic).
    * delay_undelayed_share: packets the delayer let through at once instead of holding them
      (its ring or the kernel's queue full: ``overflow`` plus ``missed``), over every packet
      queued to it, summed over nodes.
    * loss_packets_seen, loss_measured_pct: packets the nftables loss rules saw and the share
      of them dropped (%), summed over nodes; NaN without loss rules.
    """
    nan = float("nan")
    record = record or {}
    nodes = [node for node in (record.get("nodes") or {}).values() if node]
    delayers = [node["delayer"] for node in nodes if node.get("delayer")]
    # A delayer that released nothing reports a lateness of 0: no measurement, not a perfect one.
    timed = [d for d in delayers if d.get("late_us") and int(d.get("released", 1)) > 0]
    queued = sum(int(d.get("packets", 0)) + int(d.get("missed", 0)) for d in delayers)
    undelayed = sum(int(d.get("overflow", 0)) + int(d.get("missed", 0)) for d in delayers)
    losses = [node["loss"] for node in nodes if node.get("loss")]
    seen = sum(int(loss.get("seen", 0)) for loss in losses)
    dropped = sum(int(loss.get("dropped", 0)) for loss in losses)
    return {
        "link_engine": str(record.get("engine") or ""),
        "delay_late_us_mean": max((float(d["late_us"]["mean"]) for d in timed), default=nan),
        "delay_late_us_p99": max((float(d["late_us"]["p99"]) for d in timed), default=nan),
        "delay_undelayed_share": undelayed / queued if queued else nan,
        "loss_packets_seen": float(seen) if losses else nan,
        "loss_measured_pct": 100 * dropped / seen if seen else nan,
    }


def cell_summary(
    traces: CellTraces,
    node_mat: pd.DataFrame | None = None,
    fidelity: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The headline numbers of one cell, one row, over its measured (non-warm-up) steps.

    * step_time_mean_s / step_time_std_s: step duration across ranks (sample std, ddof=1).
    * framework_bytes_per_step (all ranks) and ..._per_rank (divided by world_size),
      messages_per_step: ops issued by all ranks; steps without any op count as zero.
    * p2p_byte_share: share of framework bytes in send/recv.
    * internode_bytes_per_step / intranode_bytes_per_step: bytes per measured step the
      ranks send, under :func:`op_destinations`, to ranks on other nodes (the off-diagonal
      of :func:`node_matrix`: what the network carries) and on their own node (the
      diagonal: loopback). ``node_mat`` is this cell's node matrix when the caller already
      has it; otherwise it is computed over the measured steps of ``traces.steps``.
    * wire_tx_bytes_per_step_per_node: interface tx bytes inside the measured window divided
      by the measured steps, averaged over nodes.
    * throughput_mean_bps: tx rate over the window, averaged over nodes; bw_utilization
      divides it by the cap (NaN when uncapped).
    * peak_to_mean_10ms, cov_10ms: tx burstiness at 10 ms bins averaged over nodes (NaN when
      the counters do not resolve 10 ms, by their ``resolution_ns`` or, without it, their
      sampling interval; shape_resolved_10ms says so). The ``shape`` table has the same at
      0.1, 1 and 100 ms.
    * peak_to_mean_100us / _1ms / _100ms, cov_...: the same at the other widths (NaN where
      the counters do not resolve them).
    * wire_over_framework: total wire tx over total modelled inter-node framework tx for the
      whole run (see :func:`wire_vs_framework`).
    * wire_source (``bpf`` or ``counters``), wire_resolution_us (the counters' resolution),
      wire_fallback (why a requested BPF source fell back; '' when it did not), wire_offload
      (TSO/GSO was on at some node: packets are super-packets there, not frames).
    * bw_bps (NaN uncapped), delay_ms, jitter_ms, loss_pct: the link the cell's nodes applied,
      as numbers (cell.json, :func:`commscope.cell.parse.cell_link`); link_engine and what it
      measured (:func:`link_engine_summary`, from cell.json ``link_engine``).
    * monitored, host_limited, limited_by, ranks_wait_share, ..., shaper_checked,
      achieved_over_cap, ...: the fidelity monitor's verdict over the measured steps
      (:func:`commscope.metrics.fidelity.cell_verdict` of ``fidelity``, the cell's fidelity
      table; when not given, computed from ``traces.host`` and the delayers' record, without
      the shaper check, whose senders' egress bins only the raw directory has).

    Columns: cell params, then SUMMARY_COLUMNS.
    """
    params = traces.params
    st = step_times(traces.steps, traces.warmup_steps)
    measured = st[~st["warmup"].astype(bool)] if not st.empty else st
    n_measured = len(measured)
    nan = float("nan")
    row: dict[str, Any] = dict(params)
    world_size = traces.meta.get("world_size")
    link = cell_link(traces.meta)
    numbers = link.numbers()
    row["world_size"] = world_size
    row["bw_bps"] = numbers["bw_bps"]
    row["measured_steps"] = n_measured
    durations = measured["duration_s"].astype("float64") if n_measured else pd.Series([nan])
    row["step_time_mean_s"] = float(durations.mean())
    row["step_time_std_s"] = float(durations.std(ddof=1)) if n_measured > 1 else nan

    measured_ops = (
        traces.ops[traces.ops["step"].isin(measured["step"])]
        if not traces.ops.empty and n_measured
        else traces.ops.iloc[0:0]
    )
    total_bytes = float(measured_ops["bytes"].sum()) if not measured_ops.empty else 0.0
    per_step = total_bytes / n_measured if n_measured else nan
    row["framework_bytes_per_step"] = per_step
    row["framework_bytes_per_step_per_rank"] = per_step / world_size if world_size else nan
    row["messages_per_step"] = len(measured_ops) / n_measured if n_measured else nan
    p2p = measured_ops["bytes"][measured_ops["op"].isin(P2P_OPS)].sum() if total_bytes else 0
    row["p2p_byte_share"] = float(p2p) / total_bytes if total_bytes else nan
    if node_mat is None:
        node_mat = node_matrix(
            comm_matrix(traces.ops, measured_steps=measured["step"], backend=traces.backend)
        )
    inter, intra = node_traffic_split(node_mat)
    row["internode_bytes_per_step"] = inter if n_measured else nan
    row["intranode_bytes_per_step"] = intra if n_measured else nan

    row.update(_wire_summary(traces, st, n_measured, link.rate_bps))
    row.update({SHAPING[axis]: numbers[SHAPING[axis]] for axis in IMPAIRMENT_AXES})
    row.update(link_engine_summary(traces.meta.get("link_engine")))
    if fidelity is None:
        window = training_window(measured) if n_measured else None
        delayers = delayer_lateness(traces.meta.get("link_engine"))
        fidelity = fidelity_table(traces.host, window, delayers=delayers)
    row.update(cell_verdict(fidelity))
    return pd.DataFrame([row], columns=[*params, *SUMMARY_COLUMNS])
