"""Cadence of one cell's op issues and the step-to-step similarity of its op sequence, from the
ops table (not the wire; issue 13, item 1; definitions in docs/temporal.md).

:func:`op_cadence`: per rank, over the measured steps, the inter-arrival of op issues and how
often a step repeats the modal op sequence. One of the tables of
:func:`~commscope.metrics.temporal.temporal_tables`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import GROUP_KIND_COLUMN
from commscope.metrics._temporal_common import _cov, _finish, _measured, _params, _stats
from commscope.units import NS_PER_MS

OP_CADENCE_COLUMNS = [
    "rank",
    "n_steps",
    "n_ops",
    "ops_per_step_median",
    "issue_interval_ms_median",
    "issue_interval_ms_mean",
    "issue_interval_cov",
    "seq_distinct",
    "seq_len_modal",
    "seq_modal_share",
]


def _codes(column: pd.Series) -> np.ndarray:
    """Integer codes of ``column``'s values (nulls one code of their own); a column of lists
    (``group_ranks`` as a parquet list) by their text."""
    if column.dtype == object and column.notna().any():
        first = column.dropna().iloc[0]
        if not isinstance(first, str):
            column = column.map(lambda v: None if v is None else ",".join(str(int(r)) for r in v))
    return pd.factorize(column, use_na_sentinel=False)[0].astype("uint64")


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 (wrapping): nearby inputs give unrelated hashes."""
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _op_identity(ops: pd.DataFrame) -> np.ndarray:
    """A 64-bit hash of each op's (op, bytes, group): ``group_kind`` when recorded and
    ``group_ranks``, else the process-group name."""
    group = "group_ranks" if "group_ranks" in ops.columns else "group"
    sizes = ops["bytes"].to_numpy(dtype="int64", na_value=-1).astype("uint64")
    parts = [_codes(ops["op"]), sizes]
    if group in ops.columns:
        parts.append(_codes(ops[group]))
    if GROUP_KIND_COLUMN in ops.columns:
        parts.append(_codes(ops[GROUP_KIND_COLUMN]))
    h = np.zeros(len(ops), dtype="uint64")
    with np.errstate(over="ignore"):
        for i, part in enumerate(parts):
            h = _mix(h ^ _mix(part + np.uint64(i + 1)))
    return h


def _sorted_by(*keys: np.ndarray) -> np.ndarray | None:
    """The permutation sorting rows by ``keys`` (first the primary key), or None when they
    are sorted already (the usual case; a sort of 10**7 rows costs seconds)."""
    different = np.zeros(len(keys[0]) - 1, dtype=bool) if len(keys[0]) else np.zeros(0, bool)
    for key in keys:
        step = np.sign(np.diff(key))
        # Rows still tied on the earlier keys compare on this one.
        if bool(np.any(step[~different] < 0)):
            return np.lexsort(keys[::-1])
        different |= step != 0
    return None


def _sequence_hashes(
    rank: np.ndarray, step: np.ndarray, identity: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(rank, step, length, hash)`` per (rank, step) run of the ops (sorted by rank, step and
    issue order): the number of its ops and a 64-bit hash of the sequence of their identities,
    the wrapping sum of each identity mixed with its position (order matters; two different
    sequences collide with probability ~2**-64)."""
    n = len(rank)
    new = np.ones(n, dtype=bool)
    new[1:] = (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
    starts = np.flatnonzero(new)
    lengths = np.diff(np.append(starts, n))
    position = (np.arange(n) - np.repeat(starts, lengths)).astype("uint64")
    with np.errstate(over="ignore"):
        hashed = _mix(identity ^ _mix(position + np.uint64(0x9E3779B97F4A7C15)))
        sums = np.add.reduceat(hashed, starts) if n else hashed
    return rank[starts], step[starts], lengths, sums


def op_cadence(
    ops: pd.DataFrame,
    step_table: pd.DataFrame,
    params: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Cadence of op issues and step-to-step similarity of the op sequence, per rank, over the
    measured steps.

    ``issue_interval_ms_*``: the intervals between consecutive ``t_issue_ns`` of the rank's
    ops of measured steps, in time order (ms; median, mean; ``issue_interval_cov`` =
    population standard deviation / mean). ``ops_per_step_median``: ops per measured step.
    The op sequence of a step is the list of (op, bytes, group) of the rank's ops in issue
    order (ties by ``seq``), group being ``group_kind`` when recorded and ``group_ranks``; the
    modal sequence is the most frequent over the measured steps (a step without ops has the
    empty one): ``seq_modal_share`` = steps whose sequence equals it / ``n_steps``,
    ``seq_distinct`` the number of different sequences, ``seq_len_modal`` its length. Ops
    without ``t_issue_ns`` are left out of both.

    Columns: cell params, then :data:`OP_CADENCE_COLUMNS`.
    """
    out_params = _params(params, ops, step_table)
    if ops.empty or step_table.empty:
        return _finish(out_params, [], OP_CADENCE_COLUMNS)
    measured_steps = np.unique(_measured(step_table)["step"].to_numpy(dtype="int64"))
    n_steps = len(measured_steps)
    all_ranks = np.unique(ops["rank"].to_numpy(dtype="int64"))
    # An op without an issue time (an imported trace's) has no place in a sequence or cadence.
    issued = ops["t_issue_ns"].notna().to_numpy()
    keep = issued & np.isin(ops["step"].to_numpy(dtype="int64"), measured_steps)
    rank = ops["rank"].to_numpy(dtype="int64")[keep]
    step = ops["step"].to_numpy(dtype="int64")[keep]
    issue = ops["t_issue_ns"].to_numpy(dtype="int64", na_value=0)[keep]
    seq = ops["seq"].to_numpy(dtype="int64")[keep] if "seq" in ops.columns else np.zeros_like(rank)
    identity = _op_identity(ops)[keep]
    order = _sorted_by(rank, step, issue, seq)
    if order is not None:
        rank, step, issue, identity = rank[order], step[order], issue[order], identity[order]
    seq_rank, _, seq_length, seq_hash = _sequence_hashes(rank, step, identity)
    # The intervals in time order per rank (steps overlapping in time would not be).
    order = _sorted_by(rank, issue)
    if order is not None:
        rank, issue = rank[order], issue[order]
    same_rank = rank[1:] == rank[:-1]
    gaps_ms = np.diff(issue)[same_rank].astype("float64") / NS_PER_MS
    gap_rank = rank[1:][same_rank]
    records = []
    for r in all_ranks:
        gaps = gaps_ms[gap_rank == r]
        mine = seq_rank == r
        # Steps where the rank issued nothing have the empty sequence (hash 0, length 0).
        empty_steps = max(n_steps - int(mine.sum()), 0)
        lengths = np.concatenate([seq_length[mine], np.zeros(empty_steps, dtype="int64")])
        hashes = np.concatenate([seq_hash[mine], np.zeros(empty_steps, dtype="uint64")])
        counts = pd.DataFrame({"hash": hashes, "length": lengths}).value_counts(sort=True)
        records.append(
            {
                "rank": int(r),
                "n_steps": n_steps,
                "n_ops": int(seq_length[mine].sum()),
                "ops_per_step_median": float(np.median(lengths)) if n_steps else float("nan"),
                "issue_interval_ms_median": _stats(gaps)[0],
                "issue_interval_ms_mean": float(gaps.mean()) if len(gaps) else float("nan"),
                "issue_interval_cov": _cov(gaps),
                "seq_distinct": len(counts),
                "seq_len_modal": int(counts.index[0][1]) if len(counts) else 0,
                "seq_modal_share": float(counts.iloc[0]) / n_steps if n_steps else float("nan"),
            }
        )
    return _finish(out_params, records, OP_CADENCE_COLUMNS)


__all__ = ["OP_CADENCE_COLUMNS", "op_cadence"]
