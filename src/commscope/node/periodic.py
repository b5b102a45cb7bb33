"""What the node programs that sample at a low rate share (the socket statistics, the host
statistics): their command line, stopping at SIGTERM/SIGINT, and writing their one table so
that the orchestrator, which waits for its name, never reads half of it."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    the orchestrator waits for ``out`` to exist). pyarrow, not pandas: a node program imports
    its writer before it samples, and pandas' import (~0.9 s of CPU against pyarrow's ~0.3 s)
    on every tool of every node was most of a cell's start on two cores."""
    import pyarrow.parquet as pq

    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.rename(out)


def rows_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """``rows`` (tuples in ``schema``'s column order) as a table of ``schema``'s types."""
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.table(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
