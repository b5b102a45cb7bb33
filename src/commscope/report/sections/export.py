"""Exports for simulators (docs/export.md): per cell, what its ready-to-run ASTRA-sim input set
(``export/chakra/``) holds, and the one line that simulates it."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from commscope.export.astrasim import ASTRA_BINARY, RUN_SCRIPT, SUMMARY_FILE
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section
from commscope.units import fmt_count, fmt_ms

_EXPORT_INTRO = (
    "Every cell's export/chakra/ is a ready-to-run ASTRA-sim input set: Chakra execution "
    "traces of the training steps (written through Chakra's own schema), communicator "
    "groups, the network (one switch at the cell's cap, ASTRA-sim's GB = 2^30 B), system "
    "and memory configs. One line simulates a cell with ASTRA-sim's analytical backend: "
    f"ASTRA_SIM=/path/to/{ASTRA_BINARY} sh results/runs/<cell>/export/chakra/{RUN_SCRIPT} . "
    "Ops ASTRA-sim has no model of are timed compute, uneven all-to-alls run at the "
    "group's mean size; per cell below, with the measured time of the exported steps to "
    "compare the simulated time with (docs/export.md)."
)


def export_section(results: StudyResults) -> pd.DataFrame:
    """Per cell, what its ready-to-run input set holds (``export/chakra/``, read from its
    ``export_summary.json``): ranks, exported steps and their measured time, the ops ASTRA-sim
    runs as approximations (by reason) and the set-up ops left out. A directory without a
    summary (an export from before the input set existed) is skipped."""
    rows: list[dict[str, Any]] = []
    for cell, directory in results.cell_products("export_chakra").items():
        path = directory / SUMMARY_FILE
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        measured = summary.get("measured") or {}
        approximated = summary.get("approximated") or {}
        rows.append(
            {
                "cell": cell,
                "ranks": fmt_count(summary.get("world_size")),
                "steps": fmt_count(measured.get("steps")),
                "measured time": fmt_ms(measured.get("time_s")),
                "approximated": "; ".join(f"{k} (x{v})" for k, v in approximated.items()) or "none",
                "set-up ops left out": fmt_count(sum((summary.get("left_out") or {}).values())),
            }
        )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values("cell").reset_index(drop=True)
    return frame


# Shown when cells that ran made an export.
SECTION = Section(
    "Exports for simulators: ASTRA-sim",
    _EXPORT_INTRO,
    export_section,
    lambda results: bool(results.cell_products("export_chakra")),
    place="detail",
)
