"""Framework-level volume and messages: bytes and op counts per op type and step, message
sizes and their CDFs, from ``ops.parquet`` alone."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from commscope.metrics._common import _groupby, _param_cols


def op_volume(ops: pd.DataFrame, per_rank: bool = True) -> pd.DataFrame:
    """Framework bytes and op count per op type and step.

    ``per_rank=True`` gives one row per (rank, node, step, op); ``per_rank=False`` sums over
    ranks, one row per (step, op), with ``n_ranks`` the number of ranks that issued that op.
    Ops outside a training step keep ``step == -1`` (e.g. DDP's initial parameter broadcast).

    Columns: cell params, [rank, node,] step, op, bytes, count[, n_ranks].
    """
    params = _param_cols(ops)
    keys = [*params, "rank", "node", "step", "op"] if per_rank else [*params, "step", "op"]
    value_cols = ["bytes", "count"] if per_rank else ["bytes", "count", "n_ranks"]
    if ops.empty:
        return pd.DataFrame(columns=[*keys, *value_cols])
    aggs: dict[str, tuple[str, str]] = {"bytes": ("bytes", "sum"), "count": ("bytes", "size")}
    if not per_rank:
        aggs["n_ranks"] = ("rank", "nunique")
    out = _groupby(ops, keys).agg(**aggs).reset_index()
    return out[[*keys, *value_cols]]


def bytes_per_step(ops: pd.DataFrame) -> pd.DataFrame:
    """Framework bytes and message (op) count per step, summed over ranks and op types.

    Columns: cell params, step, bytes, messages.
    """
    keys = [*_param_cols(ops), "step"]
    if ops.empty:
        return pd.DataFrame(columns=[*keys, "bytes", "messages"])
    return (
        _groupby(ops, keys)
        .agg(bytes=("bytes", "sum"), messages=("bytes", "size"))
        .reset_index()[[*keys, "bytes", "messages"]]
    )


MSG_SIZE_COLUMNS = ["rank", "node", "step", "phase", "op", "group_size", "bytes", "measured"]


def message_sizes(ops: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """One row per message (op issued by a rank) with its payload size, for CDFs/histograms.

    ``measured`` is true for ops inside a measured (non-warm-up) step, so plots can leave out
    warm-up and out-of-step traffic (``step == -1``) without needing the step table.

    Columns: cell params, rank, node, step, phase, op, group_size, bytes, measured.
    """
    params = _param_cols(ops)
    if ops.empty:
        return pd.DataFrame(columns=[*params, *MSG_SIZE_COLUMNS])
    out = ops[[*params, *[c for c in MSG_SIZE_COLUMNS if c != "measured"]]].copy()
    out["measured"] = out["step"] >= max(warmup_steps, 0)
    return out.reset_index(drop=True)


def size_cdf(msgs: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """Empirical CDF of message sizes: fraction of messages of at most ``bytes``.

    ``msgs`` is any frame with a ``bytes`` column (ops or :func:`message_sizes`). ``by`` are
    the grouping columns (default: the cell parameters plus ``op``; pass e.g.
    ``["strategy"]`` for one CDF per strategy across cells). Zero-byte ops (barriers) are left
    out: they carry no payload and have no place on a log-size axis. One row per distinct size,
    so the CDF is exact and ``cum_fraction`` is non-decreasing and ends at 1 in every group.

    Columns: by..., bytes, count, cum_fraction.
    """
    by = [*_param_cols(msgs), "op"] if by is None else list(by)
    cols = [*by, "bytes", "count", "cum_fraction"]
    sized = msgs[msgs["bytes"] > 0] if not msgs.empty else msgs
    if sized.empty:
        return pd.DataFrame(columns=cols)
    counts = _groupby(sized, [*by, "bytes"]).size().rename("count").reset_index()
    counts = counts.sort_values([*by, "bytes"], kind="stable").reset_index(drop=True)
    if by:
        cum = counts.groupby(by, sort=False, dropna=False, observed=True)["count"].cumsum()
        total = counts.groupby(by, sort=False, dropna=False, observed=True)["count"].transform(
            "sum"
        )
    else:
        cum, total = counts["count"].cumsum(), counts["count"].sum()
    counts["cum_fraction"] = cum / total
    return counts[cols]
