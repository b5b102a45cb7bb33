"""Synchronization and temporal structure per cell (docs/sync.md, docs/temporal.md): the
aggregated ``sync_summary`` and ``temporal_onoff`` tables, one row per cell."""

from __future__ import annotations

import pandas as pd

from commscope.report.sections._base import Section, declared
from commscope.units import fmt_bytes, fmt_count, fmt_ms, fmt_share

_SYNC_INTRO = (
    "Per cell, its steady (median measured) step: collectives, point-to-point ops and barriers "
    "per step, the skew of world-wide collectives (last rank's issue minus the first's), the "
    "communication ratio (time a rank is blocked waiting on communication, from the capture's "
    "recorded waits, over the step; for traces recorded before the waits, each op's whole "
    "interval, an upper bound, marked in the 'exposed from' column), the critical path "
    "(compute vs communication on the chain of ranks that sets the step's end) and, for "
    "pipeline cells, the measured bubble next to (p-1)/(p-1+m) and the predictor's. "
    "Definitions: docs/sync.md."
)
_TEMPORAL_INTRO = (
    "Per cell (node 0, transmit): the share of 100 µs bins in which the link is on (above 10 % "
    "of the cap, or of the cell's peak bin without one), bursts and their median size and "
    "duration, the median gap between bursts, and the class: streaming when the link is on "
    "at least half the time and the 10 ms rate's coefficient of variation is at most 0.5, "
    "bursty otherwise. Definitions: docs/temporal.md."
)


# What tells the cells of the structure tables apart, leftmost in each row; the second group
# only where the table's cells differ in it (a DDP cell under CUBIC and one under BBR, repeats).
_STRUCTURE_KEYS = ("strategy", "model", "nodes", "ranks_per_node", "bw", "delay", "loss")
_STRUCTURE_KEYS_IF_VARIED = ("jitter", "cc", "repeat")


def _structure_keys(table: pd.DataFrame) -> list[str]:
    """:data:`_STRUCTURE_KEYS`, then each of :data:`_STRUCTURE_KEYS_IF_VARIED` that takes more
    than one value in ``table``."""
    varied = [k for k in _STRUCTURE_KEYS_IF_VARIED if k in table and table[k].nunique() > 1]
    return [*_STRUCTURE_KEYS, *varied]


def sync_section(sync: pd.DataFrame) -> pd.DataFrame:
    """The synchronization table: one row per cell of the aggregated ``sync_summary``."""
    if sync.empty:
        return sync
    keys = _structure_keys(sync)
    out = sync[keys].astype(str).copy()
    out["collectives / step"] = sync["collectives_per_step"].map(fmt_count)
    out["p2p / step"] = sync["p2p_per_step"].map(fmt_count)
    out["world skew (mean)"] = sync["sync_skew_mean_s"].map(fmt_ms)
    out["comm ratio (median rank)"] = sync["comm_ratio_median"].map(fmt_share)
    if "exposed_source" in sync:
        out["exposed from"] = sync["exposed_source"].astype(str)
    out["critical path"] = sync["critical_path_s"].map(fmt_ms)
    out["of it communication"] = sync["critical_comm_share"].map(fmt_share)
    out["bubble measured"] = sync["bubble_measured_fwd_bwd"].map(fmt_share)
    out["bubble (p-1)/(p-1+m)"] = sync["bubble_analytic"].map(fmt_share)
    return out.sort_values(keys).reset_index(drop=True)


def temporal_section(onoff: pd.DataFrame) -> pd.DataFrame:
    """The temporal table: one row per cell, node 0's transmit side of ``temporal_onoff``."""
    if onoff.empty:
        return onoff
    rows = onoff[(onoff["node"] == onoff["node"].min()) & (onoff["direction"] == "tx")]
    keys = _structure_keys(rows)
    out = rows[keys].astype(str).copy()
    out["on share"] = rows["on_fraction"].map(fmt_share)
    out["bursts"] = rows["n_bursts"].map(fmt_count)
    out["burst size (median)"] = rows["burst_bytes_median"].map(fmt_bytes)
    out["burst duration (median)"] = (rows["burst_ms_median"] / 1e3).map(fmt_ms)
    out["gap (median)"] = (rows["gap_ms_median"] / 1e3).map(fmt_ms)
    out["class"] = rows["pattern"].astype(str)
    return out.sort_values(keys).reset_index(drop=True)


SYNC = Section(
    "Synchronization structure per cell",
    _SYNC_INTRO,
    lambda results: sync_section(results.table("sync_summary")),
    declared("sync_summary"),
    place="detail",
)
TEMPORAL = Section(
    "Temporal structure on the wire",
    _TEMPORAL_INTRO,
    lambda results: temporal_section(results.table("temporal_onoff")),
    declared("temporal_onoff"),
    place="detail",
)
