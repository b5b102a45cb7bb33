"""Loading one cell's trace tables back: :class:`CellTraces` and :func:`load_cell`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.collectives.moe import alltoall_splits_from_routing
from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import (
    CELL_FILE,
    COUNTERS_FILE,
    OPS_FILE,
    ROUTING_FILE,
    SOCKETS_FILE,
    STEPS_FILE,
)


@dataclass
class CellTraces:
    """The trace tables of one sweep cell plus its ``cell.json`` metadata; ``sockets`` is
    ``sockets.parquet`` (empty for runs without socket statistics)."""

    ops: pd.DataFrame
    steps: pd.DataFrame
    counters: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    sockets: pd.DataFrame = field(default_factory=pd.DataFrame)
    # host.parquet: the host's CPU and each node's run-queue waits (empty before the monitor).
    host: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def warmup_steps(self) -> int:
        """Steps at the start of the run excluded from every summary (default 0)."""
        return int(self.meta.get("warmup_steps") or 0)

    @property
    def backend(self) -> str:
        """The c10d backend the cell ran on (cell.json ``backend``), which picks the traffic
        model of :func:`op_destinations`; :data:`DEFAULT_BACKEND` when not recorded."""
        return _backend_of(self.meta)

    @property
    def params(self) -> dict[str, Any]:
        """The cell's parameters, ``cell`` id first, as they lead every output table."""
        params = {"cell": self.meta.get("cell")}
        params.update(self.meta.get("params", {}))
        return params


def load_cell(cell_dir: Path) -> CellTraces:
    """Read ``cell.json``, ``ops.parquet``, ``steps.parquet``, ``counters.parquet`` and
    ``sockets.parquet`` of a cell's trace directory (:func:`load_cell_files` with the
    contract's file names, :mod:`commscope.contracts`)."""
    cell_dir = Path(cell_dir)
    return load_cell_files(
        cell=cell_dir / CELL_FILE,
        ops=cell_dir / OPS_FILE,
        steps=cell_dir / STEPS_FILE,
        counters=cell_dir / COUNTERS_FILE,
        routing=cell_dir / ROUTING_FILE,
        sockets=cell_dir / SOCKETS_FILE,
    )


def load_cell_files(
    cell: Path,
    ops: Path,
    steps: Path,
    counters: Path | None = None,
    routing: Path | None = None,
    sockets: Path | None = None,
    host: Path | None = None,
) -> CellTraces:
    """Read one cell's trace tables from the given files: ``cell`` (cell.json), ``ops``,
    ``steps``, ``counters``, ``routing`` (the MoE routing table, moe.parquet), ``sockets``
    and ``host`` (the fidelity monitor's samples).

    A missing (or not given) ``ops``, ``counters`` or ``sockets`` table (a run without
    communication, a node without a sampler, a run from before socket statistics) loads as an
    empty frame so the metrics degrade to NaN instead of failing; ``cell`` and ``steps`` are
    required. MoE all-to-alls recorded without ``split_bytes`` get them from ``routing`` where
    that is exact (:func:`~commscope.collectives.moe.alltoall_splits_from_routing`).
    """
    meta = json.loads(Path(cell).read_text())
    step_table = pd.read_parquet(steps)
    op_table = read_optional(ops)
    counter_table = read_optional(counters)
    op_table = alltoall_splits_from_routing(op_table, read_optional(routing))
    socket_table = read_optional(sockets)
    return CellTraces(
        ops=op_table,
        steps=step_table,
        counters=counter_table,
        meta=meta,
        sockets=socket_table,
        host=read_optional(host),
    )


def read_optional(path: Path | None) -> pd.DataFrame:
    """The table at ``path``; an empty frame when no path is given or the file is missing."""
    return pd.read_parquet(path) if path is not None and Path(path).exists() else pd.DataFrame()


def _backend_of(meta: dict[str, Any]) -> str:
    return str(meta.get("backend") or DEFAULT_BACKEND).lower()
