"""Parquet files of metric tables too large to hold whole, written in parts and read back as
``frame.to_parquet(path, index=False)`` of the whole frame would be.

A long run's throughput table is a row per node and millisecond, and every row carries the
cell's parameters (the cell id alone is ~130 bytes of text). Held as a frame, those columns
are most of its memory; written by pyarrow they are most of the time spent (each text value is
hashed into the column's dictionary, and min/max statistics compare every value). Here a
column that is constant over a part is written from a one-entry dictionary, as parquet stores
text columns anyway, and the file's stored schema (``ARROW:schema`` and the ``pandas``
metadata, written as pyarrow writes them for the whole frame) still says what the frame's
dtypes were: readers get the same columns of the same dtypes. What differs is only how the
values are encoded (dictionaries, delta-encoded integers, no min/max of the constant text).
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# Rows per part (and row group) when a frame is written in parts.
PART_ROWS = 1 << 20
# Frames up to this many rows are written by pandas itself.
SMALL_ROWS = 1 << 16
_TEXT_TYPES = (pa.string(), pa.large_string())
# A column with at most this share of distinct values in its first part is dictionary-encoded;
# above it a dictionary only costs time (pyarrow builds one, then falls back to plain).
_DICTIONARY_SHARE = 1 / 16
_SAMPLE_ROWS = 1 << 16


class PartWriter:
    """A parquet file written in parts whose stacked frame would be read back as ``head``
    (a frame with the table's columns and dtypes, one row of it is enough) says.

    Each :meth:`write` gives every column as an array (numpy or pandas) or, for a column
    constant over the part, as a scalar. Use as a context manager: the stored schema is
    written when it closes.
    """

    def __init__(self, path: Path, head: pd.DataFrame) -> None:
        self.path = Path(path)
        self.schema = pa.Schema.from_pandas(head, preserve_index=False)
        self.written = self.schema
        self.writer: pq.ParquetWriter | None = None
        # Constant columns of the last parts, by (value, type, rows): parts of a table repeat
        # them (the parameters in every part, a node's number in all of its parts).
        self.constants: dict[tuple[Any, pa.DataType, int], pa.Array] = {}

    def __enter__(self) -> PartWriter:
        return self

    def write(self, rows: int, columns: Mapping[str, Any]) -> None:
        """Append ``rows`` rows: ``columns[name]`` an array of that length or a scalar."""
        arrays = [self._column(columns[f.name], f.type, rows) for f in self.schema]
        table = pa.Table.from_arrays(
            arrays,
            schema=pa.schema(
                [pa.field(f.name, a.type) for f, a in zip(self.schema, arrays, strict=True)]
            ),
        )
        if self.writer is None:
            self.written = table.schema
            self.writer = pq.ParquetWriter(self.path, self.written, **_options(table))
        self.writer.write_table(table.cast(self.written))
        # What arrow's allocator keeps of a part's buffers is not reused by numpy: hand it back.
        pa.default_memory_pool().release_unused()

    def _column(self, value: Any, type_: pa.DataType, rows: int) -> pa.Array:
        if isinstance(value, pd.Series | np.ndarray):
            return _arrow_column(value, type_, rows)
        key = (value, type_, rows)
        if key not in self.constants:
            if len(self.constants) > 64:
                self.constants.clear()
            self.constants[key] = _arrow_column(value, type_, rows)
        return self.constants[key]

    def __exit__(self, *exc: object) -> None:
        if self.writer is not None:
            _close(self.writer, _stored_schema(self.schema))


def _arrow_column(value: Any, type_: pa.DataType, rows: int) -> pa.Array:
    """One column of a part as an arrow array of ``type_``; a constant text column as a
    dictionary of one entry, so its ``rows`` values are one string and ``rows`` indices."""
    if isinstance(value, pd.Series):
        return pa.Array.from_pandas(value, type=type_)
    if isinstance(value, np.ndarray):
        return pa.array(value, type=type_)
    if type_ == pa.null():
        return pa.nulls(rows)
    if type_ in _TEXT_TYPES:
        indices = pa.array(np.zeros(rows, dtype=np.int8))
        return pa.DictionaryArray.from_arrays(indices, pa.array([value], type=type_))
    return pa.array(np.full(rows, value), type=type_)


def _options(table: pa.Table) -> dict[str, Any]:
    """Writer options for parts like ``table`` (its first): dictionaries for dictionary
    columns and for columns with few distinct values, delta encoding for the other integer
    columns, plain for the other floats; no min/max statistics for dictionary text (comparing
    every value is what they would cost)."""
    dictionary, encoding, statistics = [], {}, []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_dictionary(field.type):
            dictionary.append(field.name)
            continue
        statistics.append(field.name)
        if pa.types.is_boolean(field.type) or pa.types.is_null(field.type):
            continue
        # Judged on a sample: counting the distinct values of 10**6 rows takes ~20 ms a column.
        sample = column.slice(0, _SAMPLE_ROWS)
        distinct = pc.count_distinct(sample, mode="all").as_py()
        if distinct <= max(1, len(sample) * _DICTIONARY_SHARE):
            dictionary.append(field.name)
        elif pa.types.is_integer(field.type):
            encoding[field.name] = "DELTA_BINARY_PACKED"
        elif field.type in _TEXT_TYPES:
            dictionary.append(field.name)
    return {
        "compression": "snappy",
        "store_schema": False,
        "use_dictionary": dictionary,
        "column_encoding": encoding or None,
        "write_statistics": statistics,
    }


def _stored_schema(schema: pa.Schema) -> dict[bytes, bytes]:
    """The key-value metadata ``pq.write_table`` stores for a table of ``schema`` (a pandas
    frame's: with its ``pandas`` metadata)."""
    return {
        b"ARROW:schema": base64.b64encode(schema.serialize().to_pybytes()),
        **(schema.metadata or {}),
    }


def _close(writer: pq.ParquetWriter, footer: Mapping[bytes, bytes]) -> None:
    writer.add_key_value_metadata(dict(footer))
    writer.close()


def write_frame(frame: pd.DataFrame, path: Path, plain: Collection[str] = ()) -> None:
    """``frame.to_parquet(path, index=False)``, where the categorical columns named in
    ``plain`` are written as their categories' dtype (as if they had been read that way).

    A large frame whose ``plain`` columns each hold one value is written in parts with those
    columns as one-entry dictionaries (:class:`PartWriter`): a million rows of the cell
    parameters, read as categoricals to save memory, never become a million strings.
    """
    cats = [c for c in plain if c in frame and isinstance(frame[c].dtype, pd.CategoricalDtype)]
    if not cats:
        frame.to_parquet(path, index=False)
        return
    dtypes = {c: frame[c].cat.categories.dtype for c in cats}
    constant = all(len(frame[c].cat.categories) == 1 and frame[c].notna().all() for c in cats)
    if len(frame) <= SMALL_ROWS or not constant:
        frame.astype(dtypes).to_parquet(path, index=False)
        return
    values = {c: frame[c].cat.categories[0] for c in cats}
    with PartWriter(path, frame.head(1).astype(dtypes)) as writer:
        for start in range(0, len(frame), PART_ROWS):
            part = frame.iloc[start : start + PART_ROWS]
            writer.write(len(part), {c: values.get(c, part[c]) for c in frame.columns})


def concat_files(paths: Sequence[Path], out: Path) -> None:
    """The tables at ``paths`` stacked into ``out``: what ``pd.concat`` of the non-empty ones
    (the first, empty, when all are; an empty frame without any) written with
    ``to_parquet(index=False)`` gives.

    When every non-empty one has the same stored schema (the same columns, types and pandas
    metadata: the files of one table of one study), their row groups are copied over one at a
    time, text columns kept dictionary-encoded as they are stored: what is read back is the
    same, and memory stays at one row group where the whole concatenation of a long run's
    throughput would be gigabytes of repeated cell ids.
    """
    files = [pq.ParquetFile(p) for p in paths]
    non_empty = [p for p, f in zip(paths, files, strict=True) if f.metadata.num_rows > 0]
    footer = _shared_footer([f for f in files if f.metadata.num_rows > 0])
    if footer is None:
        frames = [pd.read_parquet(p) for p in paths]
        kept = [f for f in frames if not f.empty]
        table = pd.concat(kept, ignore_index=True) if kept else (frames or [pd.DataFrame()])[0]
        table.to_parquet(out, index=False)
        return
    text = [f.name for f in pq.ParquetFile(non_empty[0]).schema_arrow if f.type in _TEXT_TYPES]
    sources = [pq.ParquetFile(path, read_dictionary=text) for path in non_empty]
    groups = [(f, g) for f in sources for g in range(f.metadata.num_row_groups)]
    writer: pq.ParquetWriter | None = None
    written = None
    # The next row group is decoded by a second thread while this one is encoded (both
    # outside the GIL): a long run's throughput is ~100 row groups of each.
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            coming = pool.submit(_read_group, *groups[0])
            for i in range(len(groups)):
                table = coming.result()
                if i + 1 < len(groups):
                    coming = pool.submit(_read_group, *groups[i + 1])
                if writer is None:
                    written = table.schema.remove_metadata()
                    writer = pq.ParquetWriter(out, written, **_options(table))
                writer.write_table(table.cast(written))
                del table
        finally:
            if writer is not None:
                _close(writer, footer)


def _read_group(source: pq.ParquetFile, group: int) -> pa.Table:
    return source.read_row_group(group)


def _shared_footer(files: Sequence[pq.ParquetFile]) -> dict[bytes, bytes] | None:
    """The stored schema (``ARROW:schema`` and ``pandas`` metadata) every one of ``files``
    has, when they agree and it has no dictionary (categorical) column; None otherwise."""
    if not files:
        return None
    keys = {b"ARROW:schema", b"pandas"}
    footers = [dict(f.metadata.metadata or {}) for f in files]
    if any(set(footer) != keys for footer in footers) or any(
        footer != footers[0] for footer in footers[1:]
    ):
        return None
    if any(pa.types.is_dictionary(field.type) for field in files[0].schema_arrow):
        return None
    return footers[0]
