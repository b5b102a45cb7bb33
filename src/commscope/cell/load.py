"""Loading one cell's trace tables back: :class:`CellTraces` and :func:`load_cell`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.collectives.moe import alltoall_splits_from_routing
from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import ROUTING_FILE, SOCKETS_FILE


@dataclass
class CellTraces:
    """The trace tables of one sweep cell plus its ``cell.json`` metadata; ``sockets`` is
    ``sockets.parquet`` (empty for runs without socket statistics)."""

    ops: pd.DataFrame
    steps: pd.DataFrame
    counters: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    sockets: pd.DataFrame = field(default_factory=pd.DataFrame)

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
    ``sockets.parquet``.

    A missing ``ops``, ``counters`` or ``sockets`` table (a run without communication, a node
    without a sampler, a run from before socket statistics) loads as an empty frame so the
    metrics degrade to NaN instead of failing; ``cell.json`` and ``steps.parquet`` are
    required. MoE all-to-alls recorded without
    ``split_bytes`` get them from ``moe.parquet`` where that is exact
    (:func:`alltoall_splits_from_routing`).
    """
    cell_dir = Path(cell_dir)
    meta = json.loads((cell_dir / "cell.json").read_text())
    steps = pd.read_parquet(cell_dir / "steps.parquet")
    ops = _read_optional(cell_dir / "ops.parquet")
    counters = _read_optional(cell_dir / "counters.parquet")
    ops = alltoall_splits_from_routing(ops, _read_optional(cell_dir / ROUTING_FILE))
    sockets = _read_optional(cell_dir / SOCKETS_FILE)
    return CellTraces(ops=ops, steps=steps, counters=counters, meta=meta, sockets=sockets)


def _read_optional(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _backend_of(meta: dict[str, Any]) -> str:
    return str(meta.get("backend") or DEFAULT_BACKEND).lower()
