"""Helpers shared by the metric modules: cell parameters, per-cell iteration, rank placement,
and the results one cell's metrics share while they are computed (:func:`shared_results`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from commscope.collectives.traffic import op_sends
from commscope.contracts import PARAM_COLUMNS


def _param_cols(df: pd.DataFrame) -> list[str]:
    """The cell parameter columns present in ``df``, in canonical order."""
    return [c for c in PARAM_COLUMNS if c in df.columns]


def _per_cell(df: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    """Yield ``(cell parameters, rows of that cell)`` for each cell in ``df`` (``df`` itself,
    not a copy, when it holds one cell: a cell's table of 10**7 counter samples is one)."""
    if df.empty:
        return
    if "cell" not in df.columns or _one_value(df["cell"]):
        yield {c: df[c].iloc[0] for c in _param_cols(df)}, df
        return
    for _, sub in df.groupby("cell", sort=True, dropna=False):
        yield {c: sub[c].iloc[0] for c in _param_cols(sub)}, sub


def _one_value(column: pd.Series) -> bool:
    """Whether every value of ``column`` equals its first (a null first value never does)."""
    first = column.iloc[0]
    return not pd.isna(first) and bool((column == first).all())


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


# --------------------------------------------------------------------------------------------
# Results shared while one cell's metrics are computed
# --------------------------------------------------------------------------------------------

# Several tables of a cell start from the same intermediate results: the cleaned counter series
# (throughput, shape, summary, wire and crosscheck all need them), the cross-validation window
# (crosscheck, matrix_check, sockets), the ops inside it and the transfers they imply. Inside
# shared_results() each is computed once; outside it nothing is remembered, so a caller that
# changes a frame between two calls never sees a stale result.
_SHARED: ContextVar[dict[Hashable, tuple[tuple[object, ...], Any]] | None] = ContextVar(
    "commscope_metrics_shared", default=None
)

T = TypeVar("T")


@contextmanager
def shared_results() -> Iterator[None]:
    """Within this block, intermediate results computed from the same input objects (frames,
    counter series, a cell's traces) are computed once and shared (:func:`_shared`). The
    inputs must not be modified inside the block."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _shared(key: Hashable, inputs: tuple[object, ...], compute: Callable[[], T]) -> T:
    """``compute()``, or inside :func:`shared_results` the value computed before for the same
    ``key`` and the very same ``inputs`` objects (identity, not equality: comparing frames
    would cost what is being saved). The entry keeps ``inputs`` alive, so their ids cannot be
    reused by other objects while it exists. Callers must treat the value as read-only."""
    cache = _SHARED.get()
    if cache is None:
        return compute()
    full_key = (key, *(id(obj) for obj in inputs))
    hit = cache.get(full_key)
    if hit is not None and all(a is b for a, b in zip(hit[0], inputs, strict=True)):
        return hit[1]
    value = compute()
    cache[full_key] = (inputs, value)
    return value


def _op_sends(ops: pd.DataFrame, backend: str, with_messages: bool = False) -> pd.DataFrame:
    """:func:`~commscope.collectives.traffic.op_sends` of ``ops`` (no extra keys), shared
    inside :func:`shared_results`: the cell's crosscheck and matrix_check model the same ops
    of the same window, its wire table and summary the same ops of the whole run."""
    return _shared(
        ("op_sends", backend, with_messages),
        (ops,),
        lambda: op_sends(ops, backend=backend, with_messages=with_messages),
    )
