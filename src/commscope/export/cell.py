"""Every export of one measured cell, from its ``trace/`` directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import CELL_FILE, OPS_FILE, STEPS_FILE
from commscope.export.astra import write_astra_text
from commscope.export.astrasim import link_delay_ms, link_not_modeled, link_rate_bps
from commscope.export.chakra import write_chakra
from commscope.export.flows import write_flows_csv
from commscope.export.perfetto import write_chrome_trace

TRACE_JSON = "trace.json"
CHAKRA_DIR = "chakra"
CHAKRA_PREFIX = "chakra"
ASTRA_TXT = "astra_workload.txt"
FLOWS_CSV = "flows.csv"


def export_cell(
    trace_dir: Path,
    out_dir: Path,
    *,
    astra_rank: int = 0,
) -> list[Path]:
    """:func:`export_cell_files` for a cell's trace directory (``ops.parquet``,
    ``steps.parquet``, ``cell.json``), writing ``trace.json``, ``chakra/``,
    ``astra_workload.txt`` and ``flows.csv`` under ``out_dir``; returns their paths."""
    trace_dir, out_dir = Path(trace_dir), Path(out_dir)
    return export_cell_files(
        ops=trace_dir / OPS_FILE,
        steps=trace_dir / STEPS_FILE,
        cell=trace_dir / CELL_FILE,
        perfetto=out_dir / TRACE_JSON,
        chakra=out_dir / CHAKRA_DIR,
        astra=out_dir / ASTRA_TXT,
        flows=out_dir / FLOWS_CSV,
        astra_rank=astra_rank,
    )


def export_cell_files(
    ops: Path,
    steps: Path,
    cell: Path,
    perfetto: Path,
    chakra: Path,
    astra: Path,
    flows: Path,
    *,
    astra_rank: int = 0,
) -> list[Path]:
    """Write one cell's exports to the given files and return their paths:

    * ``perfetto``: Perfetto / Chrome trace (:mod:`commscope.export.perfetto`);
    * ``chakra``: a ready-to-run ASTRA-sim input set: Chakra execution traces
      ``chakra.<rank>.et`` of the training steps, ``comm_group.json``, ``network.yml`` (the
      cell's link), ``system.json``, ``memory.json``, ``run_astra.sh`` and
      ``export_summary.json`` (what was approximated or left out; :mod:`commscope.export.chakra`,
      :mod:`commscope.export.astrasim`);
    * ``astra``: ASTRA-sim text workload of rank ``astra_rank``'s median measured step
      (:mod:`commscope.export.astra`; left out when that rank ran no step);
    * ``flows``: flow list CSV (:mod:`commscope.export.flows`).

    ``ops``, ``steps`` and ``cell`` are the cell's trace files (cell.json may be missing:
    ``warmup_steps`` chooses the ASTRA-sim step, ``world_size`` goes into the metadata,
    ``backend`` picks the flows' algorithms and what a reduce-scatter is written as, ``bw_bps``
    and the ``delay`` parameter make the network config).
    """
    meta, op_table, step_table = _read_trace(ops, steps, cell)
    backend = meta.get("backend") or "nccl"
    for path in (perfetto, astra, flows):
        Path(path).parent.mkdir(parents=True, exist_ok=True)

    paths = [write_chrome_trace(Path(perfetto), op_table, step_table, meta=meta)]
    paths += write_chakra(
        Path(chakra),
        op_table,
        step_table,
        prefix=CHAKRA_PREFIX,
        world_size=meta.get("world_size"),
        backend=backend,
        link={
            "rate_bps": link_rate_bps(meta),
            "delay_ms": link_delay_ms(meta),
            "not_modeled": link_not_modeled(meta),
        },
    )
    paths += _write_astra(Path(astra), op_table, step_table, meta, astra_rank, backend)
    ranks_per_node = (meta.get("params") or {}).get("ranks_per_node")
    paths.append(
        write_flows_csv(
            Path(flows),
            op_table,
            int(ranks_per_node) if ranks_per_node is not None else None,
            backend=backend,
        )
    )
    return paths


def _read_trace(
    ops: Path, steps: Path, cell: Path
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """The cell's metadata (empty without cell.json), ops table and steps table."""
    meta: dict[str, Any] = {}
    if Path(cell).exists():
        meta = json.loads(Path(cell).read_text())
    op_table = pd.read_parquet(ops)
    step_table = pd.read_parquet(steps)
    return meta, op_table, step_table


def _write_astra(
    astra: Path,
    op_table: pd.DataFrame,
    step_table: pd.DataFrame,
    meta: dict[str, Any],
    astra_rank: int,
    backend: str,
) -> list[Path]:
    """``[astra]`` written with rank ``astra_rank``'s workload, or ``[]`` when that rank ran
    no step."""
    ran_step = step_table[(step_table["rank"] == astra_rank) & (step_table["step"] >= 0)]
    if ran_step.empty:
        return []
    return [
        write_astra_text(
            astra,
            op_table,
            step_table,
            rank=astra_rank,
            warmup_steps=int(meta.get("warmup_steps", 0) or 0),
            backend=backend,
        )
    ]
