"""Replay: any trace's communication re-issued on the cluster (docs/replay.md). The program
builder runs on the orchestrator (torch-free); :mod:`commscope.workload.replay` runs it on the
nodes.

:mod:`.sources` loads a source (a measured cell, an import, a predicted scenario),
:mod:`.program` builds the program (:data:`commscope.contracts.REPLAY_PROGRAM_COLUMNS`) and its
description, and :func:`write_program` writes both (program.parquet, replay.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from commscope.replay.program import SCALING_RULE, Program, build_program, program_bytes
from commscope.replay.sources import (
    SourceTrace,
    build_replay,
    cell_source,
    import_source,
    load_source,
    prediction_source,
)

__all__ = [
    "SCALING_RULE",
    "Program",
    "SourceTrace",
    "build_program",
    "build_replay",
    "cell_source",
    "import_source",
    "load_source",
    "prediction_source",
    "program_bytes",
    "write_program",
]


def write_program(program: Program, program_path: Path | str, meta_path: Path | str) -> None:
    """Write the program table (parquet) and its meta (JSON, keys sorted), creating their
    directories."""
    program_path, meta_path = Path(program_path), Path(meta_path)
    for path in (program_path, meta_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    program.table.to_parquet(program_path, index=False)
    meta_path.write_text(json.dumps(program.meta, indent=1, sort_keys=True, default=str) + "\n")
