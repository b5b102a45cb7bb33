"""Helpers shared by the metric modules: cell parameters, per-cell iteration, rank placement."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import PARAM_COLUMNS


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


def _params_from(meta: dict[str, Any], *frames: pd.DataFrame) -> dict[str, Any]:
    """Cell parameters from the tables themselves, falling back to cell.json."""
    for df in frames:
        if not df.empty and _param_cols(df):
            return {c: df[c].iloc[0] for c in _param_cols(df)}
    params = {"cell": meta.get("cell")}
    params.update(meta.get("params", {}))
    return params
