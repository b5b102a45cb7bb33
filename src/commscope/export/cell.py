"""Every export of one measured cell, from its ``trace/`` directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.export.astra import write_astra_text
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
    astra_compatible: bool = False,
) -> list[Path]:
    """Write one cell's exports under ``out_dir`` and return their paths:

    * ``trace.json``: Perfetto / Chrome trace (:mod:`commscope.export.perfetto`);
    * ``chakra/chakra.<rank>.et`` and ``chakra/comm_group.json``: Chakra execution traces
      (:mod:`commscope.export.chakra`; ASTRA-sim: ``--workload-configuration=<out>/chakra/chakra``,
      ``astra_compatible`` replays the collectives it cannot simulate);
    * ``astra_workload.txt``: ASTRA-sim text workload of rank ``astra_rank``'s median measured
      step (:mod:`commscope.export.astra`; left out when that rank ran no step);
    * ``flows.csv``: flow list (:mod:`commscope.export.flows`).

    ``trace_dir`` holds the cell's ``ops.parquet``, ``steps.parquet`` and ``cell.json``
    (``warmup_steps`` chooses the ASTRA-sim step, ``world_size`` goes into the metadata).
    """
    trace_dir, out_dir = Path(trace_dir), Path(out_dir)
    meta: dict[str, Any] = {}
    if (trace_dir / "cell.json").exists():
        meta = json.loads((trace_dir / "cell.json").read_text())
    ops = pd.read_parquet(trace_dir / "ops.parquet")
    steps = pd.read_parquet(trace_dir / "steps.parquet")
    out_dir.mkdir(parents=True, exist_ok=True)

    paths = [write_chrome_trace(out_dir / TRACE_JSON, ops, steps, meta=meta)]
    paths += write_chakra(
        out_dir / CHAKRA_DIR,
        ops,
        steps,
        prefix=CHAKRA_PREFIX,
        world_size=meta.get("world_size"),
        astra_compatible=astra_compatible,
    )
    has_step = not steps[(steps["rank"] == astra_rank) & (steps["step"] >= 0)].empty
    if has_step:
        paths.append(
            write_astra_text(
                out_dir / ASTRA_TXT,
                ops,
                steps,
                rank=astra_rank,
                warmup_steps=int(meta.get("warmup_steps", 0) or 0),
            )
        )
    ranks_per_node = (meta.get("params") or {}).get("ranks_per_node")
    paths.append(
        write_flows_csv(
            out_dir / FLOWS_CSV,
            ops,
            int(ranks_per_node) if ranks_per_node is not None else None,
            backend=meta.get("backend") or "nccl",
        )
    )
    return paths
