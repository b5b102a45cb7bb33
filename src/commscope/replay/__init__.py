"""Replay: any trace's communication re-issued on the cluster (docs/replay.md). The program
builder runs on the orchestrator (torch-free); :mod:`commscope.workload.replay` runs it on the
nodes.

:mod:`.sources` loads a source (a measured cell, an import, a predicted scenario),
:mod:`.program` builds the program (:data:`commscope.contracts.REPLAY_PROGRAM_COLUMNS`) and its
description and writes both (:func:`write_program`: program.parquet, replay.json), from the
source's ops as :mod:`.normalize` reads them, :mod:`.matching`'s checks across ranks and the
step templates of :mod:`.templates`.
"""

from __future__ import annotations

from commscope.replay.program import (
    SCALING_RULE,
    Program,
    build_program,
    program_bytes,
    write_program,
)
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
