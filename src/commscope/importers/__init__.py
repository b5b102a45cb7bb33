"""Traces other tools recorded → commscope's ops table (the contract of docs/traces.md).

Four importers read what people already have and return the same tidy table the capture
writes (``ops_rank<R>.parquet``), so every metric and figure works on it:

* :func:`load_kineto`: PyTorch profiler (Kineto) Chrome-trace JSON, ``.json`` or ``.json.gz``
  (``source="kineto"``);
* :func:`load_execution_trace`: PyTorch execution trace (ET) JSON, schemas 1.0.1 to 1.1.x
  (``source="pytorch_et"``);
* :func:`load_chakra`: Chakra protobuf execution trace, ``.et``, optionally gzipped
  (``source="chakra"``);
* :func:`load_nccl_log`: ``NCCL_DEBUG=INFO`` log lines of the ``COLL`` (and ``INIT``)
  subsystem (``source="nccl_log"``).

:func:`load_trace` picks the importer from the file's content. The table's rules (columns,
dtypes, what a format leaves unknown) and the helpers the importers share are in
:mod:`commscope.importers._common`. Assign :data:`MAX_TRACE_BYTES` here to raise the size limit.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.contracts import KNOWN_OPS, OPS_COLUMNS, OPS_DTYPES, SPLIT_COLUMN
from commscope.importers._common import (
    MAX_TRACE_BYTES,
    TraceTooLarge,
    normalize_dtype,
    normalize_op,
    read_bytes,
    sniff_format,
)
from commscope.importers.chakra import load_chakra
from commscope.importers.execution_trace import load_execution_trace
from commscope.importers.kineto import load_kineto
from commscope.importers.nccl_log import load_nccl_log


def load_trace(path: str | Path) -> pd.DataFrame:
    """Load any supported trace file into the ops table, choosing the importer by content."""
    loaders = {"kineto": load_kineto, "pytorch_et": load_execution_trace, "nccl_log": load_nccl_log}
    return loaders.get(sniff_format(path), load_chakra)(Path(path))


__all__ = [
    "KNOWN_OPS",
    "OPS_COLUMNS",
    "OPS_DTYPES",
    "MAX_TRACE_BYTES",
    "SPLIT_COLUMN",
    "TraceTooLarge",
    "load_chakra",
    "load_execution_trace",
    "load_kineto",
    "load_nccl_log",
    "load_trace",
    "normalize_dtype",
    "normalize_op",
    "read_bytes",
    "sniff_format",
]
