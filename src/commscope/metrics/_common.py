"""Helpers shared by the metric modules: cell parameters, per-cell iteration, rank placement."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import PARAM_COLUMNS

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000


def _param_cols(df: pd.DataFrame) -> list[str]:
    """The cell parameter columns present in ``df``, in canonical order."""
    return [c for c in PARAM_COLUMNS if c in df.columns]


def _per_cell(df: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    """Yield ``(cell parameters, rows of that cell)`` for each cell in ``df``."""
    if df.empty:
        return
    if "cell" not in df.columns:
        yield {c: df[c].iloc[0] for c in _param_cols(df)}, df
        return
    for _, sub in df.groupby("cell", sort=True, dropna=False):
        yield {c: sub[c].iloc[0] for c in _param_cols(sub)}, sub


def _with_params(params: dict[str, Any], df: pd.DataFrame) -> pd.DataFrame:
    """Prefix ``df`` with constant parameter columns (parameters first, as in every table)."""
    # Scalars broadcast over the index: far cheaper than building per-row lists.
    lead = pd.DataFrame(params, index=df.index)
    return pd.concat([lead, df.drop(columns=list(params), errors="ignore")], axis=1)


def _concat(frames: Iterable[pd.DataFrame], columns: Sequence[str]) -> pd.DataFrame:
    """Concatenate per-cell results; an empty input still gives the documented columns."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(columns))
    return pd.concat(frames, ignore_index=True)


def _as_int_ns(values: pd.Series | np.ndarray) -> np.ndarray:
    """Timestamps as int64 ns, nulls dropped (nullable or float columns both accepted)."""
    s = pd.Series(values).dropna()
    return s.to_numpy(dtype="int64")


def _groupby(df: pd.DataFrame, keys: list[str]):
    # dropna=False: a null parameter (e.g. a cap recorded as None) must not drop rows.
    return df.groupby(keys, sort=True, dropna=False, observed=True)


@dataclass
class _Placement:
    """Which node each rank runs on.

    ``recorded`` is what the trace says (every rank that issued an op); a rank that issued none
    (only ever a peer or a root) is placed by ``ranks_per_node``, as ranks on a node are
    contiguous, and at node -1 when that is unknown too.
    """

    recorded: dict[int, int]
    ranks_per_node: int = 0

    @classmethod
    def from_ops(cls, ops: pd.DataFrame, ranks_per_node: Any = None) -> _Placement:
        recorded: dict[int, int] = {}
        if not ops.empty and {"rank", "node"} <= set(ops.columns):
            pairs = ops[["rank", "node"]].drop_duplicates("rank")
            recorded = {int(r): int(n) for r, n in pairs.itertuples(index=False, name=None)}
        return cls(recorded, _positive_int(ranks_per_node))

    def node(self, rank: int) -> int:
        """The node of global rank ``rank`` (-1 when it cannot be placed)."""
        rank = int(rank)
        if rank in self.recorded:
            return self.recorded[rank]
        return rank // self.ranks_per_node if self.ranks_per_node and rank >= 0 else -1


def _positive_int(value: Any) -> int:
    """``value`` as a non-negative int; 0 when absent, null or not a number."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return max(number, 0)


def _params_from(meta: dict[str, Any], *frames: pd.DataFrame) -> dict[str, Any]:
    """Cell parameters from the tables themselves, falling back to cell.json."""
    for df in frames:
        if not df.empty and _param_cols(df):
            return {c: df[c].iloc[0] for c in _param_cols(df)}
    params = {"cell": meta.get("cell")}
    params.update(meta.get("params", {}))
    return params
