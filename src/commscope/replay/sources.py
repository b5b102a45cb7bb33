"""A replay's source trace loaded into what :func:`commscope.replay.program.build_program`
takes: every rank's ops, the steps table when there is one, the world size, the warmup and a
description for the meta.

Three kinds (:data:`commscope.spec.replay.SOURCE_KINDS`):

* a measured cell: its parsed ``trace/ops.parquet``, ``trace/steps.parquet`` and
  ``trace/cell.json`` (world size, warmup steps); compute is what the ranks' threads did
  between ops (busy CPU);
* an import: ``results/imports/<name>/ops.parquet`` (an importer's table, the capture's
  columns; times where the format has them, steps where it marks them);
* a prediction: the scenario spec of the config's ``predictions:``, emulated rank by rank by
  :func:`commscope.predict.scenarios.predict_scenario` (its ``ops``: every rank's ops of one
  steady step, with groups, peers, roots, dtypes and sizes). The predictor gives each rank's
  FLOPs but no compute between ops, so a predicted replay has none: communication back to
  back, as the meta says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import CELL_FILE, OPS_FILE, STEPS_FILE, parse_ranks
from commscope.predict.scenarios import predict_scenario
from commscope.replay.program import Program, build_program
from commscope.spec.replay import ReplaySettings

__all__ = [
    "SourceTrace",
    "build_replay",
    "cell_source",
    "import_source",
    "load_source",
    "prediction_source",
]


@dataclass
class SourceTrace:
    """A loaded source: ``ops`` (every rank's rows, the ops table's columns), ``steps`` (the
    steps table, None without one), ``world`` (the trace's ranks; None when it does not say),
    ``warmup_steps`` (source steps not replayed), ``measured`` (its compute ran on this CPU:
    ``compute: auto`` is busy) and ``description`` (what replay.json says about it)."""

    ops: pd.DataFrame
    steps: pd.DataFrame | None
    world: int | None
    warmup_steps: int = 0
    measured: bool = False
    description: dict[str, Any] = field(default_factory=dict)


def cell_source(
    ops: Path | str, steps: Path | str | None = None, cell: Path | str | None = None, ref: str = ""
) -> SourceTrace:
    """A measured cell from its parsed trace files; ``ops`` may also be the cell's trace
    directory (or the cell's directory holding ``trace/``), the other two then found there.
    ``ref``: the cell's path below results/runs/ for the description."""
    ops = Path(ops)
    if ops.is_dir():
        trace = ops / "trace" if (ops / "trace" / OPS_FILE).exists() else ops
        ops, steps, cell = trace / OPS_FILE, trace / STEPS_FILE, trace / CELL_FILE
    meta = json.loads(Path(cell).read_text()) if cell is not None and Path(cell).exists() else {}
    table = pd.read_parquet(ops)
    steps_table = pd.read_parquet(steps) if steps is not None and Path(steps).exists() else None
    world = int(meta.get("world_size") or 0) or None
    return SourceTrace(
        ops=table,
        steps=steps_table,
        world=world or _world_of(table),
        warmup_steps=int(meta.get("warmup_steps") or 0),
        measured=True,
        description={
            "kind": "cell",
            "ref": ref or str(meta.get("cell", "")),
            "params": meta.get("params", {}),
            "backend": meta.get("backend", ""),
            "world_size": world,
            "warmup_steps": int(meta.get("warmup_steps") or 0),
            "files": [str(ops)],
        },
    )


def import_source(ops: Path | str, name: str = "") -> SourceTrace:
    """An imported trace from its ops table (results/imports/<name>/ops.parquet)."""
    table = pd.read_parquet(ops)
    sources = sorted(set(table["source"].astype(str))) if "source" in table.columns else []
    ranks = sorted({int(r) for r in table["rank"]}) if len(table) else []
    return SourceTrace(
        ops=table,
        steps=None,
        world=_world_of(table),
        measured=False,
        description={
            "kind": "import",
            "ref": name,
            "formats": sources,
            "ranks_in_trace": ranks,
            "files": [str(ops)],
        },
    )


def prediction_source(spec: Mapping[str, Any], name: str = "") -> SourceTrace:
    """A predicted scenario: every rank's ops of one steady step, from the predictor's
    per-rank emulation (:func:`predict_scenario`)."""
    pred = predict_scenario(dict(spec), name)
    ops = pred.ops
    sc = pred.scenario
    return SourceTrace(
        ops=ops,
        steps=None,
        world=sc.world_size,
        measured=False,
        description={
            "kind": "prediction",
            "ref": name,
            "scenario": {k: v for k, v in pred.meta.items() if k != "predict_seconds"},
            "nodes": sc.nodes,
            "gpus_per_node": sc.gpus_per_node,
            "compute": "none: the predictor gives FLOPs per rank, not the compute between ops",
        },
    )


def load_source(
    settings: ReplaySettings,
    *,
    ops: Path | str | None = None,
    steps: Path | str | None = None,
    cell: Path | str | None = None,
    scenario: Mapping[str, Any] | None = None,
) -> SourceTrace:
    """The source ``settings.source`` names, from the files the workflow gives (a cell:
    ``ops``, ``steps``, ``cell``, or ``ops`` as its directory; an import: ``ops``; a
    prediction: its ``scenario`` spec)."""
    kind, ref = settings.source.kind, settings.source.ref
    where = settings.field_name(f"source.{kind}")
    if kind == "prediction":
        if scenario is None:
            raise ValueError(f"{where}: {ref!r} needs its predictions: entry")
        return prediction_source(scenario, ref)
    if ops is None or not Path(ops).exists():
        raise ValueError(
            f"{where}: {ref!r} has no ops table at {ops}; "
            + ("run the cell first" if kind == "cell" else "import the trace first")
        )
    if kind == "cell":
        return cell_source(ops, steps, cell, ref)
    return import_source(ops, ref)


def build_replay(
    settings: ReplaySettings, source: SourceTrace, memory_per_node: int | None = None
) -> Program:
    """:func:`build_program` of a loaded source."""
    return build_program(
        source.ops,
        source.steps,
        settings,
        world=source.world,
        warmup_steps=source.warmup_steps,
        measured=source.measured,
        memory_per_node=memory_per_node,
        source=source.description,
    )


def _world_of(ops: pd.DataFrame) -> int | None:
    """The world a table's ops imply: its largest rank, group member, peer or root + 1, or its
    largest group size; None when no op names its group (the builder then takes the
    placement's)."""
    if ops.empty:
        return None
    members = [max(parse_ranks(g), default=-1) for g in ops.get("group_ranks", [])]
    sizes = pd.to_numeric(ops.get("group_size", pd.Series([], dtype="int64")), errors="coerce")
    if max(members, default=-1) < 0 and not (sizes > 0).any():
        return None
    candidates = [int(ops["rank"].max()) + 1, max(members, default=-1) + 1]
    for col, plus in (("group_size", 0), ("peer", 1), ("root", 1)):
        if col in ops.columns:
            candidates.append(int(pd.to_numeric(ops[col], errors="coerce").max()) + plus)
    return max(candidates)
