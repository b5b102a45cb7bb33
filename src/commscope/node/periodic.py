"""What the node programs that sample at a low rate share (the socket statistics, the host
statistics): their command line, stopping at SIGTERM/SIGINT, and writing their one table so
that the orchestrator, which waits for its name, never reads half of it."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


def sampler_parser(description: str, hz: float) -> argparse.ArgumentParser:
    """The options every periodic node program takes: ``--hz`` (default ``hz``), ``--out``,
    ``--max-seconds`` and ``--tag`` (the orchestrator's run tag: it only marks the command
    line so the run can be found and killed)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hz", type=float, default=hz)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--tag", default="")
    return parser


def stop_on_signals() -> list[bool]:
    """A flag (``flag[0]``) that SIGTERM or SIGINT sets: the sampling loop checks it and ends."""
    stop = [False]

    def on_signal(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def write_table(table: pa.Table, out: Path) -> None:
    """``table`` to ``out`` as parquet, through a temporary name renamed at the end (atomic:
    the orchestrator waits for ``out`` to exist)."""
    import pyarrow.parquet as pq

    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.rename(out)


# The node programs build their tables from buffers, never with pa.array()/pa.table(): those
# check every input for a pandas object and so import pandas (0.9 s of CPU), which every tool of
# every node then paid, at the start of a cell or at its stop, six at once on two cores (3.7 s
# of a cell's probe start with pandas imported up front; 1.7 s more at the stop with pyarrow's
# own lazy import). numpy and pyarrow alone import in ~0.3 s.
_INTEGER_TYPES = ("int64", "uint64")


def arrow_array(values: Sequence[Any] | np.ndarray, kind: pa.DataType) -> pa.Array:
    """``values`` (one-dimensional) as an Arrow array of ``kind``, built from its buffers (see
    above): string (no nulls), or int64 / uint64 (None is null; a value the type cannot hold
    exactly raises, as pa.array would)."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    if pa.types.is_string(kind):
        if any(not isinstance(v, str) for v in values):
            raise TypeError(f"a string column takes str values only, not {values!r:.80}")
        data = [v.encode() for v in values]
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=n)
        if lengths.sum() >= 2**31:  # int32 offsets: Arrow's large_string beyond that
            raise ValueError("a string column over 2 GiB: use pa.large_string()")
        offsets = np.zeros(n + 1, dtype=np.int32)
        offsets[1:] = np.cumsum(lengths)  # below 2**31, checked above
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
        return pa.Array.from_buffers(kind, n, buffers)
    if str(kind) not in _INTEGER_TYPES:
        raise TypeError(f"a node table column is string, int64 or uint64, not {kind}")
    dtype = np.dtype(str(kind))
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"a column is one-dimensional, not of shape {values.shape}")
        # "safe": an int64 array never becomes uint64 (or the reverse) by wrapping around.
        return pa.Array.from_buffers(
            kind, n, [None, pa.py_buffer(values.astype(dtype, casting="safe"))]
        )
    if any(not (v is None or isinstance(v, Integral)) or isinstance(v, bool) for v in values):
        raise TypeError(f"an integer column takes int or None only, not {values!r:.80}")
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    # An int out of the type's range raises OverflowError here.
    filled = np.fromiter((0 if v is None else v for v in values), dtype=dtype, count=n)
    nulls = n - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(filled)], null_count=nulls)


def columns_table(columns: Sequence[Any], schema: pa.Schema) -> pa.Table:
    """``columns`` (in ``schema``'s order: Arrow arrays, sequences or numpy arrays) as a table of
    ``schema``'s types, built without pandas (:func:`arrow_array`)."""
    import pyarrow as pa

    arrays = [
        col if isinstance(col, pa.Array) else arrow_array(col, f.type)
        for col, f in zip(columns, schema, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def rows_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """``rows`` (tuples in ``schema``'s column order) as a table of ``schema``'s types."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return columns_table(columns, schema)
